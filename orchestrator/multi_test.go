package orchestrator_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
)

// Hold is a command nobody answers (routed to the black hole).
var Hold = saga.NewCommand[OrderRef, saga.None]("warehouse.hold")

// holdSaga reserves stock, then waits for a hold that never answers.
func holdSaga() *saga.Definition[Order] {
	return saga.MustNew("hold", 1,
		saga.Step("reserve",
			saga.Invoke(Reserve, func(o *Order) ReserveReq { return ReserveReq{OrderID: o.ID, Qty: o.Qty} }, nil),
			saga.Compensate(Release, func(o *Order) OrderRef { return OrderRef{OrderID: o.ID} }),
			saga.WithTimeout[Order](time.Minute),
		),
		saga.Step("hold",
			saga.Invoke(Hold, func(o *Order) OrderRef { return OrderRef{OrderID: o.ID} }, nil),
			saga.WithTimeout[Order](10*time.Second),
		),
	)
}

// TestGuaranteeTwoOrchestratorsOneDatabase: two orchestrators share one
// schema and reply queue. Replies of one saga are applied one at a time
// (every saga's history is a valid sequence and its revision counts exactly
// its transitions: no update was lost) and a deadline fires once even when
// both sweep at the same moment.
func TestGuaranteeTwoOrchestratorsOneDatabase(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	def, hold := orderSaga(1, time.Minute, 1), holdSaga()
	e.blackhole(Hold.Name())
	testkit.Run(t, e.inventory(true).Run)
	testkit.Run(t, e.payment(true).Run)
	clock := newFakeClock()
	cfg := e.orchConfig(def, hold)
	cfg.Clock = clock.Now
	a := e.runOrchestrator(cfg)
	b := e.runOrchestrator(cfg)
	ctx := context.Background()

	// Replies: 60 order sagas, started through both.
	os_ := orders("m", 60, 3)
	ids := append(e.startAll(a, def, os_[:30]), e.startAll(b, def, os_[30:])...)
	e.waitSettled(len(os_), time.Minute)
	for i, id := range ids {
		s, err := a.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, expected(os_[i]), s.Status)
		e.checkBusiness(os_[i], s.Status)
		h, err := b.History(ctx, id)
		require.NoError(t, err)
		checkHistory(t, s, h)
	}

	// Deadlines: 20 hold sagas wait on the black hole; the clock jumps and
	// both orchestrators sweep at once (explicit passes besides their loops).
	late := make([]Order, 20)
	for i := range late {
		late[i] = Order{ID: fmt.Sprintf("late-%02d", i), Qty: 1}
	}
	lateIDs := e.startAll(a, hold, late)
	testkit.WaitFor(t, time.Minute, "hold commands sent", func() bool {
		return e.count(`SELECT count(*) FROM %[1]s.sagabox_saga WHERE saga_type = 'hold' AND current_step = 1`) == len(late)
	})
	clock.Advance(11 * time.Second)
	var wg sync.WaitGroup
	for _, c := range []interface {
		Sweep(context.Context) (int, error)
	}{a, b, a, b} {
		wg.Go(func() {
			_, err := c.Sweep(ctx)
			require.NoError(t, err)
		})
	}
	wg.Wait()
	e.waitSettled(len(os_)+len(late), time.Minute)
	for _, id := range lateIDs {
		s, err := a.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, saga.StatusCompensated, s.Status)
		require.Equal(t, saga.StepTimedOut, s.Steps[1].Status)
		h, err := a.History(ctx, id)
		require.NoError(t, err)
		checkHistory(t, s, h)
		require.Equal(t, 1, e.count(`SELECT count(*) FROM %[1]s.sagabox_saga_history WHERE saga_id = $1 AND event = 'timed-out'`, id))
	}
	require.Zero(t, e.errs.n.Load(), "errors logged: last %v", e.errs.last.Load())
}

// checkHistory checks that h is a valid history for the settled saga s:
// each command and timeout recorded once per attempt, each reply applied
// at most once per step and phase, started first and the terminal status
// last, and a revision that counts exactly the transitions (start, applied
// replies, fired timers).
func checkHistory(t *testing.T, s *orchestrator.Saga, h []saga.HistoryEntry) {
	t.Helper()
	seen := map[string]int{}
	transitions := 1 // the start
	for _, en := range h {
		switch en.Event {
		case saga.HistoryCommandSent, saga.HistoryCompensationSent, saga.HistoryTimedOut:
			seen[fmt.Sprintf("%s/%s/%d", en.Event, en.Step, en.Attempt)]++
		case saga.HistoryReplyApplied, saga.HistoryStepRejected, saga.HistoryStepCompensated, saga.HistoryCompleted, saga.HistoryCompensated:
			seen[fmt.Sprintf("%s/%s", en.Event, en.Step)]++
		}
		switch en.Event {
		case saga.HistoryReplyApplied, saga.HistoryStepRejected, saga.HistoryStepCompensated, saga.HistoryCompensationFailed, saga.HistoryTimedOut:
			transitions++
		}
	}
	for k, n := range seen {
		require.Equal(t, 1, n, "saga %s: %s recorded %d times", s.ID, k, n)
	}
	require.Equal(t, saga.HistoryStarted, h[0].Event, "saga %s starts with started", s.ID)
	require.Equal(t, saga.HistoryEvent(s.Status), h[len(h)-1].Event, "saga %s ends with its status", s.ID)
	require.Equal(t, int64(transitions), s.Revision, "saga %s: revision counts its transitions", s.ID)
}
