package saga_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/saga"
)

func TestRetryPolicyDefaults(t *testing.T) {
	t.Parallel()
	require.Equal(t, saga.RetryPolicy{
		InitialInterval:    saga.DefaultInitialInterval,
		BackoffCoefficient: saga.DefaultBackoffCoefficient,
		MaximumInterval:    saga.DefaultMaximumIntervalFactor * saga.DefaultInitialInterval,
		MaxAttempts:        saga.DefaultMaxAttempts,
	}, saga.RetryPolicy{}.WithDefaults())
	p := saga.RetryPolicy{InitialInterval: 3 * time.Second, MaxAttempts: 5}.WithDefaults()
	require.Equal(t, 300*time.Second, p.MaximumInterval)
	require.Equal(t, 5, p.MaxAttempts)
	require.Equal(t, 2.0, p.BackoffCoefficient)
}

func TestRetryPolicyBackoff(t *testing.T) {
	t.Parallel()
	p := saga.RetryPolicy{InitialInterval: time.Second, BackoffCoefficient: 3, MaximumInterval: 30 * time.Second}
	for attempt, want := range map[int]time.Duration{
		-1: time.Second, 0: time.Second, 1: time.Second, 2: 3 * time.Second, 3: 9 * time.Second,
		4: 27 * time.Second, 5: 30 * time.Second, 1000: 30 * time.Second,
	} {
		require.Equal(t, want, p.Backoff(attempt), "attempt %d", attempt)
	}
	require.Equal(t, 100*time.Second, saga.RetryPolicy{}.Backoff(1e6), "defaults, no overflow")
	require.Equal(t, 1500*time.Millisecond, saga.RetryPolicy{InitialInterval: time.Second, BackoffCoefficient: 1.5}.Backoff(2))
	flat := saga.RetryPolicy{InitialInterval: time.Second, BackoffCoefficient: 1}
	require.Equal(t, time.Second, flat.Backoff(50))
}
