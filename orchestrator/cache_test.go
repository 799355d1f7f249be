package orchestrator_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/transport"
)

// TestReplyToASagaChangedElsewhereIsAppliedToTheStoredSaga: an
// orchestrator keeps a saga waiting on shipping in its saga cache; another
// Client (an operator's tool on the same schema) terminates it; the
// shipping reply then reaches the first orchestrator, whose copy is out of
// date. The reply's one-round-trip write fails its revision check, and the
// reply is applied to the saga as stored: it stays terminated. Applied to
// the kept copy, the reply would have completed it (a lost update).
func TestReplyToASagaChangedElsewhereIsAppliedToTheStoredSaga(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	def := orderSaga(1, time.Minute, 1)
	testkit.Run(t, e.inventory(false).Run) // shipping comes later
	testkit.Run(t, e.payment(true).Run)
	c := e.runOrchestrator(e.orchConfig(def))
	ctx := context.Background()
	// The shipping queue exists, so that the command is published (and
	// waits there) before the saga is terminated: a terminated saga's
	// unsent commands are withdrawn.
	dctx, cancel := context.WithTimeout(ctx, amqptest.Timeout)
	defer cancel()
	require.NoError(t, e.broker.Declare(dctx, transport.QueueSpec{Name: "shipping", Commands: []string{Ship.Name()}}))

	st := e.start(c, def, Order{ID: "stale", Qty: 1, Amount: 10, Address: "here"}, nil)
	testkit.WaitFor(t, 30*time.Second, "the saga to wait on shipping, its command published", func() bool {
		s, err := c.Get(ctx, st.ID)
		require.NoError(t, err)
		return s.CurrentStep == 2 &&
			e.count(`SELECT count(*) FROM %[1]s.sagabox_outbox WHERE saga_id = $1 AND type = $2 AND published_at IS NULL`, st.ID, Ship.Name()) == 0
	})
	kept, ok := c.KeptRevisionForTest(st.ID)
	require.True(t, ok, "the orchestrator keeps the saga it wrote")

	cfg := e.orchConfig(def)
	cfg.Broker = nil
	ops := e.newOrchestrator(cfg)
	s, err := ops.Terminate(ctx, st.ID, "bob", "elsewhere")
	require.NoError(t, err)
	require.Equal(t, saga.StatusTerminated, s.Status)
	require.Greater(t, s.Revision, kept, "the other Client wrote the saga")
	stale, ok := c.KeptRevisionForTest(st.ID)
	require.True(t, ok)
	require.Equal(t, kept, stale, "the orchestrator's copy is out of date")

	shipping, err := newShipping(e)
	require.NoError(t, err)
	testkit.Run(t, shipping.Run)
	testkit.WaitFor(t, 30*time.Second, "the shipping reply to be received", func() bool {
		return e.count(`SELECT count(*) FROM %[1]s.sagabox_inbox WHERE saga_id = $1 AND step = 'ship'`, st.ID) == 1
	})
	got, err := c.Get(ctx, st.ID)
	require.NoError(t, err)
	require.Equal(t, saga.StatusTerminated, got.Status, "the reply was applied to the stored saga")
	require.Equal(t, s.Revision, got.Revision, "and changed nothing")
	_, ok = c.KeptRevisionForTest(st.ID)
	require.False(t, ok, "a saga whose copy was out of date is no longer kept")
	e.checkBusiness(Order{ID: "stale"}, saga.StatusCompleted) // the participants did their part
}

// TestSagaCacheConfig: the cache's size defaults, and a negative size
// keeps none.
func TestSagaCacheConfig(t *testing.T) {
	t.Parallel()
	require.Equal(t, orchestrator.DefaultSagaCache, orchestrator.Config{}.WithDefaults().SagaCache)
	require.Equal(t, -1, orchestrator.Config{SagaCache: -1}.WithDefaults().SagaCache)
}

// TestEventKeptWhileAReplyIsAppliedIsNotLost: a webhook's transaction keeps
// an outside event for a saga (it holds the saga's row lock, and changes
// nothing of the saga row) while the reply that brings the saga to the step
// waiting for that event arrives at an orchestrator that keeps the saga.
// The reply waits for the sender's commit and then finds the event: the
// saga completes. Applied to the kept copy without the lock, the reply
// would have missed the uncommitted event, and the saga would wait for an
// event already there until its wait timed out.
func TestEventKeptWhileAReplyIsAppliedIsNotLost(t *testing.T) {
	t.Parallel()
	e := newEventEnv(t)
	def := paidOrderSaga(time.Hour)
	c := e.runOrchestrator(e.orchConfig(def))
	ctx := context.Background()

	// No inventory yet: the saga waits on its reservation.
	st := e.start(c, def, Order{ID: "racing", Qty: 1, Address: "here"}, nil)
	_, ok := c.KeptRevisionForTest(st.ID)
	require.True(t, ok, "the orchestrator keeps the saga it started")

	tx := mustBegin(t, e)
	sent, err := orchestrator.SendEvent(ctx, c, tx, orchestrator.SagaRef{ID: st.ID}, paymentConfirmed, "evt-racing", PaymentConfirmed{Ref: "pay-racing"})
	require.NoError(t, err)
	require.Equal(t, orchestrator.EventKept, sent.Outcome)

	testkit.Run(t, e.inventory(true).Run)
	testkit.WaitFor(t, 30*time.Second, "the reply to wait for the sender's lock on the saga", func() bool {
		var n int
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0`, e.orch.Schema()).Scan(&n))
		return n > 0
	})
	require.NoError(t, tx.Commit(ctx))

	wait, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := orchestrator.Await(wait, c, def, st.ID, nil)
	require.NoError(t, err)
	require.Equal(t, saga.StatusCompleted, out.Status, out.LastError)
	require.Equal(t, "pay-racing", out.Data.ChargeID)
}
