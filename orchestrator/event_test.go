package orchestrator_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/participant"
	"github.com/sagabox/sagabox/saga"
)

type PaymentConfirmed struct {
	Ref string `json:"ref"`
}

var paymentConfirmed = saga.NewEventType[PaymentConfirmed]("payment.confirmed")

// paidOrderSaga reserves stock, waits for the payment provider's
// confirmation (up to wait), then ships.
func paidOrderSaga(wait time.Duration) *saga.Definition[Order] {
	return saga.MustNew("paid-order", 1,
		saga.Step("reserve",
			saga.Invoke(Reserve, func(o *Order) ReserveReq { return ReserveReq{OrderID: o.ID, Qty: o.Qty} },
				func(o *Order, r ReserveReply) { o.ReservationID = r.ReservationID }),
			saga.Compensate(Release, func(o *Order) OrderRef { return OrderRef{OrderID: o.ID} }),
			saga.WithTimeout[Order](time.Minute)),
		saga.WaitEvent("await-payment", paymentConfirmed, func(o *Order, p PaymentConfirmed) { o.ChargeID = p.Ref },
			saga.WithTimeout[Order](wait)),
		saga.Step("ship",
			saga.Invoke(Ship, func(o *Order) ShipReq { return ShipReq{OrderID: o.ID, Address: o.Address} }, nil),
			saga.WithTimeout[Order](time.Minute)),
	)
}

// send sends a payment confirmation for the saga to in its own transaction,
// with a business write (the webhook's), and commits it unless rollback.
func (e *env) send(c *orchestrator.Client, to orchestrator.SagaRef, eventID, ref string, rollback bool) *orchestrator.EventSent {
	e.t.Helper()
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	require.NoError(e.t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{e.orch.Schema()}.Sanitize()+`.webhooks (event_id) VALUES ($1)`, eventID)
	require.NoError(e.t, err)
	sent, err := orchestrator.SendEvent(ctx, c, tx, to, paymentConfirmed, eventID, PaymentConfirmed{Ref: ref})
	require.NoError(e.t, err)
	if !rollback {
		require.NoError(e.t, tx.Commit(ctx))
		c.Wake()
	}
	return sent
}

func newEventEnv(t *testing.T) *env {
	e := newEnv(t)
	_, err := e.pool.Exec(context.Background(), `CREATE TABLE `+pgx.Identifier{e.orch.Schema()}.Sanitize()+`.webhooks (event_id text PRIMARY KEY)`)
	require.NoError(t, err)
	return e
}

// TestGuaranteeOutsideEventInSendersTransaction: an outside event is
// applied in the sender's transaction (rolled back with it, committed with
// its business write), deduplicated by its id, and moves the saga on; an
// event for an ended saga is recorded and ignored.
func TestGuaranteeOutsideEventInSendersTransaction(t *testing.T) {
	t.Parallel()
	e := newEventEnv(t)
	def := paidOrderSaga(time.Hour)
	testkit.Run(t, e.inventory(true).Run)
	c := e.runOrchestrator(e.orchConfig(def))
	ctx := context.Background()

	st := e.start(c, def, Order{ID: "o-1", Qty: 1, Address: "here"}, &orchestrator.StartOpts{StartKey: "o-1"})
	testkit.WaitFor(t, 30*time.Second, "the saga to wait for the payment", func() bool {
		s, err := c.Get(ctx, st.ID)
		require.NoError(t, err)
		return s.Steps[1].Status == saga.StepWaitingEvent
	})

	// Rolled back with the sender's transaction: no trace of it.
	e.send(c, orchestrator.SagaRef{ID: st.ID}, "evt-1", "pay-1", true)
	require.Zero(t, e.count(`SELECT count(*) FROM %[1]s.sagabox_saga_event`))
	s, err := c.Get(ctx, st.ID)
	require.NoError(t, err)
	require.Equal(t, saga.StepWaitingEvent, s.Steps[1].Status)

	// Committed, addressed by start key: consumed, the saga ships.
	sent := e.send(c, orchestrator.SagaRef{Type: "paid-order", StartKey: "o-1"}, "evt-1", "pay-1", false)
	require.Equal(t, orchestrator.EventConsumed, sent.Outcome)
	require.Equal(t, st.ID, sent.SagaID)
	out, err := orchestrator.Await(ctx, c, def, st.ID, nil)
	require.NoError(t, err)
	require.Equal(t, saga.StatusCompleted, out.Status)
	require.Equal(t, "pay-1", out.Data.ChargeID, "the event's payload was applied to the data")
	require.Equal(t, 1, e.count(`SELECT count(*) FROM %[2]s.shipments WHERE order_id = 'o-1'`))
	require.Equal(t, 1, e.count(`SELECT count(*) FROM %[1]s.sagabox_saga_event WHERE status = 'consumed'`))
	requireEntry(t, c, st.ID, saga.HistoryEventReceived, "", "payment.confirmed (event id evt-1)")

	// The same event id again: nothing happens.
	ctx2, tx := ctx, mustBegin(t, e)
	dup, err := orchestrator.SendEvent(ctx2, c, tx, orchestrator.SagaRef{ID: st.ID}, paymentConfirmed, "evt-1", PaymentConfirmed{Ref: "other"})
	require.NoError(t, err)
	require.Equal(t, orchestrator.EventDuplicate, dup.Outcome)
	require.NoError(t, tx.Rollback(ctx))

	// Another event for the completed saga: recorded and ignored.
	late := e.send(c, orchestrator.SagaRef{ID: st.ID}, "evt-2", "pay-2", false)
	require.Equal(t, orchestrator.EventIgnored, late.Outcome)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM %[1]s.sagabox_saga_event WHERE event_id = 'evt-2' AND status = 'ignored'`))
	s, err = c.Get(ctx, st.ID)
	require.NoError(t, err)
	require.Equal(t, "pay-1", mustData(t, def, s).ChargeID)

	// An unknown saga.
	tx = mustBegin(t, e)
	defer tx.Rollback(ctx)
	_, err = orchestrator.SendEvent(ctx, c, tx, orchestrator.SagaRef{Type: "paid-order", StartKey: "nope"}, paymentConfirmed, "x", PaymentConfirmed{})
	require.ErrorIs(t, err, orchestrator.ErrNotFound)
}

// TestOutsideEventEarlyIsKept: an event sent before the saga reaches the
// step that waits for it is kept and consumed when it does; a wait that
// times out compensates the earlier steps.
func TestOutsideEventEarlyIsKept(t *testing.T) {
	t.Parallel()
	e := newEventEnv(t)
	def := paidOrderSaga(time.Second)
	c := e.runOrchestrator(e.orchConfig(def))
	ctx := context.Background()

	// No inventory yet: the saga waits on its reservation when the event
	// comes.
	early := e.start(c, def, Order{ID: "early", Qty: 1, Address: "here"}, nil)
	sent := e.send(c, orchestrator.SagaRef{ID: early.ID}, "evt-early", "pay-early", false)
	require.Equal(t, orchestrator.EventKept, sent.Outcome)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM %[1]s.sagabox_saga_event WHERE status = 'pending'`))
	// An event no step ahead waits for is recorded and ignored.
	tx := mustBegin(t, e)
	other, err := orchestrator.SendEvent(ctx, c, tx, orchestrator.SagaRef{ID: early.ID},
		saga.NewEventType[PaymentConfirmed]("payment.refused"), "evt-other", PaymentConfirmed{})
	require.NoError(t, err)
	require.Equal(t, orchestrator.EventIgnored, other.Outcome)
	require.NoError(t, tx.Commit(ctx))

	testkit.Run(t, e.inventory(true).Run)
	out, err := orchestrator.Await(ctx, c, def, early.ID, nil)
	require.NoError(t, err)
	require.Equal(t, saga.StatusCompleted, out.Status, out.LastError)
	require.Equal(t, "pay-early", out.Data.ChargeID)
	require.Zero(t, e.count(`SELECT count(*) FROM %[1]s.sagabox_saga_event WHERE status = 'pending'`))

	// No event within the wait's timeout: the reservation is released.
	late := e.start(c, def, Order{ID: "unpaid", Qty: 1, Address: "here"}, nil)
	out, err = orchestrator.Await(ctx, c, def, late.ID, nil)
	require.NoError(t, err)
	require.Equal(t, saga.StatusCompensated, out.Status)
	require.Contains(t, out.LastError, `event "payment.confirmed" did not arrive`)
	require.Equal(t, saga.StepTimedOut, out.Saga.Steps[1].Status)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM %[2]s.reservations WHERE order_id = 'unpaid' AND released`))
}

func mustBegin(t *testing.T, e *env) pgx.Tx {
	t.Helper()
	tx, err := e.pool.Begin(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

func mustData(t *testing.T, def *saga.Definition[Order], s *orchestrator.Saga) Order {
	t.Helper()
	d, err := def.DecodeData(s.Data)
	require.NoError(t, err)
	return d
}

// TestOutsideEventAsMessage: another service publishes the outside event
// (with the saga's id in its envelope) from its own transaction; it
// reaches the orchestrator's queue, passes its inbox and moves the saga on;
// a second one (another message id) is recorded and ignored.
func TestOutsideEventAsMessage(t *testing.T) {
	t.Parallel()
	e := newEventEnv(t)
	def := paidOrderSaga(time.Hour)
	testkit.Run(t, e.inventory(true).Run)
	pay := e.payment(true) // publishes the provider's confirmation
	testkit.Run(t, pay.Run)
	c := e.runOrchestrator(e.orchConfig(def))
	ctx := context.Background()

	st := e.start(c, def, Order{ID: "m-1", Qty: 1, Address: "here"}, nil)
	testkit.WaitFor(t, 30*time.Second, "the saga to wait for the payment", func() bool {
		s, err := c.Get(ctx, st.ID)
		require.NoError(t, err)
		return s.Steps[1].Status == saga.StepWaitingEvent
	})
	msg, err := participant.NewEvent(paymentConfirmed.Name(), PaymentConfirmed{Ref: "via-broker"})
	require.NoError(t, err)
	msg.SagaID = st.ID
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	require.NoError(t, pay.Publish(ctx, tx, msg, msg)) // two messages, two event ids
	require.NoError(t, tx.Commit(ctx))
	pay.Wake()

	out, err := orchestrator.Await(ctx, c, def, st.ID, nil)
	require.NoError(t, err)
	require.Equal(t, saga.StatusCompleted, out.Status, out.LastError)
	require.Equal(t, "via-broker", out.Data.ChargeID)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM %[1]s.sagabox_saga_event WHERE saga_id = $1 AND status = 'consumed'`, st.ID))
	testkit.WaitFor(t, 30*time.Second, "the second event to be recorded", func() bool {
		return e.count(`SELECT count(*) FROM %[1]s.sagabox_saga_event WHERE saga_id = $1 AND status = 'ignored'`, st.ID) == 1
	})
}
