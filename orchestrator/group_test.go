package orchestrator_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
)

// parallelOrderSaga reserves the stock, then charges and ships in parallel
// (the group "pay-and-ship").
func parallelOrderSaga(timeout time.Duration) *saga.Definition[Order] {
	ref := func(o *Order) OrderRef { return OrderRef{OrderID: o.ID} }
	return saga.MustNew("parallel-order", 1,
		saga.Step("reserve",
			saga.Invoke(Reserve, func(o *Order) ReserveReq { return ReserveReq{OrderID: o.ID, Qty: o.Qty} },
				func(o *Order, r ReserveReply) { o.ReservationID = r.ReservationID }),
			saga.Compensate(Release, ref),
			saga.WithTimeout[Order](timeout),
		),
		saga.Parallel("pay-and-ship",
			saga.Step("charge",
				saga.Invoke(Charge, func(o *Order) ChargeReq { return ChargeReq{OrderID: o.ID, Amount: o.Amount} },
					func(o *Order, r ChargeReply) { o.ChargeID = r.ChargeID }),
				saga.Compensate(Refund, ref),
				saga.WithTimeout[Order](timeout),
			),
			saga.Step("ship",
				saga.Invoke(Ship, func(o *Order) ShipReq { return ShipReq{OrderID: o.ID, Address: o.Address} }, nil),
				saga.WithTimeout[Order](timeout),
			),
		),
	)
}

// TestParallelGroupAgainstRealServers: the branches' commands are written
// by one transition and both participants act; the saga completes with the
// replies applied at the join. When a branch is rejected, the other branch
// (charged or still in flight) is refunded through its barrier and the
// reservation released: the business state balances. The views and the
// history show the branches.
func TestParallelGroupAgainstRealServers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	def := parallelOrderSaga(time.Minute)
	testkit.Run(t, e.inventory(true).Run)
	testkit.Run(t, e.payment(true).Run)
	c := e.runOrchestrator(e.orchConfig(def))
	ctx := context.Background()

	orders := []Order{
		{ID: "p-ok", Qty: 1, Amount: 10, Address: "here"},
		{ID: "p-no-address", Qty: 1, Amount: 10, Address: nowhere},
		{ID: "p-declined", Qty: 1, Amount: declinedAmount, Address: "here"},
	}
	for _, o := range orders {
		st := e.start(c, def, o, nil)
		out, err := orchestrator.Await(ctx, c, def, st.ID, nil)
		require.NoError(t, err)
		require.Equal(t, expected(o), out.Status, "order %s: %s", o.ID, out.LastError)
		if o.Amount == declinedAmount {
			// ship has no compensation: whether it ran alongside the
			// declined charge or not, it stays; the rest balances.
			require.Equal(t, 0, e.count(`SELECT count(*) FROM %[2]s.reservations WHERE order_id = $1 AND NOT released`, o.ID))
			require.Equal(t, 0, e.count(`SELECT count(*) FROM %[3]s.charges WHERE order_id = $1`, o.ID))
			require.Contains(t, []saga.StepStatus{saga.StepAborted, saga.StepSucceeded}, out.Saga.Steps[2].Status)
		} else {
			e.checkBusiness(o, out.Status)
		}

		h, err := c.History(ctx, st.ID)
		require.NoError(t, err)
		var sent []saga.HistoryEntry
		joined := false
		for _, en := range h {
			if en.Event == saga.HistoryCommandSent && en.StepIndex > 0 {
				sent = append(sent, en)
			}
			joined = joined || en.Event == saga.HistoryGroupJoined
		}
		require.Len(t, sent, 2, "order %s: one command per branch", o.ID)
		require.Equal(t, sent[0].At, sent[1].At, "order %s: the branches are sent by one transition", o.ID)
		require.Equal(t, out.Status == saga.StatusCompleted, joined, "order %s: the group joins only when both succeed", o.ID)
		require.Equal(t, 2, e.count(`SELECT count(*) FROM %[1]s.sagabox_saga_step_v WHERE saga_id = $1 AND step_group = 'pay-and-ship'`, st.ID))
		if o.ID == "p-ok" {
			require.Equal(t, "c-p-ok", out.Data.ChargeID, "the charge's reply was applied at the join")
		}
		if o.Address == nowhere {
			require.Equal(t, saga.StepCompensated, out.Saga.Steps[1].Status, "the charge branch, succeeded or in flight, was refunded")
		}
	}
}
