package orchestrator_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/telemetry"
	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/internal/testkit/telemetrytest"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
)

// events returns the history events of saga id, in order.
func events(t *testing.T, c *orchestrator.Client, id uuid.UUID) []saga.HistoryEvent {
	t.Helper()
	h, err := c.History(context.Background(), id)
	require.NoError(t, err)
	out := make([]saga.HistoryEvent, len(h))
	for i, e := range h {
		out[i] = e.Event
	}
	return out
}

// TestGuaranteeAdmissionLimitQueuesStartsAndAdmitsThemInOrder: with a limit
// of two running sagas, further starts are accepted in the caller's
// transaction as queued sagas that have sent nothing; each time a running
// saga ends, the earliest queued one is admitted, and its steps' time starts
// then. An operator abort withdraws a queued saga (nothing to compensate);
// a retry of one is refused.
func TestGuaranteeAdmissionLimitQueuesStartsAndAdmitsThemInOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	def := holdSaga()
	e.blackhole(Hold.Name())
	testkit.Run(t, e.inventory(false).Run)
	meter := telemetrytest.NewMeter(t)
	cfg := e.orchConfig(def)
	cfg.Admission.PerDefinition = map[string]int{"hold": 2}
	cfg.MeterProvider = meter.Provider
	c := e.runOrchestrator(cfg)
	ctx := context.Background()

	var ids []uuid.UUID
	for i := range 5 {
		st := e.start(c, def, Order{ID: fmt.Sprintf("h%d", i), Qty: 1}, nil)
		want := saga.StatusRunning
		if i >= 2 {
			want = saga.StatusQueued
		}
		require.Equal(t, want, st.Status, "start %d", i)
		ids = append(ids, st.ID)
	}
	holding := func(n int) func() bool {
		return func() bool {
			return e.count(`SELECT count(*) FROM %[1]s.sagabox_saga WHERE saga_type = 'hold' AND current_step = 1 AND status = 'running'`) == n
		}
	}
	testkit.WaitFor(t, time.Minute, "the two running sagas to wait on the hold", holding(2))

	q, err := c.Get(ctx, ids[2])
	require.NoError(t, err)
	require.Equal(t, saga.StatusQueued, q.Status)
	require.True(t, q.AdmittedAt.IsZero())
	require.Len(t, q.Steps, 2)
	require.Equal(t, saga.StepPending, q.Steps[0].Status)
	require.Equal(t, []saga.HistoryEvent{orchestrator.HistoryQueued}, events(t, c, ids[2]))
	require.Zero(t, e.count(`SELECT count(*) FROM %[1]s.sagabox_outbox WHERE saga_id = ANY($1)`, ids[2:]), "a queued saga sends nothing")
	require.Equal(t, 3, e.count(`SELECT queued::int FROM %[1]s.sagabox_saga_queued_v WHERE saga_type = 'hold'`))
	snap := meter.Collect(t)
	n, ok := snap.Gauge(telemetry.MetricSagasQueued, telemetry.AttrSagaType.String("hold"))
	require.True(t, ok)
	require.EqualValues(t, 3, n)

	// A running saga ends: the first queued one, not a later one, runs.
	_, err = c.Abort(ctx, ids[0], "test", "make room")
	require.NoError(t, err)
	waitStatus(t, c, ids[0], saga.StatusCompensated, time.Minute)
	s := waitStatus(t, c, ids[2], saga.StatusRunning, time.Minute)
	require.False(t, s.AdmittedAt.Before(s.CreatedAt))
	require.False(t, s.AdmittedAt.IsZero())
	// It may have moved on since (its reserve answered): its history starts
	// with the wait and the admission.
	h := events(t, c, ids[2])
	require.GreaterOrEqual(t, len(h), 4)
	require.Equal(t, []saga.HistoryEvent{orchestrator.HistoryQueued, orchestrator.HistoryAdmitted, saga.HistoryStarted, saga.HistoryCommandSent}, h[:4])
	for _, id := range ids[3:] {
		s, err := c.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, saga.StatusQueued, s.Status, "later starts keep waiting")
	}
	require.LessOrEqual(t, e.count(`SELECT count(*) FROM %[1]s.sagabox_saga WHERE status IN ('running', 'compensating')`), 2)

	// Operator actions on a queued saga: a retry is refused, an abort
	// withdraws it at once.
	_, err = c.Retry(ctx, ids[4], "test", "nothing to retry")
	require.ErrorIs(t, err, saga.ErrInvalidTransition)
	w, err := c.Abort(ctx, ids[4], "test", "not needed any more")
	require.NoError(t, err)
	require.Equal(t, saga.StatusCompensated, w.Status)
	require.Equal(t, []saga.HistoryEvent{orchestrator.HistoryQueued, saga.HistoryCancelled}, events(t, c, ids[4]))
	require.Zero(t, e.count(`SELECT count(*) FROM %[1]s.sagabox_outbox WHERE saga_id = $1`, ids[4]))

	_, err = c.Abort(ctx, ids[1], "test", "make room")
	require.NoError(t, err)
	waitStatus(t, c, ids[3], saga.StatusRunning, time.Minute)
	testkit.WaitFor(t, time.Minute, "the admitted sagas to wait on the hold", holding(2))
	require.Positive(t, meter.Collect(t).Count(telemetry.MetricAdmissionWait, telemetry.AttrSagaType.String("hold")))
	require.Zero(t, e.errs.n.Load(), "errors logged: last %v", e.errs.last.Load())
}

// TestGuaranteeConcurrencyKeyRunsOneSagaPerKey: sagas started with the same
// concurrency key run one at a time, in start order, even when started by
// concurrent transactions; other keys and sagas without a key do not wait.
func TestGuaranteeConcurrencyKeyRunsOneSagaPerKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	def := holdSaga()
	e.blackhole(Hold.Name())
	testkit.Run(t, e.inventory(false).Run)
	cfg := e.orchConfig(def)
	cfg.Admission.MaxRunning = -1
	c := e.runOrchestrator(cfg)
	ctx := context.Background()
	key := func(k string) *orchestrator.StartOpts { return &orchestrator.StartOpts{ConcurrencyKey: k} }

	a := e.start(c, def, Order{ID: "a", Qty: 1}, key("account-1"))
	b := e.start(c, def, Order{ID: "b", Qty: 1}, key("account-1"))
	other := e.start(c, def, Order{ID: "c", Qty: 1}, key("account-2"))
	none := e.start(c, def, Order{ID: "d", Qty: 1}, nil)
	require.Equal(t, []saga.Status{saga.StatusRunning, saga.StatusQueued, saga.StatusRunning, saga.StatusRunning},
		[]saga.Status{a.Status, b.Status, other.Status, none.Status})

	// Concurrent starts of one key: each transaction stays open a while
	// after its Start, so that they overlap; one saga runs.
	var wg sync.WaitGroup
	statuses := make([]saga.Status, 8)
	for i := range statuses {
		wg.Go(func() {
			tx, err := e.pool.Begin(ctx)
			if !assertNoError(t, err) {
				return
			}
			defer tx.Rollback(ctx)
			st, err := orchestrator.Start(ctx, c, tx, def, Order{ID: fmt.Sprintf("k%d", i), Qty: 1}, key("account-3"))
			if !assertNoError(t, err) {
				return
			}
			time.Sleep(20 * time.Millisecond)
			if assertNoError(t, tx.Commit(ctx)) {
				statuses[i] = st.Status
			}
		})
	}
	wg.Wait()
	running := 0
	for _, s := range statuses {
		if s == saga.StatusRunning {
			running++
		}
	}
	require.Equal(t, 1, running, "one of the concurrent starts runs: %v", statuses)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM %[1]s.sagabox_saga WHERE concurrency_key = 'account-3' AND status = 'running'`))

	// The key's holder ends: the next saga of the key runs, in start order.
	_, err := c.Abort(ctx, a.ID, "test", "done with it")
	require.NoError(t, err)
	waitStatus(t, c, b.ID, saga.StatusRunning, time.Minute)
	n, err := c.Admit(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "nothing else may run")
	require.Equal(t, 1, e.count(`SELECT count(*) FROM %[1]s.sagabox_saga WHERE concurrency_key = 'account-1' AND status IN ('running', 'compensating')`))
	require.Zero(t, e.errs.n.Load(), "errors logged: last %v", e.errs.last.Load())
}

// assertNoError reports whether err is nil, failing t (from any goroutine)
// otherwise.
func assertNoError(t *testing.T, err error) bool {
	t.Helper()
	if err != nil {
		t.Errorf("unexpected error: %v", err)
		return false
	}
	return true
}

// TestEventForAQueuedSagaIsKeptUntilItGetsThere: an outside event sent to a
// saga still waiting for admission is kept, and consumed once the admitted
// saga reaches the step that waits for it.
func TestEventForAQueuedSagaIsKeptUntilItGetsThere(t *testing.T) {
	t.Parallel()
	e := newEventEnv(t)
	def := paidOrderSaga(time.Hour)
	testkit.Run(t, e.inventory(true).Run)
	cfg := e.orchConfig(def)
	cfg.Admission.PerDefinition = map[string]int{"paid-order": 1}
	c := e.runOrchestrator(cfg)
	ctx := context.Background()

	first := e.start(c, def, Order{ID: "p-1", Qty: 1, Address: "here"}, &orchestrator.StartOpts{StartKey: "p-1"})
	second := e.start(c, def, Order{ID: "p-2", Qty: 1, Address: "here"}, &orchestrator.StartOpts{StartKey: "p-2"})
	require.Equal(t, saga.StatusQueued, second.Status)
	sent := e.send(c, orchestrator.SagaRef{ID: second.ID}, "evt-2", "ref-2", false)
	require.Equal(t, orchestrator.EventKept, sent.Outcome, "kept for the queued saga")

	testkit.WaitFor(t, time.Minute, "the first saga to wait for its payment", func() bool {
		s, err := c.Get(ctx, first.ID)
		require.NoError(t, err)
		return s.CurrentStep == 1
	})
	e.send(c, orchestrator.SagaRef{ID: first.ID}, "evt-1", "ref-1", false)
	waitStatus(t, c, first.ID, saga.StatusCompleted, time.Minute)
	s := waitStatus(t, c, second.ID, saga.StatusCompleted, time.Minute)
	data, err := def.DecodeData(s.Data)
	require.NoError(t, err)
	require.Equal(t, "ref-2", data.ChargeID, "the kept event was applied")
	require.Zero(t, e.errs.n.Load(), "errors logged: last %v", e.errs.last.Load())
}

// A start far below its definition's limit does not count the running
// sagas again when another start of the process has just counted them: of
// two starts in quick succession the second reads no admission statement.
// A start with a concurrency key always checks.
func TestStartFarBelowTheLimitSkipsTheCount(t *testing.T) {
	t.Parallel()
	var rts dbtest.RoundTrips
	pool := dbtest.PoolWith(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = &rts })
	e := newEnvOnPool(t, pool)
	def := orderSaga(1, time.Minute, 1)
	e.blackhole(Reserve.Name())
	c := e.runOrchestrator(e.orchConfig(def))

	counted := func(opts *orchestrator.StartOpts) []bool {
		rts.Start()
		for i := range 2 {
			e.start(c, def, Order{ID: fmt.Sprintf("%s-%d", t.Name(), i), Qty: 1, Amount: 10, Address: "here"}, opts)
		}
		rts.Stop()
		var out []bool
		for _, tx := range rts.Transactions() {
			if tx.Has("SagaStart") {
				out = append(out, tx.Has("SagaAdmission"))
			}
		}
		return out
	}
	skipped := false
	for range 10 { // the second start must follow within roomFreshness
		// The last count has gone stale: the first start counts.
		time.Sleep(orchestrator.RoomFreshnessForTest + 50*time.Millisecond)
		got := counted(nil)
		require.Len(t, got, 2)
		require.True(t, got[0], "a start counts once the last count is older than roomFreshness")
		if got[0] && !got[1] {
			skipped = true
			break
		}
	}
	require.True(t, skipped, "the second of two quick starts skips the count")
	keyed := counted(&orchestrator.StartOpts{ConcurrencyKey: "k"})
	require.Equal(t, []bool{true, true}, keyed[:2], "a concurrency key is always checked")
}
