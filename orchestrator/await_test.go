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

// TestAwaitReturnsTheOutcome: Await blocks until a saga ends and returns
// its status, typed data and last error. The orchestrator that ends the
// saga wakes it: with a poll interval of an hour, only that wake-up can end
// the wait within the test's bounds.
func TestAwaitReturnsTheOutcome(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	def := orderSaga(1, time.Minute, 1)
	testkit.Run(t, e.inventory(true).Run)
	testkit.Run(t, e.payment(true).Run)
	c := e.runOrchestrator(e.orchConfig(def))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	noPoll := &orchestrator.AwaitOpts{PollInterval: time.Hour}

	done := e.start(c, def, Order{ID: "ok", Qty: 1, Amount: 10, Address: "here"}, nil)
	out, err := orchestrator.Await(ctx, c, def, done.ID, noPoll)
	require.NoError(t, err)
	require.Equal(t, saga.StatusCompleted, out.Status)
	require.Equal(t, "c-ok", out.Data.ChargeID, "the typed data as the charge step left it")
	require.Equal(t, "r-ok", out.Data.ReservationID)
	require.Empty(t, out.LastError)
	require.Equal(t, done.ID, out.Saga.ID)

	declined := e.start(c, def, Order{ID: "no", Qty: 1, Amount: declinedAmount, Address: "here"}, nil)
	out, err = orchestrator.Await(ctx, c, def, declined.ID, noPoll)
	require.NoError(t, err)
	require.Equal(t, saga.StatusCompensated, out.Status)
	require.Contains(t, out.LastError, "card declined")

	// An ended saga returns at once; many waiters of one saga all return.
	results := make(chan saga.Status, 5)
	for range 5 {
		go func() {
			s, err := c.Wait(ctx, done.ID, noPoll)
			if err != nil {
				results <- ""
				return
			}
			results <- s.Status
		}()
	}
	for range 5 {
		require.Equal(t, saga.StatusCompleted, <-results)
	}

	// The wrong definition, an unknown saga.
	_, err = orchestrator.Await(ctx, c, saga.MustNew("other", 1, saga.Step("x",
		saga.Invoke(Ship, func(*Order) ShipReq { return ShipReq{} }, nil))), done.ID, nil)
	require.ErrorContains(t, err, "not other")
	_, err = c.Wait(ctx, uuid.Must(uuid.NewV7()), nil)
	require.ErrorIs(t, err, orchestrator.ErrNotFound)
}

// TestAwaitSeesSagasOtherProcessesEnd: a Client that does not run the saga
// (here one without a broker, as in another process) sees it end through
// its poll floor; a context that ends first returns the saga as it was.
func TestAwaitSeesSagasOtherProcessesEnd(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	def := orderSaga(1, time.Minute, 1)
	e.blackhole(Ship.Name()) // shipping never answers
	testkit.Run(t, e.inventory(false).Run)
	testkit.Run(t, e.payment(true).Run)
	c := e.runOrchestrator(e.orchConfig(def))
	cfg := e.orchConfig(def)
	cfg.Broker = nil
	reader := e.newOrchestrator(cfg)

	st := e.start(c, def, Order{ID: "stuck", Qty: 1, Amount: 10, Address: "here"}, nil)
	testkit.WaitFor(t, 30*time.Second, "the saga to reach ship", func() bool {
		s, err := c.Get(context.Background(), st.ID)
		require.NoError(t, err)
		return s.Steps[2].Status == saga.StepRunning
	})
	short, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	s, err := reader.Wait(short, st.ID, &orchestrator.AwaitOpts{PollInterval: 20 * time.Millisecond})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NotNil(t, s)
	require.Equal(t, saga.StatusRunning, s.Status, "the saga as last read")

	// The running orchestrator ends the saga (an abort compensates it);
	// the other client's wait sees it by polling.
	ctx, cancelWait := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancelWait()
	ended := make(chan *orchestrator.Outcome[Order], 1)
	go func() {
		out, err := orchestrator.Await(ctx, reader, def, st.ID, &orchestrator.AwaitOpts{PollInterval: 50 * time.Millisecond})
		if err != nil {
			t.Errorf("await: %v", err)
		}
		ended <- out
	}()
	_, err = c.Abort(context.Background(), st.ID, "alice", "shipping is down")
	require.NoError(t, err)
	out := <-ended
	require.NotNil(t, out)
	require.Equal(t, saga.StatusCompensated, out.Status)
	require.Contains(t, out.LastError, "shipping is down")
}

// TestGetByKeyAndListByKey: a saga is found by its start key from Go, and
// List filters by start key.
func TestGetByKeyAndListByKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	def := orderSaga(1, time.Minute, 1)
	c := e.newOrchestrator(e.orchConfig(def))
	ctx := context.Background()
	a := e.start(c, def, Order{ID: "a", Qty: 1, Amount: 10, Address: "here"}, &orchestrator.StartOpts{StartKey: "order-a"})
	e.start(c, def, Order{ID: "b", Qty: 1, Amount: 10, Address: "here"}, &orchestrator.StartOpts{StartKey: "order-b"})
	e.start(c, def, Order{ID: "c", Qty: 1, Amount: 10, Address: "here"}, nil)

	s, err := c.GetByKey(ctx, "order", "order-a")
	require.NoError(t, err)
	require.Equal(t, a.ID, s.ID)
	require.Equal(t, "order-a", s.StartKey)
	_, err = c.GetByKey(ctx, "order", "order-z")
	require.ErrorIs(t, err, orchestrator.ErrNotFound)
	_, err = c.GetByKey(ctx, "other", "order-a")
	require.ErrorIs(t, err, orchestrator.ErrNotFound, "a start key is per definition name")

	res, err := c.List(ctx, &orchestrator.ListOpts{StartKey: "order-a"})
	require.NoError(t, err)
	require.Len(t, res.Sagas, 1)
	require.Equal(t, a.ID, res.Sagas[0].ID)
	res, err = c.List(ctx, nil)
	require.NoError(t, err)
	require.Len(t, res.Sagas, 3)
}
