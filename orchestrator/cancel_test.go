package orchestrator_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
)

// TestCancelStepWaitingForRetry: cancelling a saga whose step timed out and
// waits for its retry compensates that step through the barrier (the
// payment participant never saw the charge: its refund is a no-op) and
// the completed reservation; the saga ends compensated with the reason,
// audited in its history.
func TestCancelStepWaitingForRetry(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	def := orderSaga(1, 10*time.Second, 3)
	clock := newFakeClock()
	e.blackhole(Charge.Name()) // the charge is never answered
	testkit.Run(t, e.inventory(true).Run)
	testkit.Run(t, e.payment(false).Run) // refunds only
	cfg := e.orchConfig(def)
	cfg.Clock = clock.Now
	c := e.runOrchestrator(cfg)
	ctx := context.Background()

	st := e.start(c, def, Order{ID: "cancel", Qty: 1, Amount: 10, Address: "here"}, nil)
	testkit.WaitFor(t, 30*time.Second, "the charge to be published", func() bool {
		s, err := c.Get(ctx, st.ID)
		require.NoError(t, err)
		return s.Steps[1].Status == saga.StepRunning &&
			e.count(`SELECT count(*) FROM %[1]s.sagabox_outbox WHERE saga_id = $1 AND type = 'payment.charge' AND published_at IS NULL`, st.ID) == 0
	})
	clock.Advance(time.Minute)
	testkit.WaitFor(t, 30*time.Second, "the charge to wait for its retry", func() bool {
		s, err := c.Get(ctx, st.ID)
		require.NoError(t, err)
		return s.Steps[1].Status == saga.StepWaitingRetry
	})

	s, err := c.Cancel(ctx, st.ID, "alice", "customer changed their mind")
	require.NoError(t, err)
	require.Equal(t, saga.StatusCompensating, s.Status)
	out, err := orchestrator.Await(ctx, c, def, st.ID, nil)
	require.NoError(t, err)
	require.Equal(t, saga.StatusCompensated, out.Status)
	require.Equal(t, "cancelled by alice: customer changed their mind", out.LastError)
	require.Equal(t, saga.StepCompensated, out.Saga.Steps[1].Status, "the charge in flight was compensated")
	require.Equal(t, saga.StepCompensated, out.Saga.Steps[0].Status)
	e.checkBusiness(Order{ID: "cancel"}, saga.StatusCompensated)
	requireEntry(t, c, st.ID, saga.HistoryCancelled, "alice", "customer changed their mind")
	require.False(t, out.Saga.FinishedAt.IsZero())
}

// TestTerminateWithdrawsUnsentCommands: terminating a saga deletes, in the
// same transaction, its commands that no relay has published: here a
// command to a queue that does not exist, which the relay would retry for
// ever. Another saga's unsent command stays.
func TestTerminateWithdrawsUnsentCommands(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	def := orderSaga(1, time.Minute, 1)
	// No queue takes the shipping command: it stays in the outbox,
	// published again and again.
	testkit.Run(t, e.inventory(false).Run)
	testkit.Run(t, e.payment(true).Run)
	c := e.runOrchestrator(e.orchConfig(def))
	ctx := context.Background()

	unsent := `SELECT count(*) FROM %[1]s.sagabox_outbox WHERE saga_id = $1 AND kind = 'command' AND published_at IS NULL`
	stuck := e.start(c, def, Order{ID: "w-1", Qty: 1, Amount: 10, Address: "nowhere"}, nil)
	other := e.start(c, def, Order{ID: "w-2", Qty: 1, Amount: 10, Address: "nowhere"}, nil)
	for _, id := range []uuid.UUID{stuck.ID, other.ID} {
		testkit.WaitFor(t, 30*time.Second, "the shipping command to be refused by the broker", func() bool {
			return e.count(`SELECT count(*) FROM %[1]s.sagabox_outbox WHERE saga_id = $1 AND type = $2 AND publish_attempts > 0 AND published_at IS NULL`, id, Ship.Name()) == 1
		})
	}

	s, err := c.Terminate(ctx, stuck.ID, "bob", "no shipping to there")
	require.NoError(t, err)
	require.Equal(t, saga.StatusTerminated, s.Status)
	require.Zero(t, e.count(unsent, stuck.ID), "the terminated saga's unsent command is withdrawn")
	require.Equal(t, 1, e.count(unsent, other.ID), "another saga's unsent command stays")
}

// TestTerminateStopsAtOnce: terminating a running saga ends it terminated
// in the same call, compensating nothing (the reservation and the charge
// stay); it is audited, ends Await, frees its start key for
// StartKeyReuseFinished, and a terminated saga cannot be cancelled,
// retried or terminated again. A failed saga can be terminated too.
func TestTerminateStopsAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	def := orderSaga(1, time.Minute, 1)
	e.blackhole(Ship.Name()) // shipping never answers
	testkit.Run(t, e.inventory(false).Run)
	testkit.Run(t, e.payment(true).Run)
	c := e.runOrchestrator(e.orchConfig(def))
	ctx := context.Background()

	key := &orchestrator.StartOpts{StartKey: "t-1", StartKeyPolicy: orchestrator.StartKeyReuseFinished}
	st := e.start(c, def, Order{ID: "t-1", Qty: 1, Amount: 10, Address: "here"}, key)
	testkit.WaitFor(t, 30*time.Second, "the saga to wait on shipping", func() bool {
		s, err := c.Get(ctx, st.ID)
		require.NoError(t, err)
		return s.CurrentStep == 2
	})
	waited := make(chan saga.Status, 1)
	go func() {
		s, err := c.Wait(ctx, st.ID, &orchestrator.AwaitOpts{PollInterval: time.Hour})
		if err != nil {
			t.Errorf("wait: %v", err)
			waited <- ""
			return
		}
		waited <- s.Status
	}()

	s, err := c.Terminate(ctx, st.ID, "bob", "fraud suspected")
	require.NoError(t, err)
	require.Equal(t, saga.StatusTerminated, s.Status)
	require.Equal(t, saga.StepTerminated, s.Steps[2].Status)
	require.Equal(t, "terminated by bob: fraud suspected", s.LastError)
	require.False(t, s.FinishedAt.IsZero())
	require.True(t, s.Deadline.IsZero())
	require.Equal(t, saga.StatusTerminated, <-waited, "the terminating process wakes its waiters")
	requireEntry(t, c, st.ID, saga.HistoryTerminated, "bob", "fraud suspected")
	require.Zero(t, e.count(`SELECT count(*) FROM %[1]s.sagabox_saga_history WHERE saga_id = $1 AND event = 'compensation-sent'`, st.ID), "nothing sent")
	require.Zero(t, e.count(`SELECT count(*) FROM %[1]s.sagabox_outbox WHERE saga_id = $1 AND kind = 'compensation'`, st.ID))
	require.Equal(t, 1, e.count(`SELECT count(*) FROM %[2]s.reservations WHERE order_id = 't-1' AND NOT released`), "nothing compensated")
	require.Equal(t, 1, e.count(`SELECT count(*) FROM %[3]s.charges WHERE order_id = 't-1' AND NOT refunded`))
	for _, op := range []func(context.Context, uuid.UUID, string, string) (*orchestrator.Saga, error){c.Cancel, c.Retry, c.Terminate} {
		_, err := op(ctx, st.ID, "bob", "again")
		require.ErrorIs(t, err, saga.ErrInvalidTransition)
	}
	// A terminated saga has finished: its key can name a new one.
	again := e.start(c, def, Order{ID: "t-1", Qty: 1, Amount: 10, Address: "here"}, key)
	require.False(t, again.Existing)
	_, err = c.Terminate(ctx, again.ID, "bob", "")
	require.NoError(t, err)

	// A failed saga (its release fails for good) can be terminated.
	e.failRelease.Store(true)
	failed := e.start(c, def, Order{ID: "f", Qty: 1, Amount: declinedAmount, Address: "here"}, nil)
	waitStatus(t, c, failed.ID, saga.StatusFailed, 30*time.Second)
	s, err = c.Terminate(ctx, failed.ID, "carol", "written off")
	require.NoError(t, err)
	require.Equal(t, saga.StatusTerminated, s.Status)
	require.Equal(t, saga.StepCompensationFailed, s.Steps[0].Status)
}
