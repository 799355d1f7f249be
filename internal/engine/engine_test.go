package engine

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/saga"
)

func TestRetryDelayHasJitterWithinBackoff(t *testing.T) {
	t.Parallel()
	p := saga.RetryPolicy{InitialInterval: 100, BackoffCoefficient: 2, MaximumInterval: 1000, MaxAttempts: 5}
	for failures, full := range map[int]int64{1: 100, 2: 200, 3: 400, 4: 800, 5: 1000, 30: 1000} {
		seen := map[int64]bool{}
		for range 50 {
			d := int64(retryDelay(p, failures))
			require.GreaterOrEqual(t, d, full/2, "failures %d", failures)
			require.LessOrEqual(t, d, full, "failures %d", failures)
			seen[d] = true
		}
		require.Greater(t, len(seen), 1, "failures %d: the delay is jittered", failures)
	}
}

func TestRetentionConfig(t *testing.T) {
	t.Parallel()
	d := RetentionConfig{}.WithDefaults()
	require.NoError(t, d.Validate("Retention"))
	require.Equal(t, DefaultInboxRetention, d.Inbox)
	bad := RetentionConfig{Inbox: 48, Barrier: 24, BatchSize: -1}.WithDefaults()
	err := bad.Validate("Retention")
	require.ErrorContains(t, err, "Retention.Barrier 24ns is shorter than Retention.Inbox 48ns")
	require.ErrorContains(t, err, "Retention.BatchSize -1 is less than 1")
}
