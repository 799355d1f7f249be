package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/store/driver"
)

func command(sagaID uuid.UUID, kind message.Kind) *message.Envelope {
	return &message.Envelope{
		MessageID: uuid.New(), Type: "inventory.reserve", Kind: kind, SagaID: sagaID, Step: "reserve", ReplyTo: "orders",
	}
}

func reply(env *message.Envelope, kind message.Kind, payload string) *message.Message {
	return &message.Message{
		Envelope: message.Envelope{Type: env.Type, Kind: kind, RoutingKey: env.ReplyTo, SagaID: env.SagaID, Step: env.Step,
			CorrelationID: env.MessageID.String()},
		Payload: []byte(payload),
	}
}

// deliver runs one delivery of env to its end: applied with reply payload
// when the handler runs.
func deliver(t *testing.T, s *dbtest.DB, env *message.Envelope, handler func(tx pgx.Tx) error) *driver.Delivery {
	t.Helper()
	ctx := context.Background()
	tx := s.Begin(nil)
	defer tx.Rollback(ctx)
	d, err := s.DeliveryBegin(ctx, tx, env, []byte(`{"reason":"blocked"}`))
	require.NoError(t, err)
	end := driver.DeliveryEnd{}
	switch {
	case d.Duplicate:
	case env.Kind == message.KindEvent:
		if handler != nil {
			require.NoError(t, handler(d.Tx))
		}
	case !d.Marked:
		end.Reply = reply(env, d.Prior.ReplyKind, string(d.Prior.ReplyPayload))
	default:
		if handler != nil && (env.Kind != message.KindCompensation || d.Action == driver.BarrierApplied) {
			require.NoError(t, handler(d.Tx))
		}
		if env.Kind == message.KindCommand {
			end.Mark = &driver.BarrierMark{Outcome: driver.BarrierApplied, ReplyKind: message.KindReplySuccess, ReplyPayload: []byte(`{"ok":1}`)}
		}
		end.Reply = reply(env, message.KindReplySuccess, `{"ok":1}`)
	}
	require.NoError(t, s.DeliveryFinish(ctx, tx, env, d, end))
	dbtest.Commit(t, tx)
	return d
}

func (s *counter) n(t *testing.T, db *dbtest.DB, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), fmt.Sprintf(sql, db.Schema()), args...).Scan(&n))
	return n
}

type counter struct{}

var count counter

// A delivery records its message in the inbox and writes its reply in one
// transaction; a duplicate counts itself and changes nothing else.
func TestDeliveryInboxCountsDuplicates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.Store(t, store.LineMessaging)
	for _, kind := range []message.Kind{message.KindCommand, message.KindEvent} {
		env := command(uuid.New(), kind)
		if kind == message.KindEvent {
			env.SagaID, env.Step, env.ReplyTo = uuid.Nil, "", ""
		}
		writes := 0
		h := func(tx pgx.Tx) error { writes++; return nil }
		require.False(t, deliver(t, s, env, h).Duplicate, "first arrival is new")
		require.True(t, deliver(t, s, env, h).Duplicate, "second arrival is a duplicate")
		require.True(t, deliver(t, s, env, h).Duplicate)
		require.Equal(t, 1, writes, "the handler ran once")
		require.Equal(t, 2, count.n(t, s, `SELECT duplicates FROM %q.sagabox_inbox WHERE message_id = $1`, env.MessageID))
	}
	require.Equal(t, 1, count.n(t, s, `SELECT count(*) FROM %q.sagabox_outbox`), "one reply: the event got none")
	stats, err := s.Store.InboxStats(ctx, time.Hour)
	require.NoError(t, err)
	require.Equal(t, store.InboxStats{Total: 2, Duplicates: 4, DuplicatedMessages: 2, RecentlyDuplicated: 2}, stats)
}

// A delivery rolled back leaves nothing: no inbox row, no mark, no reply.
func TestDeliveryRolledBackLeavesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.Store(t, store.LineMessaging)
	env := command(uuid.New(), message.KindCommand)
	tx := s.Begin(nil)
	d, err := s.DeliveryBegin(ctx, tx, env, nil)
	require.NoError(t, err)
	require.True(t, d.Marked)
	tx.Rollback(ctx)
	require.Zero(t, count.n(t, s, `SELECT count(*) FROM %q.sagabox_inbox`))
	require.Zero(t, count.n(t, s, `SELECT count(*) FROM %q.sagabox_barrier`))
	require.False(t, deliver(t, s, env, nil).Duplicate, "the redelivery is new")
}

// A rejection keeps the inbox record and the barrier mark, and discards the
// handler's writes.
func TestDeliveryDiscardRollsBackTheHandler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.Store(t, store.LineMessaging)
	_, err := s.Pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %q.stock (n int)`, s.Schema()))
	require.NoError(t, err)
	env := command(uuid.New(), message.KindCommand)
	tx := s.Begin(nil)
	defer tx.Rollback(ctx)
	d, err := s.DeliveryBegin(ctx, tx, env, nil)
	require.NoError(t, err)
	_, err = d.Tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %q.stock VALUES (1)`, s.Schema()))
	require.NoError(t, err)
	require.NoError(t, s.DeliveryFinish(ctx, tx, env, d, driver.DeliveryEnd{
		Discard: true,
		Mark:    &driver.BarrierMark{Outcome: driver.BarrierRejected, ReplyKind: message.KindReplyFailure, ReplyPayload: []byte(`{"reason":"no"}`)},
		Reply:   reply(env, message.KindReplyFailure, `{"reason":"no"}`),
	}))
	dbtest.Commit(t, tx)
	require.Zero(t, count.n(t, s, `SELECT count(*) FROM %q.stock`), "the handler's write is gone")
	require.Equal(t, 1, count.n(t, s, `SELECT count(*) FROM %q.sagabox_inbox`))
	require.Equal(t, 1, count.n(t, s, `SELECT count(*) FROM %q.sagabox_barrier WHERE outcome = 'rejected'`))
	require.Equal(t, 1, count.n(t, s, `SELECT count(*) FROM %q.sagabox_outbox WHERE kind = 'reply-failure'`))

	// A re-send of the action (new message id) gets the first answer.
	again := *env
	again.MessageID = uuid.New()
	d = deliver(t, s, &again, func(pgx.Tx) error { t.Fatal("a re-sent action must not run"); return nil })
	require.False(t, d.Marked)
	require.Equal(t, driver.BarrierRejected, d.Prior.Outcome)
	require.JSONEq(t, `{"reason":"no"}`, string(d.Prior.ReplyPayload))
}

// The barrier: a compensation that arrives before its action leaves the
// action's mark blocked (the late action is not run and gets the blocked
// reply); a compensation after its action sees it applied; a repeated
// compensation runs once.
func TestDeliveryBarrier(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t, store.LineMessaging)

	early := uuid.New()
	comp := deliver(t, s, command(early, message.KindCompensation), nil)
	require.True(t, comp.Marked)
	require.Equal(t, driver.BarrierBlocked, comp.Action, "the action never arrived")
	late := deliver(t, s, command(early, message.KindCommand), func(pgx.Tx) error { t.Fatal("a hanging action must not run"); return nil })
	require.False(t, late.Marked)
	require.Equal(t, driver.BarrierBlocked, late.Prior.Outcome)
	require.JSONEq(t, `{"reason":"blocked"}`, string(late.Prior.ReplyPayload))

	normal := uuid.New()
	require.True(t, deliver(t, s, command(normal, message.KindCommand), nil).Marked)
	runs := 0
	h := func(pgx.Tx) error { runs++; return nil }
	first := deliver(t, s, command(normal, message.KindCompensation), h)
	require.Equal(t, driver.BarrierApplied, first.Action)
	second := deliver(t, s, command(normal, message.KindCompensation), h)
	require.False(t, second.Marked, "one compensation mark per saga step")
	require.Equal(t, message.KindReplySuccess, second.Prior.ReplyKind)
	require.Equal(t, 1, runs)
}

// A handler that ends its transaction only ends its savepoint: the
// delivery's inbox record and reply still commit.
func TestDeliveryHandlerCannotEndTheDelivery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.Store(t, store.LineMessaging)
	env := command(uuid.New(), message.KindCommand)
	deliver(t, s, env, func(tx pgx.Tx) error { return tx.Commit(ctx) })
	require.Equal(t, 1, count.n(t, s, `SELECT count(*) FROM %q.sagabox_inbox`))
	require.Equal(t, 1, count.n(t, s, `SELECT count(*) FROM %q.sagabox_outbox`))

	rolled := command(uuid.New(), message.KindCommand)
	deliver(t, s, rolled, func(tx pgx.Tx) error {
		require.NoError(t, tx.Rollback(ctx))
		_, err := tx.Exec(ctx, "SELECT 1")
		require.ErrorIs(t, err, pgx.ErrTxClosed)
		return nil
	})
	require.Equal(t, 2, count.n(t, s, `SELECT count(*) FROM %q.sagabox_inbox`))
}

func TestAttempts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.Store(t, store.LineMessaging)
	env := command(uuid.New(), message.KindCommand)
	for want := 1; want <= 3; want++ {
		n, err := s.AttemptRecord(ctx, env, "boom")
		require.NoError(t, err)
		require.Equal(t, want, n)
	}
	require.NoError(t, s.AttemptMarkDeadLettered(ctx, nil, env, "gave up"))
	a, err := s.AttemptGet(ctx, env.MessageID)
	require.NoError(t, err)
	require.Equal(t, 3, a.Attempts)
	require.Equal(t, "gave up", a.LastError)
	require.False(t, a.DeadLetteredAt.IsZero())
	require.Equal(t, env.SagaID, a.SagaID)

	other := command(uuid.New(), message.KindCommand)
	_, err = s.AttemptRecord(ctx, other, "x")
	require.NoError(t, err)
	all, err := s.Store.Attempts(ctx, false, nil, 100)
	require.NoError(t, err)
	require.Len(t, all, 2)
	dl, err := s.Store.Attempts(ctx, true, nil, 100)
	require.NoError(t, err)
	require.Len(t, dl, 1)
	require.Equal(t, env.MessageID, dl[0].MessageID)

	_, err = s.AttemptGet(ctx, uuid.New())
	require.ErrorIs(t, err, message.ErrNotFound)
}

// A failure whose text Postgres cannot hold as it is (a NUL byte, invalid
// UTF-8: handler errors often quote their input) is still counted;
// otherwise its message could never reach its bounded attempts.
func TestAttemptRecordsAnyErrorText(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.Store(t, store.LineMessaging)
	env := command(uuid.New(), message.KindCommand)
	n, err := s.AttemptRecord(ctx, env, "no such sku \x00 here")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	n, err = s.AttemptRecord(ctx, env, "no such sku \xff here")
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.NoError(t, s.AttemptMarkDeadLettered(ctx, nil, env, "gave up: \x00\xfe"))
	a, err := s.AttemptGet(ctx, env.MessageID)
	require.NoError(t, err)
	require.Equal(t, 2, a.Attempts)
	require.Equal(t, "gave up: \\x00\uFFFD", a.LastError)

	// A text of megabytes (a handler quoting a whole payload) is cut to
	// 8 KiB, on a character boundary, with its length.
	huge := strings.Repeat("é", 1<<20)
	require.NoError(t, s.AttemptMarkDeadLettered(ctx, nil, env, huge))
	a, err = s.AttemptGet(ctx, env.MessageID)
	require.NoError(t, err)
	require.LessOrEqual(t, len(a.LastError), 8<<10+40)
	require.True(t, strings.HasPrefix(a.LastError, "éé"))
	require.True(t, strings.HasSuffix(a.LastError, fmt.Sprintf("… (cut from %d bytes)", len(huge))))
	require.True(t, utf8.ValidString(a.LastError))
}

// The barrier under READ COMMITTED (DESIGN §4.6): an action and the
// compensation of the same step racing on two connections are serialised by
// the action mark's key. The compensation's delivery waits for the action's
// transaction; when that commits, the compensation sees the action applied
// (and runs); when it rolls back, the compensation leaves the action's mark
// blocked and the late action will find it.
func TestGuaranteeCompensationRaceBarrierKeySerialises(t *testing.T) {
	t.Parallel()
	for _, actionCommits := range []bool{true, false} {
		t.Run(fmt.Sprintf("action commits %v", actionCommits), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := dbtest.Store(t, store.LineMessaging)
			sagaID := uuid.New()
			actionEnv := command(sagaID, message.KindCommand)
			action := s.Begin(nil)
			defer action.Rollback(ctx)
			ad, err := s.DeliveryBegin(ctx, action, actionEnv, nil)
			require.NoError(t, err)
			require.True(t, ad.Marked)

			type begun struct {
				d   *driver.Delivery
				err error
			}
			compEnv := command(sagaID, message.KindCompensation)
			comp := s.Begin(nil)
			defer comp.Rollback(ctx)
			done := make(chan begun, 1)
			go func() {
				d, err := s.DeliveryBegin(ctx, comp, compEnv, []byte(`{"reason":"blocked"}`))
				done <- begun{d, err}
			}()
			require.Eventually(t, func() bool {
				var waiting int
				err := s.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
					WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%sagabox_barrier%'`, s.Schema()).Scan(&waiting)
				return err == nil && waiting == 1
			}, 10*time.Second, 10*time.Millisecond, "the compensation waits for the action's transaction")

			if actionCommits {
				require.NoError(t, s.DeliveryFinish(ctx, action, actionEnv, ad, driver.DeliveryEnd{
					Mark: &driver.BarrierMark{Outcome: driver.BarrierApplied, ReplyKind: message.KindReplySuccess, ReplyPayload: []byte(`{}`)},
				}))
				dbtest.Commit(t, action)
			} else {
				action.Rollback(ctx)
			}
			var r begun
			select {
			case r = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the compensation's delivery did not begin")
			}
			require.NoError(t, r.err)
			require.True(t, r.d.Marked)
			want := driver.BarrierBlocked
			if actionCommits {
				want = driver.BarrierApplied
			}
			require.Equal(t, want, r.d.Action, "the compensation sees the winner's mark")
			require.NoError(t, s.DeliveryFinish(ctx, comp, compEnv, r.d, driver.DeliveryEnd{}))
			dbtest.Commit(t, comp)
		})
	}
}

// A delivery leaves its barrier mark when it begins and completes it (the
// outcome, the stored reply) when it finishes: the completion is a HOT
// update, which writes no index entry. PostgreSQL's statistics count HOT
// updates apart; they reach pg_stat_user_tables within a few seconds.
func TestBarrierCompletionIsAHOTUpdate(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t, store.LineMessaging)
	ctx := context.Background()
	const n = 20
	for range n {
		deliver(t, s, command(uuid.New(), message.KindCommand), nil)
	}
	var upd, hot int64
	require.Eventually(t, func() bool {
		err := s.Pool.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
			WHERE schemaname = $1 AND relname = 'sagabox_barrier'`, s.Schema()).Scan(&upd, &hot)
		return err == nil && upd >= n
	}, 30*time.Second, 100*time.Millisecond, "the updates reach the statistics")
	require.Equal(t, upd, hot, "every completion was a HOT update")
}

// The barrier keeps one mark per run of a saga (message.Envelope.Run, set
// when an operator restarts the saga from a step): a step's action in run 1
// is performed although run 0's was, re-sends within a run are still
// answered from the run's mark, and a compensation sent in run 0 (a step
// kept by the restart) finds run 0's action.
func TestBarrierKeepsAMarkPerRun(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t, store.LineMessaging)
	sagaID := uuid.New()
	first := command(sagaID, message.KindCommand)
	require.True(t, deliver(t, s, first, nil).Marked)
	again := command(sagaID, message.KindCommand)
	again.Run = 1
	require.True(t, deliver(t, s, again, nil).Marked, "run 1 performs the action again")
	resent := command(sagaID, message.KindCommand)
	resent.Run = 1
	require.False(t, deliver(t, s, resent, nil).Marked, "a re-send within run 1 is answered from its mark")
	comp := command(sagaID, message.KindCompensation)
	comp.Type = "inventory.release"
	require.Equal(t, driver.BarrierApplied, deliver(t, s, comp, nil).Action, "run 0's compensation finds run 0's action")
	marks, err := s.Store.BarrierMarks(context.Background(), sagaID)
	require.NoError(t, err)
	var runs []int
	for _, m := range marks {
		require.Equal(t, "reserve", m.Step, "the run is not part of the step's name")
		runs = append(runs, m.Run)
	}
	require.ElementsMatch(t, []int{0, 1, 0}, runs)
}

// The listings of dead outbox rows and of attempts page by keyset: every
// page, the first included, reads the time index from its position, under
// the generic plan a connection settles on too (a "first page or after"
// alternative in the predicate would make that plan filter the whole
// index).
func TestDeadListingsSeekTheirIndex(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t, store.LineMessaging)
	for _, tc := range []struct{ sql, index, column string }{
		{store.OutboxDeadListSQLForTest(), "sagabox_outbox_dead_idx", "dead_at"},
		{store.InboxAttemptListSQLForTest(), "sagabox_inbox_attempt_updated_at_idx", "updated_at"},
	} {
		plan := explainGeneric(t, s, tc.sql, "SET LOCAL enable_seqscan = off")
		require.Contains(t, plan, tc.index, plan)
		require.Regexp(t, `Index Cond: \(`+tc.column+` <= \$\d`, plan, "the scan starts at the page's position:\n%s", plan)
	}
}
