package orchestrator_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
)

// TestGuaranteeTerminalStatesDeadlineThatCannotBeAppliedIsRecorded: a saga
// whose timer the core refuses (here its stored steps no longer match the
// registered definition, as after a definition changed without a new
// version) gets the reason on the saga and in its history, and is no longer
// claimed; it never keeps the sweeper from the deadlines behind it.
func TestGuaranteeTerminalStatesDeadlineThatCannotBeAppliedIsRecorded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	def := orderSaga(1, 10*time.Second, 1)
	clock := newFakeClock()
	cfg := e.orchConfig(def)
	cfg.Clock = clock.Now
	cfg.SweepBatch = 1
	c := e.newOrchestrator(cfg)
	ctx := context.Background()

	broken := e.start(c, def, Order{ID: "broken", Qty: 1, Amount: 10, Address: "here"}, nil)
	_, err := e.pool.Exec(ctx, `UPDATE `+e.orch.Schema()+`.sagabox_saga SET steps = jsonb_set(steps, '{0,name}', '"renamed"') WHERE id = $1`, broken.ID)
	require.NoError(t, err)
	clock.Advance(time.Second)
	healthy := e.start(c, def, Order{ID: "healthy", Qty: 1, Amount: 10, Address: "here"}, nil)
	// No relay runs: the commands count as published, since a saga whose
	// command still waits in the outbox is not due.
	_, err = e.pool.Exec(ctx, `UPDATE `+e.orch.Schema()+`.sagabox_outbox SET published_at = now()`)
	require.NoError(t, err)
	clock.Advance(20 * time.Second)

	for range 3 {
		_, err := c.Sweep(ctx)
		require.NoError(t, err)
	}
	s, err := c.Get(ctx, healthy.ID)
	require.NoError(t, err)
	require.Equal(t, saga.StatusCompensating, s.Status, "the healthy saga's deadline fired")
	require.Equal(t, saga.StepCompensating, s.Steps[0].Status)

	s, err = c.Get(ctx, broken.ID)
	require.NoError(t, err)
	require.Equal(t, saga.StatusRunning, s.Status)
	require.True(t, s.Deadline.IsZero(), "no longer claimed")
	require.Contains(t, s.LastError, "renamed")
	h, err := c.History(ctx, broken.ID)
	require.NoError(t, err)
	last := h[len(h)-1]
	require.Equal(t, orchestrator.HistoryDeadlineFailed, last.Event)
	require.Contains(t, last.Detail, "renamed")
	n, err := c.Sweep(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
}
