package main

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// A plan fails exactly the planned share of its orders, rounded, whatever
// the run's seed: a small run with a failure rate always has a failure to
// compensate (six orders at 0.5 left none one run in 64 when each order
// drew its own chance).
func TestPlanFailsThePlannedShare(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		orders   int
		rate     float64
		failures int
	}{{6, 0.5, 3}, {20, 0.3, 6}, {4, 0, 0}, {1, 1, 1}, {3, 0.1, 0}, {7, 0.25, 2}} {
		for run := range 50 {
			p := newPlan(fmt.Sprintf("run-%d", run), c.orders, c.rate)
			require.Equal(t, c.failures, c.orders-p.completedExpected, "%d orders at %v, run %d", c.orders, c.rate, run)
		}
	}
}
