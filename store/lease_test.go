package store_test

import (
	"context"
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

// leaseRecorder is a write-time lease and what the commits of the
// transactions begun with it returned.
type leaseRecorder struct {
	driver.OutboxLease
	commits  int
	leased   []driver.OutboxRow
	unleased int
}

func newLease(confirmed ...int64) *leaseRecorder {
	return &leaseRecorder{OutboxLease: driver.OutboxLease{Lease: time.Minute, ClaimedBy: "relay-a", Confirmed: confirmed}}
}

// begin begins a transaction of s under the lease (none when l is nil).
func (l *leaseRecorder) begin(s *dbtest.DB) driver.Tx {
	if l == nil {
		return s.Begin(nil)
	}
	return s.Begin(&driver.BeginOpts{Lease: &l.OutboxLease})
}

// commit commits tx, begun with l.begin, and records what it returned.
func (l *leaseRecorder) commit(t *testing.T, tx driver.Tx) {
	t.Helper()
	c := dbtest.Commit(t, tx)
	if l == nil {
		require.Empty(t, c.Leased, "a transaction without a lease leases nothing")
		return
	}
	l.commits++
	l.leased = append(l.leased, c.Leased...)
	l.unleased += c.Unleased
}

// sagaCommand is the next command of saga id, for step.
func sagaCommand(id uuid.UUID, step string) message.Message {
	return message.Message{
		Envelope: message.Envelope{MessageID: uuid.New(), Type: "payment.charge", Kind: message.KindCommand, SagaID: id, Step: step, ReplyTo: "orders", OrderingKey: id.String()},
		Payload:  []byte(`{"amount":10}`),
	}
}

// writeUnder writes, in a transaction of the engine under lease (none when
// nil), one transition of saga id sending msgs, and commits it.
func writeUnder(t *testing.T, s *dbtest.DB, lease *leaseRecorder, id uuid.UUID, msgs ...message.Message) {
	t.Helper()
	ctx := context.Background()
	rec, err := s.SagaGet(ctx, id)
	require.NoError(t, err)
	tr := driver.Transition{Saga: &rec, Messages: msgs, History: []driver.HistoryRecord{{SagaID: id, At: time.Now(), Event: "command-sent"}}}
	tx := lease.begin(s)
	defer tx.Rollback(ctx)
	require.NoError(t, s.SagaWrite(ctx, tx, []driver.Transition{tr}, time.Now()))
	lease.commit(t, tx)
}

// outboxRowOf returns the id, claimant and attempts of message mid's row.
func outboxRowOf(t *testing.T, s *dbtest.DB, mid uuid.UUID) (id int64, claimedBy string, leasedFor time.Duration, attempts int) {
	t.Helper()
	var until *time.Time
	require.NoError(t, s.Pool.QueryRow(context.Background(),
		`SELECT id, claimed_by, claimed_until, publish_attempts FROM `+pgIdent(s.Schema())+`.sagabox_outbox WHERE message_id = $1`, mid).
		Scan(&id, &claimedBy, &until, &attempts))
	if until != nil {
		leasedFor = time.Until(*until)
	}
	return id, claimedBy, leasedFor, attempts
}

func pgIdent(s string) string { return `"` + s + `"` }

// The write-time lease: a transition's messages are written claimed by the
// relay that will publish them, and the commit returns them
// (driver.Committed.Leased) as a claim would have; a message whose key has
// an earlier unpublished row the relay has not confirmed is written
// unclaimed, for a claim to take in key order; a write without a lease
// claims nothing.
func TestTransitionWriteTakesTheWriteTimeLease(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t)
	ctx := context.Background()

	// The start's command is unpublished: the next command waits behind it.
	held := newSaga("", time.Time{})
	require.True(t, start(t, s, held, time.Now()))
	lease := newLease()
	next := sagaCommand(held.ID, "charge")
	writeUnder(t, s, lease, held.ID, next)
	require.Empty(t, lease.leased)
	require.Equal(t, 1, lease.unleased)
	_, by, _, attempts := outboxRowOf(t, s, next.MessageID)
	require.Equal(t, "", by, "a row behind an unpublished row of its key is left to a claim")
	require.Zero(t, attempts)

	// Once the relay has confirmed the start's command (not settled yet),
	// the next command is leased, with the command after it in the same
	// write.
	free := newSaga("", time.Time{})
	require.True(t, start(t, s, free, time.Now()))
	first := startCommandID(t, s, free.ID)
	lease = newLease(first)
	a, b := sagaCommand(free.ID, "charge"), sagaCommand(free.ID, "ship")
	writeUnder(t, s, lease, free.ID, a, b)
	require.Equal(t, 0, lease.unleased)
	require.Len(t, lease.leased, 2)
	for i, m := range []message.Message{a, b} {
		id, by, leasedFor, attempts := outboxRowOf(t, s, m.MessageID)
		require.Equal(t, id, lease.leased[i].ID, "leased rows come in id order")
		require.Equal(t, "relay-a", by)
		require.InDelta(t, time.Minute.Seconds(), leasedFor.Seconds(), 10, "leased for the lease")
		require.Equal(t, 1, attempts, "the lease counts as the row's first claim")
		require.Equal(t, 1, lease.leased[i].PublishAttempts)
	}

	// Handed rows are the rows a claim returns: released, they are claimed
	// as they were handed.
	_, err := s.OutboxClaim(ctx, driver.OutboxClaimOpts{Lease: time.Minute, ClaimedBy: "r", Settle: driver.OutboxSettle{
		Failed: []int64{lease.leased[0].ID, lease.leased[1].ID}, Published: []int64{first},
	}})
	require.NoError(t, err)
	claimed, err := s.OutboxClaim(ctx, driver.OutboxClaimOpts{Max: 10, Lease: time.Minute, ClaimedBy: "r"})
	require.NoError(t, err)
	var got []driver.OutboxRow
	for _, r := range claimed {
		if r.Message.SagaID == free.ID {
			got = append(got, r)
		}
	}
	require.Len(t, got, 2)
	for i := range got {
		require.Equal(t, got[i].ID, lease.leased[i].ID)
		require.Equal(t, got[i].Message, lease.leased[i].Message, "a handed row is published as claimed")
	}

	// No lease: nothing is claimed at write.
	other := newSaga("", time.Time{})
	require.True(t, start(t, s, other, time.Now()))
	m := sagaCommand(other.ID, "charge")
	writeUnder(t, s, nil, other.ID, m)
	_, by, _, _ = outboxRowOf(t, s, m.MessageID)
	require.Equal(t, "", by)
}

// startCommandID returns the outbox id of the command saga id's start
// wrote.
func startCommandID(t *testing.T, s *dbtest.DB, id uuid.UUID) int64 {
	t.Helper()
	var rowID int64
	require.NoError(t, s.Pool.QueryRow(context.Background(),
		`SELECT min(id) FROM `+pgIdent(s.Schema())+`.sagabox_outbox WHERE saga_id = $1`, id).Scan(&rowID))
	return rowID
}

// customPlansFirst is how many executions of a prepared statement
// PostgreSQL's plan cache plans for their parameters before it weighs the
// generic plan against them.
const customPlansFirst = 5

// plansOf returns the generic and custom plans of the statement named name
// on pool's one connection.
func plansOf(t *testing.T, pool *pgxpool.Pool, name string) (generic, custom int64) {
	t.Helper()
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT coalesce(sum(generic_plans), 0), coalesce(sum(custom_plans), 0) FROM pg_prepared_statements
		 WHERE statement LIKE '%name: '||$1||' %'`, name).Scan(&generic, &custom))
	return generic, custom
}

// The transition write is planned once per connection: after the plan
// cache's first custom plans, every write runs on the generic plan. With
// the lease's probe a subquery of the write (not sagabox_outbox_leasable),
// the plan cache planned every write anew, for more than it cost to run.
func TestTransitionWriteKeepsItsGenericPlan(t *testing.T) {
	t.Parallel()
	pool := dbtest.PoolWith(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 1 })
	s := dbtest.StoreOnPool(t, pool)
	lease := newLease()
	const writes = 12
	for range writes {
		rec := newSaga("", time.Time{})
		require.True(t, start(t, s, rec, time.Now()))
		writeUnder(t, s, lease, rec.ID, sagaCommand(rec.ID, "charge"))
	}
	generic, custom := plansOf(t, pool, "SagaWrite")
	require.LessOrEqual(t, custom, int64(customPlansFirst), "writes planned for their parameters")
	require.GreaterOrEqual(t, generic, int64(writes-customPlansFirst), "writes on the connection's generic plan")
}

// The outbox writes in a delivery's transaction that take no lease (a
// handler's own messages and a saga a local step started, written in the
// transaction's savepoints; a row its key holds back) are counted in what
// the commit returns (driver.Committed.Unleased), so that the engine wakes
// the relay for them; writes in a caller's own transaction are the
// caller's to announce.
func TestUnleasedWritesAreCounted(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t)
	ctx := context.Background()
	lease := newLease()

	rec := newSaga("", time.Time{})
	tx := lease.begin(s)
	defer tx.Rollback(ctx)
	sp, err := tx.Savepoint(ctx)
	require.NoError(t, err)
	st := &driver.SagaStart{Saga: rec, Messages: []message.Message{sagaCommand(rec.ID, "reserve")}}
	_, err = s.SagaStart(ctx, sp, st, time.Now())
	require.NoError(t, err)
	nested, err := sp.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, s.OutboxWrite(ctx, nested, []message.Message{sagaCommand(uuid.New(), "notify"), sagaCommand(uuid.New(), "notify")}))
	require.NoError(t, nested.Commit(ctx))
	require.NoError(t, sp.Commit(ctx))
	// Behind the start's command, unpublished: written for a claim.
	require.NoError(t, s.SagaWrite(ctx, tx, []driver.Transition{{Saga: &st.Saga, Messages: []message.Message{sagaCommand(rec.ID, "charge")}}}, time.Now()))
	lease.commit(t, tx)
	require.Equal(t, 4, lease.unleased, "a start's command, two messages of a nested savepoint, a command held back by its key")
	require.Empty(t, lease.leased)

	other := newSaga("", time.Time{})
	require.NoError(t, s.InTx(ctx, func(tx pgx.Tx) error {
		_, err := s.SagaStart(ctx, tx, &driver.SagaStart{Saga: other, Messages: []message.Message{sagaCommand(other.ID, "reserve")}}, time.Now())
		return err
	}))
	require.Equal(t, 1, lease.commits, "a caller's own transaction is no engine transaction")
}

// finishUnder delivers a command to saga id in a transaction of its own (or,
// with group, as the one delivery of a group) under lease, and returns its
// reply as written.
func finishUnder(t *testing.T, s *dbtest.DB, lease *leaseRecorder, id uuid.UUID, group bool) message.Message {
	t.Helper()
	ctx := context.Background()
	env := command(id, message.KindCommand)
	tx := lease.begin(s)
	defer tx.Rollback(ctx)
	r := reply(env, message.KindReplySuccess, `{"ok":1}`)
	r.OrderingKey = id.String()
	end := driver.DeliveryEnd{Mark: &driver.BarrierMark{Outcome: driver.BarrierApplied, ReplyKind: message.KindReplySuccess, ReplyPayload: []byte(`{"ok":1}`)}, Reply: r}
	if group {
		envs := []*message.Envelope{env}
		dels, err := s.DeliveryBeginMany(ctx, tx, envs, [][]byte{nil})
		require.NoError(t, err)
		require.NoError(t, s.DeliveryEndHandler(ctx, dels[0], end))
		require.NoError(t, s.DeliveryFinishMany(ctx, tx, envs, dels, []driver.DeliveryEnd{end}))
		lease.commit(t, tx)
		return *r
	}
	d, err := s.DeliveryBegin(ctx, tx, env, []byte(`{}`))
	require.NoError(t, err)
	require.NoError(t, s.DeliveryFinish(ctx, tx, env, d, end))
	lease.commit(t, tx)
	return *r
}

// A participant's reply is written under the write-time lease of its
// delivery, as an orchestrator's commands are, and so are the replies of a
// group. The finishes run on the connection's generic plan.
func TestDeliveryReplyTakesTheWriteTimeLease(t *testing.T) {
	t.Parallel()
	pool := dbtest.PoolWith(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 1 })
	s := dbtest.StoreOnPool(t, pool, store.LineMessaging)
	lease := newLease()

	const deliveries = 6
	for range deliveries {
		r := finishUnder(t, s, lease, uuid.New(), false)
		_, by, _, attempts := outboxRowOf(t, s, r.MessageID)
		require.Equal(t, "relay-a", by)
		require.Equal(t, 1, attempts)
	}
	require.Equal(t, deliveries, lease.commits)
	require.Len(t, lease.leased, deliveries)
	require.Zero(t, lease.unleased)

	for range deliveries {
		r := finishUnder(t, s, lease, uuid.New(), true)
		_, by, _, attempts := outboxRowOf(t, s, r.MessageID)
		require.Equal(t, "relay-a", by, "a group's reply is leased too")
		require.Equal(t, 1, attempts)
	}
	require.Equal(t, 2*deliveries, lease.commits)
	require.Len(t, lease.leased, 2*deliveries)
	require.Zero(t, lease.unleased)

	generic, custom := plansOf(t, pool, "DeliveryFinish")
	require.LessOrEqual(t, custom, int64(customPlansFirst), "finishes planned for their parameters")
	require.GreaterOrEqual(t, generic, int64(deliveries-customPlansFirst), "finishes on the connection's generic plan")
}

// The lease's probe finds a key's unpublished rows through the index of
// unpublished rows even on an outbox never analysed, with a backlog: no
// write taking the lease scans the outbox (counted by PostgreSQL's table
// statistics).
func TestLeaseProbeDoesNotScanTheOutbox(t *testing.T) {
	t.Parallel()
	pool := dbtest.PoolWith(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 1 })
	s := dbtest.StoreOnPool(t, pool)
	ctx := context.Background()
	backlog := make([]message.Message, 2000)
	for i := range backlog {
		backlog[i] = sagaCommand(uuid.New(), "charge")
	}
	require.NoError(t, s.InTx(ctx, func(tx pgx.Tx) error { return s.OutboxWrite(ctx, tx, backlog) }))
	seqScans := func() int64 {
		var n int64
		_, err := pool.Exec(ctx, "SELECT pg_stat_force_next_flush()")
		require.NoError(t, err)
		_, err = pool.Exec(ctx, "SET stats_fetch_consistency = none") // this test's own connection
		require.NoError(t, err)
		require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(seq_scan, 0) FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'sagabox_outbox'`, s.Schema()).Scan(&n))
		return n
	}
	before := seqScans()
	lease := newLease()
	const writes = 12
	for range writes {
		rec := newSaga("", time.Time{})
		require.True(t, start(t, s, rec, time.Now()))
		writeUnder(t, s, lease, rec.ID, sagaCommand(rec.ID, "charge"))
		finishUnder(t, s, lease, rec.ID, false)
	}
	require.Equal(t, before, seqScans(), "a probe scanned the outbox")
	// The control: a scan of the outbox is counted.
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+pgIdent(s.Schema())+`.sagabox_outbox WHERE payload IS NOT NULL`).Scan(&n))
	require.Greater(t, seqScans(), before, "the count of scans is live")
}
