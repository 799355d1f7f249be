package engine

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { testkit.WrapTestMain(m) }

func TestDrainContextOutlivesParentUntilTimeout(t *testing.T) {
	t.Parallel()
	parent, cancel := context.WithCancel(context.Background())
	var timedOut atomic.Bool
	ctx, release := DrainContext(parent, 20*time.Millisecond, func() { timedOut.Store(true) })
	defer release()
	cancel()
	require.NoError(t, ctx.Err(), "work may go on after the parent is cancelled")
	<-ctx.Done()
	require.True(t, timedOut.Load(), "onTimeout runs before the work is cancelled")
}

func TestDrainContextReleaseEndsItWithoutTimeout(t *testing.T) {
	t.Parallel()
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	var timedOut atomic.Bool
	ctx, release := DrainContext(parent, time.Hour, func() { timedOut.Store(true) })
	cancel()
	release()
	release() // idempotent
	require.Error(t, ctx.Err())
	require.False(t, timedOut.Load())
}

func TestPause(t *testing.T) {
	t.Parallel()
	require.True(t, Pause(context.Background(), time.Millisecond))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.False(t, Pause(ctx, time.Hour), "a cancelled context ends the pause")
}
