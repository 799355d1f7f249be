package bench

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
)

// A replica that dies fails the run with what it wrote to stderr. (The
// replicas measurement itself runs in the cli package's tests, where the
// test binary stands in for the sagabox binary.)
func TestReplicaThatDiesFailsTheRun(t *testing.T) {
	t.Parallel()
	dbtest.Pool(t) // creates the test database if needed
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := RunSagas(ctx, SagaConfig{
		DatabaseURL: dbtest.URL(), AMQPURL: amqptest.URL(t),
		Sagas: 10, Concurrency: 2, PoolSize: 4, Workers: 2,
		Replicas: []int{1}, ReplicaCommand: []string{"sh", "-c", "echo replica cannot start >&2; exit 3"},
	})
	require.Error(t, err)
	require.Contains(t, err.Error(), "orchestrator replica 1")
	require.Contains(t, err.Error(), "replica cannot start")
}

func TestTailBufferKeepsTheEnd(t *testing.T) {
	t.Parallel()
	b := &tailBuffer{max: 8}
	_, _ = b.Write([]byte("0123"))
	require.Equal(t, "0123", b.String())
	_, _ = b.Write([]byte("456789ab"))
	require.Equal(t, "456789ab", b.String())
	_, _ = b.Write([]byte("cd"))
	require.Equal(t, "6789abcd", b.String())
}
