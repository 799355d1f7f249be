package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/store/driver"
)

func newSaga(key string, deadline time.Time) driver.SagaRecord {
	return driver.SagaRecord{
		ID: uuid.New(), Type: "checkout", Version: 1, Status: "running", StartKey: key,
		Data: []byte(`{}`), Steps: []byte(`[]`), Phase: "action", Deadline: deadline,
	}
}

// start starts rec with one history entry and one command, at now.
func start(t *testing.T, s *dbtest.DB, rec driver.SagaRecord, now time.Time) bool {
	t.Helper()
	ctx := context.Background()
	var inserted bool
	require.NoError(t, s.InTx(ctx, func(tx pgx.Tx) (err error) {
		inserted, err = s.SagaStart(ctx, tx, &driver.SagaStart{
			Saga:    rec,
			History: []driver.HistoryRecord{{SagaID: rec.ID, At: now, Event: "started"}},
			Messages: []message.Message{{
				Envelope: message.Envelope{Type: "inventory.reserve", Kind: message.KindCommand, SagaID: rec.ID, Step: "reserve", ReplyTo: "orders"},
				Payload:  []byte(`{}`),
			}},
		}, now)
		return err
	}))
	return inserted
}

// A start writes the saga, its history and its command in one statement;
// a start key already taken writes nothing at all.
func TestStartSagaStartKeyIsIdempotent(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t)
	ctx := context.Background()
	now := time.Now()
	first := newSaga("order-1", time.Time{})
	require.True(t, start(t, s, first, now))
	require.False(t, start(t, s, newSaga("order-1", time.Time{}), now), "the start key is taken")
	got, err := s.SagaGetByStartKey(ctx, nil, "checkout", "order-1")
	require.NoError(t, err)
	require.Equal(t, first.ID, got.ID, "a repeated start key finds the existing saga")
	require.Equal(t, 1, count.n(t, s, `SELECT count(*) FROM %q.sagabox_saga_history`), "the second start wrote no history")
	require.Equal(t, 1, count.n(t, s, `SELECT count(*) FROM %q.sagabox_outbox`), "nor a command")
	_, err = s.SagaGetByStartKey(ctx, nil, "checkout", "order-2")
	require.ErrorIs(t, err, message.ErrNotFound)
}

// A transition computed from a saga that changed meanwhile writes nothing
// and fails with an error that asks for the transaction to run again.
func TestWriteTransitionsDetectsConflict(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t)
	ctx := context.Background()
	now := time.Now()
	rec := newSaga("", time.Time{})
	require.True(t, start(t, s, rec, now))
	got, err := s.SagaGet(ctx, rec.ID)
	require.NoError(t, err)
	write := func(r driver.SagaRecord) error {
		tx := s.Begin(nil)
		defer tx.Rollback(ctx)
		r.Status = "completed"
		if err := s.SagaWrite(ctx, tx, []driver.Transition{{
			Saga:     &r,
			History:  []driver.HistoryRecord{{SagaID: r.ID, At: now, Event: "completed"}},
			Messages: []message.Message{{Envelope: message.Envelope{Type: "x.y", Kind: message.KindEvent}, Payload: []byte(`{}`)}},
		}}, now); err != nil {
			return err
		}
		_, err := tx.Commit(ctx)
		return err
	}
	require.NoError(t, write(got))
	err = write(got)
	require.Error(t, err, "the second write carries a stale revision")
	require.ErrorIs(t, err, driver.ErrConflict, "the driver marks a conflict: the transaction runs again")
	require.True(t, store.IsRetryable(err), "a conflict asks for the transaction to run again: %v", err)
	require.Equal(t, 2, count.n(t, s, `SELECT count(*) FROM %q.sagabox_saga_history`), "the stale write wrote no history")
	require.Equal(t, 2, count.n(t, s, `SELECT count(*) FROM %q.sagabox_outbox`), "nor a message")
	after, err := s.SagaGet(ctx, rec.ID)
	require.NoError(t, err)
	require.Equal(t, got.Revision+1, after.Revision)
	require.Equal(t, "completed", after.Status)

	_, err = s.SagaGet(ctx, uuid.New())
	require.ErrorIs(t, err, message.ErrNotFound)
}

// Replies are received in one statement: new ones lock their saga, a
// duplicate counts itself, a reply for a saga that does not exist finds
// none.
func TestReceiveReplies(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t)
	ctx := context.Background()
	rec := newSaga("order-1", time.Now().Add(time.Hour))
	rec.ConcurrencyKey, rec.StartDataHash = "customer-1", []byte{1}
	require.True(t, start(t, s, rec, time.Now()))
	known := &message.Envelope{MessageID: uuid.New(), Type: "inventory.reserve", Kind: message.KindReplySuccess, SagaID: rec.ID, Step: "reserve"}
	unknown := &message.Envelope{MessageID: uuid.New(), Type: "inventory.reserve", Kind: message.KindReplySuccess, SagaID: uuid.New(), Step: "reserve"}
	receive := func(envs ...*message.Envelope) []driver.Receipt {
		tx := s.Begin(nil)
		defer tx.Rollback(ctx)
		r, err := s.ReplyReceive(ctx, tx, envs)
		require.NoError(t, err)
		dbtest.Commit(t, tx)
		return r
	}
	r := receive(known, unknown)
	require.True(t, r[0].Fresh)
	require.NotNil(t, r[0].Saga)
	require.Equal(t, rec.ID, r[0].Saga.ID)
	require.Equal(t, int64(1), r[0].Saga.Revision)
	read, err := s.SagaGet(ctx, rec.ID)
	require.NoError(t, err)
	require.Equal(t, read, *r[0].Saga, "a received saga reads as SagaGet reads it")
	require.True(t, r[1].Fresh)
	require.Nil(t, r[1].Saga, "no such saga here")
	r = receive(known)
	require.False(t, r[0].Fresh, "a duplicate")
	require.Nil(t, r[0].Saga, "a duplicate locks nothing")
	require.Equal(t, 1, count.n(t, s, `SELECT duplicates FROM %q.sagabox_inbox WHERE message_id = $1`, known.MessageID))
}

func TestClaimDueSagasSkipsLockedSagas(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t)
	ctx := context.Background()
	now := time.Now()
	due1, due2, later := newSaga("", now.Add(-time.Minute)), newSaga("", now.Add(-time.Minute)), newSaga("", now.Add(time.Hour))
	for _, r := range []driver.SagaRecord{due1, due2, later} {
		require.True(t, start(t, s, r, now))
	}
	// Their commands are published: a saga whose command waits in the
	// outbox is not due (TestClaimDueSagasWaitsForTheCommandToBePublished).
	sent, err := s.OutboxClaim(ctx, driver.OutboxClaimOpts{Max: 10, Lease: time.Minute, ClaimedBy: "r"})
	require.NoError(t, err)
	_, err = s.OutboxClaim(ctx, driver.OutboxClaimOpts{Lease: time.Minute, ClaimedBy: "r", Settle: driver.OutboxSettle{Published: ids(sent)}})
	require.NoError(t, err)
	keys := []driver.SagaKey{{Type: "checkout", Version: 1}}
	txA := s.Begin(nil)
	defer txA.Rollback(ctx)
	a, err := s.SagaClaimDue(ctx, txA, now, 1, keys)
	require.NoError(t, err)
	require.Len(t, a, 1)

	txB := s.Begin(nil)
	defer txB.Rollback(ctx)
	b, err := s.SagaClaimDue(ctx, txB, now, 10, keys)
	require.NoError(t, err)
	require.Len(t, b, 1, "the saga locked by A is skipped, the future one is not due")
	require.NotEqual(t, a[0].ID, b[0].ID)

	txC := s.Begin(nil)
	defer txC.Rollback(ctx)
	c, err := s.SagaClaimDue(ctx, txC, now, 10, []driver.SagaKey{{Type: "checkout", Version: 2}})
	require.NoError(t, err)
	require.Empty(t, c, "sagas of a definition the caller does not run are never claimed")
}

// Sagas are listed oldest first, by start, so that paging is stable: a
// saga that moves on between two pages keeps its place.
func TestSagaListOldestFirstWithStablePaging(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t)
	ctx := context.Background()
	base := time.Now().Add(-time.Hour)
	var ids []uuid.UUID
	for i := range 5 {
		r := newSaga("", time.Time{})
		ids = append(ids, r.ID)
		require.True(t, start(t, s, r, base.Add(time.Duration(i)*time.Minute)))
	}
	page1, err := s.SagaList(ctx, driver.SagaFilter{Type: "checkout", Statuses: []string{"running"}, Limit: 3})
	require.NoError(t, err)
	require.Len(t, page1, 3)
	// The first saga moves on: it is the most recently updated now.
	moved := page1[0]
	moved.CurrentStep = 1
	tx := s.Begin(nil)
	defer tx.Rollback(ctx)
	require.NoError(t, s.SagaWrite(ctx, tx, []driver.Transition{{Saga: &moved}}, time.Now()))
	dbtest.Commit(t, tx)
	page2, err := s.SagaList(ctx, driver.SagaFilter{Type: "checkout", Limit: 3, After: &page1[2]})
	require.NoError(t, err)
	require.Len(t, page2, 2)
	got := []uuid.UUID{}
	for _, r := range append(page1, page2...) {
		got = append(got, r.ID)
	}
	require.Equal(t, ids, got, "every saga once, in start order")
	none, err := s.SagaList(ctx, driver.SagaFilter{Statuses: []string{"failed"}})
	require.NoError(t, err)
	require.Empty(t, none)
	hist, err := s.SagaHistory(ctx, ids[0])
	require.NoError(t, err)
	require.Len(t, hist, 1)
	require.Equal(t, "started", hist[0].Event)
}

// A transition that changes neither the saga's status nor its deadline (a
// step's reply moving it to the next step) is a HOT update: it writes the
// saga's row again and no index entry. PostgreSQL's statistics count HOT
// updates apart; they reach pg_stat_user_tables within a few seconds.
func TestSagaTransitionIsAHOTUpdate(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t)
	ctx := context.Background()
	rec := newSaga("", time.Time{})
	require.True(t, start(t, s, rec, time.Now()))
	const n = 20
	for i := range n {
		cur, err := s.SagaGet(ctx, rec.ID)
		require.NoError(t, err)
		cur.CurrentStep = i + 1
		cur.Data = []byte(fmt.Sprintf(`{"step": %d, "note": "a reply's data"}`, i))
		tx := s.Begin(nil)
		require.NoError(t, s.SagaWrite(ctx, tx, []driver.Transition{{
			Saga:    &cur,
			History: []driver.HistoryRecord{{SagaID: rec.ID, At: time.Now(), Event: "reply-applied"}},
		}}, time.Now()))
		dbtest.Commit(t, tx)
	}
	var upd, hot int64
	require.Eventually(t, func() bool {
		err := s.Pool.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
			WHERE schemaname = $1 AND relname = 'sagabox_saga'`, s.Schema()).Scan(&upd, &hot)
		return err == nil && upd >= n
	}, 30*time.Second, 100*time.Millisecond, "the updates reach the statistics")
	require.Equal(t, upd, hot, "every transition was a HOT update")
}

func TestOperationRequests(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t)
	ctx := context.Background()
	id := uuid.New()
	op, err := s.OperationRequest(ctx, driver.NewOperation{SagaID: id, Action: "retry", Actor: "alice", Reason: "payment fixed", Params: nil})
	require.NoError(t, err)
	require.True(t, op.AppliedAt.IsZero())

	txA := s.Begin(nil)
	defer txA.Rollback(ctx)
	claimed, err := s.OperationClaim(ctx, txA, nil)
	require.NoError(t, err)
	require.NotNil(t, claimed)
	require.Equal(t, "alice", claimed.Actor)

	// A second orchestrator skips the request A holds.
	txB := s.Begin(nil)
	other, err := s.OperationClaim(ctx, txB, nil)
	require.NoError(t, err)
	require.Nil(t, other)
	txB.Rollback(ctx)

	require.NoError(t, s.OperationMark(ctx, txA, op.ID, time.Now(), "saga is completed"))
	dbtest.Commit(t, txA)
	got, err := s.OperationGet(ctx, op.ID)
	require.NoError(t, err)
	require.False(t, got.AppliedAt.IsZero())
	require.Equal(t, "saga is completed", got.Error)

	_, err = s.OperationRequest(ctx, driver.NewOperation{SagaID: id, Action: "delete", Actor: "x", Reason: "y", Params: nil})
	require.Error(t, err, "only retry and abort are actions")
	_, err = s.OperationGet(ctx, 999999)
	require.ErrorIs(t, err, message.ErrNotFound)
}

// A saga whose command is still in the outbox, unpublished, is not due: its
// deadline waits for the relay. Once the command is settled, it is.
func TestClaimDueSagasWaitsForTheCommandToBePublished(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t)
	ctx := context.Background()
	now := time.Now()
	rec := newSaga("", now.Add(-time.Minute))
	require.True(t, start(t, s, rec, now.Add(-2*time.Minute))) // writes its command
	keys := []driver.SagaKey{{Type: "checkout", Version: 1}}
	claimDue := func() int {
		tx := s.Begin(nil)
		defer tx.Rollback(ctx)
		recs, err := s.SagaClaimDue(ctx, tx, now, 10, keys)
		require.NoError(t, err)
		return len(recs)
	}
	require.Zero(t, claimDue(), "its command is unpublished")
	rows, err := s.OutboxClaim(ctx, driver.OutboxClaimOpts{Max: 10, Lease: time.Minute, ClaimedBy: "r"})
	require.NoError(t, err)
	require.Len(t, rows, 1)
	require.Zero(t, claimDue(), "claimed but not confirmed is still unpublished")
	_, err = s.OutboxClaim(ctx, driver.OutboxClaimOpts{Lease: time.Minute, ClaimedBy: "r", Settle: driver.OutboxSettle{Published: []int64{rows[0].ID}}})
	require.NoError(t, err)
	require.Equal(t, 1, claimDue(), "published: the deadline counts")
}

// A command published late pushes its step's deadline back by the delay,
// with the saga's; a step that moved on (another attempt) is left alone.
func TestLatePublishPushesTheStepDeadlineBack(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Microsecond)
	deadline := now.Add(30 * time.Second)
	rec := newSaga("", deadline)
	rec.Steps = []byte(fmt.Sprintf(`[{"name":"reserve","status":"running","attempt":2,"deadline":%q},{"name":"charge","status":"pending"}]`, deadline.Format(time.RFC3339Nano)))
	require.True(t, start(t, s, rec, now))
	before, err := s.SagaGet(ctx, rec.ID)
	require.NoError(t, err)
	rows, err := s.OutboxClaim(ctx, driver.OutboxClaimOpts{Max: 10, Lease: time.Minute, ClaimedBy: "r"})
	require.NoError(t, err)
	require.Len(t, rows, 1)
	settle := driver.OutboxSettle{Published: []int64{rows[0].ID}, Late: []driver.LateSend{
		{SagaID: rec.ID, StepIndex: 0, Phase: message.PhaseAction, Attempt: 1, Delay: time.Hour}, // an earlier attempt: ignored
		{SagaID: rec.ID, StepIndex: 0, Phase: message.PhaseAction, Attempt: 2, Delay: 20 * time.Second},
	}}
	_, err = s.OutboxClaim(ctx, driver.OutboxClaimOpts{Lease: time.Minute, ClaimedBy: "r", Settle: settle})
	require.NoError(t, err)
	got, err := s.SagaGet(ctx, rec.ID)
	require.NoError(t, err)
	require.WithinDuration(t, deadline.Add(20*time.Second), got.Deadline, time.Millisecond, "the saga's deadline moved")
	var steps []struct {
		Deadline time.Time `json:"deadline"`
		Status   string    `json:"status"`
	}
	require.NoError(t, json.Unmarshal(got.Steps, &steps))
	require.WithinDuration(t, deadline.Add(20*time.Second), steps[0].Deadline, time.Millisecond, "the step's deadline moved")
	require.True(t, steps[1].Deadline.IsZero())
	require.Equal(t, before.Revision+1, got.Revision)

	// The step moved on (attempt 3): a late publish of attempt 2 changes
	// nothing.
	_, err = s.OutboxClaim(ctx, driver.OutboxClaimOpts{Lease: time.Minute, ClaimedBy: "r", Settle: driver.OutboxSettle{Late: []driver.LateSend{
		{SagaID: rec.ID, StepIndex: 1, Phase: message.PhaseAction, Attempt: 1, Delay: time.Hour},
	}}})
	require.NoError(t, err)
	again, err := s.SagaGet(ctx, rec.ID)
	require.NoError(t, err)
	require.Equal(t, got.Revision, again.Revision, "a step without a deadline is not touched")
}

// The transition write and the lock of sagas find their sagas by primary
// key on every connection, whatever the table's statistics: the write's
// generic plan (the one a connection keeps) is built under writePlan, the
// lock probes one saga at a time. Without it, on a table never analysed,
// PostgreSQL plans a scan of every saga, and the connection keeps that plan
// while the table grows.
func TestTransitionWriteIsPlannedByPrimaryKey(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t)
	require.True(t, start(t, s, newSaga("", time.Time{}), time.Now()))

	plan := explainGenericWrite(t, s, false)
	require.Contains(t, plan, "Seq Scan on sagabox_saga", "the hazard: the generic plan of a never analysed table scans it:\n%s", plan)
	plan = explainGenericWrite(t, s, true)
	require.NotContains(t, plan, "Seq Scan on sagabox_saga", "the write must not scan the saga table:\n%s", plan)
	require.Contains(t, plan, "sagabox_saga_pkey", "the write finds its sagas by primary key:\n%s", plan)

	// The lock of an event's or an operator action's sagas, likewise.
	plan = explainGeneric(t, s, store.SagaLockSQLForTest())
	require.NotContains(t, plan, "Seq Scan on sagabox_saga", "the lock must not scan the saga table:\n%s", plan)
	require.Contains(t, plan, "sagabox_saga_pkey", "the lock finds its sagas by primary key:\n%s", plan)
}

// explainGenericWrite returns the generic plan of the transition write in a
// fresh transaction, with or without the write's planner setting.
func explainGenericWrite(t *testing.T, s *dbtest.DB, planned bool) string {
	t.Helper()
	var settings []string
	if planned {
		settings = append(settings, store.WritePlanForTest())
	}
	plan := explainGeneric(t, s, store.SagaWriteSQLForTest(), settings...)
	require.Regexp(t, `\$\d`, plan, "the generic plan refers to the parameters, not to their values")
	return plan
}

// explainGeneric returns the generic plan of statement (one of the store's,
// its schema marker not yet rendered) in a fresh transaction, after the
// statements settings.
func explainGeneric(t *testing.T, s *dbtest.DB, statement string, settings ...string) string {
	t.Helper()
	ctx := context.Background()
	tx, err := s.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	for _, setting := range settings {
		_, err = tx.Exec(ctx, setting)
		require.NoError(t, err)
	}
	_, err = tx.Exec(ctx, "SET LOCAL plan_cache_mode = force_generic_plan")
	require.NoError(t, err)
	sql := strings.ReplaceAll(statement, "/* TEMPLATE: schema */", fmt.Sprintf("%q.", s.Schema()))
	name := "sagabox_explain_generic"
	_, err = tx.Exec(ctx, "PREPARE "+name+" AS "+sql, pgx.QueryExecModeSimpleProtocol)
	require.NoError(t, err)
	// A prepared statement outlives the transaction: not the connection's
	// next user.
	defer func() { _, _ = tx.Exec(ctx, "DEALLOCATE "+name, pgx.QueryExecModeSimpleProtocol) }()
	// One literal per parameter, of the type its cast names: an empty array
	// for an array, a timestamp for the transition's time.
	types := map[int]string{}
	for _, m := range regexp.MustCompile(`\$(\d+)::([a-z][a-z0-9]*(\[\])?)`).FindAllStringSubmatch(sql, -1) {
		n, err := strconv.Atoi(m[1])
		require.NoError(t, err)
		types[n] = m[2]
	}
	lits := make([]string, len(types))
	for n, typ := range types {
		require.LessOrEqual(t, n, len(types), "parameters are numbered from 1 without gaps")
		switch {
		case strings.HasSuffix(typ, "[]"):
			lits[n-1] = "'{}'"
		case typ == "timestamptz":
			lits[n-1] = "now()"
		case typ == "text":
			lits[n-1] = "''"
		case typ == "boolean":
			lits[n-1] = "false"
		case typ == "uuid":
			lits[n-1] = "'" + uuid.Max.String() + "'"
		case typ == "integer" || typ == "float8" || typ == "bigint":
			lits[n-1] = "1"
		default:
			t.Fatalf("parameter $%d of type %s: no literal for it", n, typ)
		}
	}
	rows, err := tx.Query(ctx, "EXPLAIN EXECUTE "+name+"("+strings.Join(lits, ", ")+")", pgx.QueryExecModeSimpleProtocol)
	require.NoError(t, err)
	return planText(t, rows)
}

// A write in a caller's transaction goes out in one round trip with the
// planner setting and its restore: the rest of the caller's transaction
// plans as the caller's session says.
func TestTransitionWriteInACallersTransactionRestoresThePlanner(t *testing.T) {
	t.Parallel()
	rts, s, tr := tracedCompletion(t)
	ctx := context.Background()
	tx, err := s.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	rts.Start()
	require.NoError(t, s.SagaWriteIn(ctx, tx, []driver.Transition{tr}, time.Now()))
	rts.Stop()
	var setting string
	require.NoError(t, tx.QueryRow(ctx, "SHOW enable_seqscan").Scan(&setting))
	require.Equal(t, "on", setting, "the setting does not outlive the write")
	require.NoError(t, tx.QueryRow(ctx, "SHOW plan_cache_mode").Scan(&setting))
	require.Equal(t, "auto", setting, "the setting does not outlive the write")
	require.NoError(t, tx.Commit(ctx))

	all := rts.All()
	require.Len(t, all, 1, "one round trip: %v", all)
	require.Len(t, all[0].SQL, 3, "setting, write, restore: %v", all[0].SQL)
	require.Contains(t, all[0].SQL[1], "-- name: SagaWrite ")
	after, err := s.SagaGet(ctx, tr.Saga.ID)
	require.NoError(t, err)
	require.Equal(t, "completed", after.Status)
}

// tracedCompletion starts a saga on a store whose pool records its round
// trips, and returns the transition that completes it.
func tracedCompletion(t *testing.T) (*dbtest.RoundTrips, *dbtest.DB, driver.Transition) {
	t.Helper()
	rts := &dbtest.RoundTrips{}
	pool := dbtest.PoolWith(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = rts })
	s := dbtest.StoreOnPool(t, pool)
	now := time.Now()
	rec := newSaga("", time.Time{})
	require.True(t, start(t, s, rec, now))
	got, err := s.SagaGet(context.Background(), rec.ID)
	require.NoError(t, err)
	got.Status = "completed"
	return rts, s, driver.Transition{Saga: &got, History: []driver.HistoryRecord{{SagaID: got.ID, At: now, Event: "completed"}}}
}

// A write in the engine's own transaction sends the planner setting ahead
// of it in the same round trip; the commit ends the setting.
func TestTransitionWriteSendsItsPlannerSetting(t *testing.T) {
	t.Parallel()
	rts, s, tr := tracedCompletion(t)
	rts.Start()
	tx := s.Begin(nil)
	require.NoError(t, s.SagaWrite(context.Background(), tx, []driver.Transition{tr}, time.Now()))
	dbtest.Commit(t, tx)
	rts.Stop()
	all := rts.All()
	require.Len(t, all, 1, "BEGIN, setting, write and COMMIT in one round trip: %v", all)
	sql := all[0].SQL
	require.Equal(t, []string{"begin", store.WritePlanForTest()}, sql[:2], "%v", sql)
	require.Contains(t, sql[2], "-- name: SagaWrite ")
	require.Equal(t, "commit", sql[len(sql)-1])
}

// Wherever the engine writes transitions, its planner setting ends with the
// write: in a transaction that goes on, the rest of the transaction plans
// with the session's setting.
func TestTransitionWriteLeavesTheTransactionsPlannerAlone(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// write writes tr somewhere in tx.
		write func(t *testing.T, s *dbtest.DB, tx driver.Tx, tr driver.Transition)
	}{
		{"the transaction goes on", func(t *testing.T, s *dbtest.DB, tx driver.Tx, tr driver.Transition) {
			require.NoError(t, s.SagaWrite(context.Background(), tx, []driver.Transition{tr}, time.Now()))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, s, tr := tracedCompletion(t)
			ctx := context.Background()
			tx := s.Begin(nil)
			defer tx.Rollback(ctx)
			tc.write(t, s, tx, tr)
			_, err := s.SagaLock(ctx, tx, []uuid.UUID{tr.Saga.ID})
			require.NoError(t, err)
			sp, err := tx.Savepoint(ctx)
			require.NoError(t, err)
			var setting string
			require.NoError(t, sp.QueryRow(ctx, "SHOW enable_seqscan").Scan(&setting))
			require.Equal(t, "on", setting)
			require.NoError(t, sp.QueryRow(ctx, "SHOW plan_cache_mode").Scan(&setting))
			require.Equal(t, "auto", setting)
		})
	}
}
