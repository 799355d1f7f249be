package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store"
)

func command(sagaID uuid.UUID) *message.Envelope {
	return &message.Envelope{
		MessageID: uuid.New(), Type: "inventory.reserve", Kind: message.KindCommand, SagaID: sagaID, Step: "reserve",
	}
}

func TestInboxRecordCountsDuplicates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.Store(t, store.LineMessaging)
	env := command(uuid.New())
	record := func() bool {
		var dup bool
		require.NoError(t, s.InTx(ctx, func(tx pgx.Tx) error {
			var err error
			dup, err = s.InboxRecord(ctx, tx, env)
			return err
		}))
		return dup
	}
	require.False(t, record(), "first arrival is new")
	require.True(t, record(), "second arrival is a duplicate")
	require.True(t, record())

	row, err := s.InboxGet(ctx, env.MessageID)
	require.NoError(t, err)
	require.Equal(t, 2, row.Duplicates)
	require.Equal(t, env.SagaID, row.SagaID)
	require.Equal(t, message.KindCommand, row.Kind)
	require.NotNil(t, row.LastDuplicateAt)

	stats, err := s.InboxStats(ctx, time.Hour)
	require.NoError(t, err)
	require.Equal(t, store.InboxStats{Total: 1, Duplicates: 2, DuplicatedMessages: 1, RecentlyDuplicated: 1}, stats)

	dups, err := s.InboxDuplicated(ctx, 10)
	require.NoError(t, err)
	require.Len(t, dups, 1)

	_, err = s.InboxGet(ctx, uuid.New())
	require.ErrorIs(t, err, message.ErrNotFound)
}

func TestInboxRecordRolledBackIsNotRecorded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.Store(t, store.LineMessaging)
	env := &message.Envelope{MessageID: uuid.New(), Type: "order.placed", Kind: message.KindEvent}
	tx, err := s.Pool().Begin(ctx)
	require.NoError(t, err)
	dup, err := s.InboxRecord(ctx, tx, env)
	require.NoError(t, err)
	require.False(t, dup)
	require.NoError(t, tx.Rollback(ctx))
	_, err = s.InboxGet(ctx, env.MessageID)
	require.ErrorIs(t, err, message.ErrNotFound, "an inbox row exists only if its transaction committed")
}

func TestInboxAttempts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.Store(t, store.LineMessaging)
	env := command(uuid.New())
	for want := 1; want <= 3; want++ {
		n, err := s.InboxAttemptRecord(ctx, env, "boom")
		require.NoError(t, err)
		require.Equal(t, want, n)
	}
	require.NoError(t, s.InboxAttemptMarkDeadLettered(ctx, nil, env, "gave up"))
	a, err := s.InboxAttemptGet(ctx, env.MessageID)
	require.NoError(t, err)
	require.Equal(t, 3, a.Attempts)
	require.Equal(t, "gave up", a.LastError)
	require.NotNil(t, a.DeadLetteredAt)
	require.Equal(t, env.SagaID, a.SagaID)

	other := command(uuid.New())
	_, err = s.InboxAttemptRecord(ctx, other, "x")
	require.NoError(t, err)
	all, err := s.InboxAttemptList(ctx, nil)
	require.NoError(t, err)
	require.Len(t, all, 2)
	dl, err := s.InboxAttemptList(ctx, &store.InboxAttemptListOpts{DeadLetteredOnly: true})
	require.NoError(t, err)
	require.Len(t, dl, 1)
	require.Equal(t, env.MessageID, dl[0].MessageID)

	_, err = s.InboxAttemptGet(ctx, uuid.New())
	require.ErrorIs(t, err, message.ErrNotFound)
}

func TestBarrierInsertOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.Store(t, store.LineMessaging)
	sagaID := uuid.New()
	mark := store.BarrierMark{
		SagaID: sagaID, Step: "reserve", Phase: store.BarrierAction, MessageID: uuid.New(),
		Outcome: store.BarrierApplied,
	}
	insert := func(m store.BarrierMark) bool {
		var ok bool
		require.NoError(t, s.InTx(ctx, func(tx pgx.Tx) error {
			var err error
			ok, err = s.BarrierInsert(ctx, tx, m)
			return err
		}))
		return ok
	}
	require.True(t, insert(mark))
	again := mark
	again.MessageID = uuid.New()
	require.False(t, insert(again), "one mark per saga, step and phase")

	mark.ReplyKind, mark.ReplyPayload = message.KindReplySuccess, []byte(`{"ok":true}`)
	require.NoError(t, s.InTx(ctx, func(tx pgx.Tx) error { return s.BarrierUpdate(ctx, tx, mark) }))
	got, err := s.BarrierGet(ctx, nil, sagaID, "reserve", store.BarrierAction)
	require.NoError(t, err)
	require.Equal(t, mark.MessageID, got.MessageID)
	require.Equal(t, message.KindReplySuccess, got.ReplyKind)
	require.JSONEq(t, `{"ok":true}`, string(got.ReplyPayload))

	comp := mark
	comp.Phase, comp.Outcome = store.BarrierCompensation, store.BarrierApplied
	require.True(t, insert(comp))
	list, err := s.BarrierList(ctx, sagaID)
	require.NoError(t, err)
	require.Len(t, list, 2)

	_, err = s.BarrierGet(ctx, nil, sagaID, "other", store.BarrierAction)
	require.ErrorIs(t, err, message.ErrNotFound)
}

func TestIsConnectionError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	// A statement error is not a connection error.
	_, err := pool.Exec(ctx, "SELECT 1/0")
	require.Error(t, err)
	require.False(t, store.IsConnectionError(err))
	// A refused connection is.
	conn, err := pgx.Connect(ctx, "postgres://postgres@127.0.0.1:1/none?connect_timeout=5")
	if conn != nil {
		_ = conn.Close(ctx)
	}
	require.Error(t, err)
	require.True(t, store.IsConnectionError(err))
	// A server-side termination (57P01) is.
	c, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer c.Release()
	var pid int
	require.NoError(t, c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	_, err = pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid)
	require.NoError(t, err)
	_, err = c.Exec(ctx, "SELECT 1")
	require.Error(t, err)
	require.True(t, store.IsConnectionError(err), "err: %v", err)
	// So is a statement on the connection pgx closed after that.
	_, err = c.Exec(ctx, "SELECT 1")
	require.Error(t, err)
	require.True(t, store.IsConnectionError(err), "err: %v", err)
	require.False(t, store.IsConnectionError(nil))
}

// pgx calls some failures of the caller "safe to retry" because nothing was
// sent; they are not lost connections, and a receiver that took them for one
// would retry the message for ever without counting its attempts.
func TestIsConnectionErrorNotCallerBugs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)

	// A statement on a context that was already done.
	done, cancel := context.WithCancel(ctx)
	cancel()
	_, err = tx.Exec(done, "SELECT 1")
	require.Error(t, err)
	require.False(t, store.IsConnectionError(err), "err: %v", err)

	// A statement while a result is still open (rows never closed).
	rows, err := tx.Query(ctx, "SELECT 1")
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "SELECT 2")
	require.Error(t, err)
	require.False(t, store.IsConnectionError(err), "err: %v", err)
	rows.Close()
}

func TestIsDataError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	_, err := pool.Exec(ctx, "SELECT $1::text", "a\x00b")
	require.True(t, store.IsDataError(err), "NUL in text: %v", err)
	_, err = pool.Exec(ctx, "SELECT 1/0")
	require.True(t, store.IsDataError(err), "division by zero: %v", err)
	_, err = pool.Exec(ctx, "SELECT * FROM no_such_table")
	require.False(t, store.IsDataError(err), "undefined table: %v", err)
	require.False(t, store.IsDataError(nil))
}

// A failure whose text Postgres cannot hold as it is (a NUL byte, invalid
// UTF-8: handler errors often quote their input) is still counted;
// otherwise its message could never reach MaxAttempts.
func TestInboxAttemptRecordsAnyErrorText(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.Store(t, store.LineMessaging)
	env := command(uuid.New())
	n, err := s.InboxAttemptRecord(ctx, env, "no such sku \x00 here")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	n, err = s.InboxAttemptRecord(ctx, env, "no such sku \xff here")
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.NoError(t, s.InboxAttemptMarkDeadLettered(ctx, nil, env, "gave up: \x00\xfe"))
	a, err := s.InboxAttemptGet(ctx, env.MessageID)
	require.NoError(t, err)
	require.Equal(t, 2, a.Attempts)
	require.Equal(t, "gave up: \\x00\uFFFD", a.LastError)
}

// The barrier under READ COMMITTED (DESIGN §4.6): an action and the
// compensation of the same step racing on two connections are serialised by
// the action mark's key. The compensation's insert of the "blocked" action
// mark waits for the action's transaction; when that commits, the insert
// does nothing and the next statement sees the action's outcome; when it
// rolls back, the insert wins and the late action will find it.
func TestGuaranteeCompensationRaceBarrierKeySerialises(t *testing.T) {
	t.Parallel()
	for _, actionCommits := range []bool{true, false} {
		t.Run(fmt.Sprintf("action commits %v", actionCommits), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := dbtest.Store(t, store.LineMessaging)
			sagaID := uuid.New()
			mark := func(phase store.BarrierPhase, outcome store.BarrierOutcome) store.BarrierMark {
				return store.BarrierMark{SagaID: sagaID, Step: "reserve", Phase: phase, MessageID: uuid.New(), Outcome: outcome}
			}

			action, err := s.Pool().Begin(ctx)
			require.NoError(t, err)
			defer action.Rollback(ctx)
			ok, err := s.BarrierInsert(ctx, action, mark(store.BarrierAction, store.BarrierApplied))
			require.NoError(t, err)
			require.True(t, ok)

			comp, err := s.Pool().Begin(ctx)
			require.NoError(t, err)
			defer comp.Rollback(ctx)
			var compPID int
			require.NoError(t, comp.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&compPID))
			ok, err = s.BarrierInsert(ctx, comp, mark(store.BarrierCompensation, store.BarrierApplied))
			require.NoError(t, err)
			require.True(t, ok)

			type insert struct {
				inserted bool
				seen     store.BarrierMark
				err      error
			}
			done := make(chan insert, 1)
			go func() {
				var r insert
				r.inserted, r.err = s.BarrierInsert(ctx, comp, mark(store.BarrierAction, store.BarrierBlocked))
				if r.err == nil {
					r.seen, r.err = s.BarrierGet(ctx, comp, sagaID, "reserve", store.BarrierAction)
				}
				done <- r
			}()
			require.Eventually(t, func() bool {
				var waiting bool
				err := s.Pool().QueryRow(ctx, "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", compPID).Scan(&waiting)
				return err == nil && waiting
			}, 10*time.Second, 10*time.Millisecond, "the compensation waits for the action's transaction")

			if actionCommits {
				require.NoError(t, action.Commit(ctx))
			} else {
				require.NoError(t, action.Rollback(ctx))
			}
			var r insert
			select {
			case r = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the compensation's insert did not return")
			}
			require.NoError(t, r.err)
			require.Equal(t, !actionCommits, r.inserted)
			want := store.BarrierBlocked
			if actionCommits {
				want = store.BarrierApplied
			}
			require.Equal(t, want, r.seen.Outcome, "the compensation sees the winner's mark")
			require.NoError(t, comp.Commit(ctx))
		})
	}
}
