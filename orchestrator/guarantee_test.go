package orchestrator_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
)

// TestGuaranteeAtomicStart: a saga exists, and its first command is sent,
// iff the caller's transaction commits; a start key makes Start idempotent.
func TestGuaranteeAtomicStart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	def := orderSaga(1, time.Minute, 1)
	c := e.newOrchestrator(e.orchConfig(def))
	ctx := context.Background()

	// Rolled back: no saga, no history, nothing in the outbox.
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	lost, err := orchestrator.Start(ctx, c, tx, def, Order{ID: "lost", Qty: 1, Amount: 10, Address: "here"}, nil)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	_, err = c.Get(ctx, lost.ID)
	require.ErrorIs(t, err, orchestrator.ErrNotFound)
	require.Zero(t, e.count(`SELECT count(*) FROM %[1]s.sagabox_saga_history WHERE saga_id = $1`, lost.ID))
	require.Zero(t, e.count(`SELECT count(*) FROM %[1]s.sagabox_outbox WHERE saga_id = $1`, lost.ID))

	// Committed, twice with one start key: one saga, one first command.
	key := &orchestrator.StartOpts{StartKey: "order-kept"}
	kept := e.start(c, def, Order{ID: "kept", Qty: 1, Amount: 10, Address: "here"}, key)
	require.False(t, kept.Existing)
	require.Equal(t, saga.StatusRunning, kept.Status)
	require.Equal(t, 7, int(kept.ID.Version()), "saga ids are UUIDv7")
	again := e.start(c, def, Order{ID: "kept", Qty: 1, Amount: 10, Address: "here"}, key)
	require.True(t, again.Existing)
	require.Equal(t, kept.ID, again.ID)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM %[1]s.sagabox_saga`))
	require.Equal(t, 1, e.count(`SELECT count(*) FROM %[1]s.sagabox_outbox WHERE saga_id = $1`, kept.ID))
	require.Equal(t, 1, e.count(`SELECT count(*) FROM %[1]s.sagabox_saga_history WHERE saga_id = $1 AND event = 'started'`, kept.ID))

	// Run everything: only the committed saga reaches the participants.
	testkit.Run(t, e.inventory(true).Run)
	testkit.Run(t, e.payment(true).Run)
	e.runOrchestrator(e.orchConfig(def))
	s := waitStatus(t, c, kept.ID, saga.StatusCompleted, 30*time.Second)
	require.False(t, s.FinishedAt.IsZero())
	e.checkBusiness(Order{ID: "kept"}, saga.StatusCompleted)
	require.Zero(t, e.count(`SELECT count(*) FROM %[2]s.reservations WHERE order_id = 'lost'`))
	require.Zero(t, e.count(`SELECT count(*) FROM %[2]s.sagabox_inbox WHERE saga_id = $1`, lost.ID))
	require.Equal(t, 1, e.count(`SELECT count(*) FROM %[2]s.sagabox_inbox WHERE saga_id = $1 AND type = 'inventory.reserve'`, kept.ID))
	require.Zero(t, e.errs.n.Load(), "errors logged: last %v", e.errs.last.Load())
}

// orders returns n orders with random amounts and addresses (seeded), some
// of which the payment or shipping participant rejects.
func orders(prefix string, n int, seed uint64) []Order {
	r := rand.New(rand.NewPCG(seed, seed))
	out := make([]Order, n)
	for i := range out {
		o := Order{ID: fmt.Sprintf("%s-%03d", prefix, i), Qty: 1 + r.IntN(5), Amount: 1 + r.IntN(100), Address: "main street"}
		if r.IntN(10) == 0 {
			o.Address = nowhere
		}
		out[i] = o
	}
	return out
}

// startAll starts os concurrently (several callers, one transaction each).
func (e *env) startAll(c *orchestrator.Client, def *saga.Definition[Order], os []Order) []uuid.UUID {
	e.t.Helper()
	ids := make([]uuid.UUID, len(os))
	var wg sync.WaitGroup
	next := make(chan int)
	for range 4 {
		wg.Go(func() {
			for i := range next {
				ids[i] = e.start(c, def, os[i], nil).ID
			}
		})
	}
	for i := range os {
		next <- i
	}
	close(next)
	wg.Wait()
	return ids
}

// TestGuaranteeConcurrentSagasReachTerminalState: 200 sagas run at once
// against real participants, some rejected by payment or shipping; each
// reaches the terminal status its data calls for, and the participants'
// business state agrees (reservations and charges kept for completed
// sagas, released and refunded for compensated ones).
func TestGuaranteeConcurrentSagasReachTerminalState(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	def := orderSaga(1, time.Minute, 1)
	testkit.Run(t, e.inventory(true).Run)
	testkit.Run(t, e.payment(true).Run)
	c := e.runOrchestrator(e.orchConfig(def))

	os := orders("o", 200, 42)
	began := time.Now()
	ids := e.startAll(c, def, os)
	e.waitSettled(len(os), 2*time.Minute)
	t.Logf("%d sagas settled in %s", len(os), time.Since(began).Round(time.Millisecond))

	counts := map[saga.Status]int{}
	for i, id := range ids {
		s, err := c.Get(context.Background(), id)
		require.NoError(t, err)
		require.Equal(t, expected(os[i]), s.Status, "order %s: last error %q", os[i].ID, s.LastError)
		counts[s.Status]++
		e.checkBusiness(os[i], s.Status)
	}
	t.Logf("statuses: %v", counts)
	require.NotZero(t, counts[saga.StatusCompleted])
	require.NotZero(t, counts[saga.StatusCompensated])
	require.Zero(t, e.errs.n.Load(), "errors logged: last %v", e.errs.last.Load())
}

// TestGuaranteeDeadlineCompensatesTimedOutStep: a participant that never
// answers makes the step time out (driven by the clock); the command is
// re-sent per the step's retry policy, then the timed-out step's own
// compensation runs first (a no-op at the participant: the action never ran
// there), then the earlier steps'.
func TestGuaranteeDeadlineCompensatesTimedOutStep(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	def := orderSaga(1, 10*time.Second, 2)
	e.blackhole(Charge.Name())
	testkit.Run(t, e.inventory(true).Run)
	testkit.Run(t, e.payment(false).Run) // refunds only: charges go to the black hole
	clock := newFakeClock()
	cfg := e.orchConfig(def)
	cfg.Clock = clock.Now
	c := e.runOrchestrator(cfg)

	st := e.start(c, def, Order{ID: "late", Qty: 1, Amount: 10, Address: "here"}, nil)
	charging := func(attempt int) func() bool {
		return func() bool {
			s, err := c.Get(context.Background(), st.ID)
			require.NoError(t, err)
			return s.CurrentStep == 1 && s.Steps[1].Status == saga.StepRunning && s.Steps[1].Attempt == attempt
		}
	}
	testkit.WaitFor(t, 30*time.Second, "charge attempt 1 sent", charging(1))

	clock.Advance(9 * time.Second) // not yet due
	_, err := c.Get(context.Background(), st.ID)
	require.NoError(t, err)
	clock.Advance(2 * time.Second) // attempt 1 times out; retry after 1s backoff
	testkit.WaitFor(t, 30*time.Second, "charge waiting for its retry", func() bool {
		s, err := c.Get(context.Background(), st.ID)
		require.NoError(t, err)
		return s.Steps[1].Status == saga.StepWaitingRetry
	})
	clock.Advance(time.Second)
	testkit.WaitFor(t, 30*time.Second, "charge attempt 2 sent", charging(2))
	clock.Advance(11 * time.Second) // attempt 2 times out: compensate
	s := waitStatus(t, c, st.ID, saga.StatusCompensated, 30*time.Second)
	require.Equal(t, saga.StepCompensated, s.Steps[0].Status)
	require.Equal(t, saga.StepCompensated, s.Steps[1].Status)
	require.Equal(t, saga.StepPending, s.Steps[2].Status)
	e.checkBusiness(Order{ID: "late"}, saga.StatusCompensated)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM %[2]s.reservations WHERE order_id = 'late' AND released`))

	h, err := c.History(context.Background(), st.ID)
	require.NoError(t, err)
	var got []string
	for _, en := range h {
		got = append(got, fmt.Sprintf("%s %s %d", en.Event, en.Step, en.Attempt))
	}
	require.Equal(t, []string{
		"started  0",
		"command-sent reserve 1",
		"reply-applied reserve 0",
		"command-sent charge 1",
		"timed-out charge 1",
		"retry-scheduled charge 2",
		"command-sent charge 2",
		"timed-out charge 2",
		"compensation-sent charge 1",
		"step-compensated charge 0",
		"compensation-sent reserve 1",
		"step-compensated reserve 0",
		"compensated  0",
	}, normalize(got, h))
	require.Zero(t, e.errs.n.Load(), "errors logged: last %v", e.errs.last.Load())
}

// normalize blanks the attempt of reply entries, whose attempt is the
// reply's, so that the expected history above stays readable.
func normalize(got []string, h []saga.HistoryEntry) []string {
	out := make([]string, len(got))
	for i, en := range h {
		switch en.Event {
		case saga.HistoryReplyApplied, saga.HistoryStepCompensated, saga.HistoryStarted, saga.HistoryCompensated, saga.HistoryCompleted:
			out[i] = fmt.Sprintf("%s %s 0", en.Event, en.Step)
		default:
			out[i] = got[i]
		}
	}
	return out
}

// Note is written by the local step of noteSaga in the caller's transaction.
var noteSaga = saga.MustNew("note", 1,
	saga.LocalStep("note", func(ctx context.Context, o *Order) error {
		tx := orchestrator.TxFromContext(ctx)
		if tx == nil {
			return errors.New("no transaction in context")
		}
		var schema string
		if err := tx.QueryRow(ctx, `SELECT current_setting('test.schema')`).Scan(&schema); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+schema+`.reservations (order_id, qty) VALUES ($1, $2)`, o.ID, o.Qty)
		return err
	}),
)

// TestGuaranteeAtomicStartLocalStep: a leading local step runs in the
// caller's transaction: rolled back with it, kept with it, and not run
// again by a repeated start with the same key.
func TestGuaranteeAtomicStartLocalStep(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.newOrchestrator(e.orchConfig(noteSaga))
	ctx := context.Background()
	start := func(commit bool) *orchestrator.Started {
		tx, err := e.pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		_, err = tx.Exec(ctx, `SELECT set_config('test.schema', $1, true)`, pgx.Identifier{e.inv.Schema()}.Sanitize())
		require.NoError(t, err)
		st, err := orchestrator.Start(ctx, c, tx, noteSaga, Order{ID: "n", Qty: 1}, &orchestrator.StartOpts{StartKey: "n"})
		require.NoError(t, err)
		if commit {
			require.NoError(t, tx.Commit(ctx))
		}
		return st
	}
	start(false)
	require.Zero(t, e.count(`SELECT count(*) FROM %[2]s.reservations`))
	require.Zero(t, e.count(`SELECT count(*) FROM %[1]s.sagabox_saga`))
	first := start(true)
	require.Equal(t, saga.StatusCompleted, first.Status)
	again := start(true)
	require.True(t, again.Existing)
	require.Equal(t, first.ID, again.ID)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM %[2]s.reservations`))
	s, err := c.Get(ctx, first.ID)
	require.NoError(t, err)
	require.False(t, s.FinishedAt.IsZero())
}
