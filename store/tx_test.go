package store_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/store/driver"
)

// The deliveries of a group are begun in one statement sent with BEGIN and
// finished in one sent with COMMIT, whatever their number: a delivery
// undone leaves no inbox record, barrier mark or reply; the others commit
// with their handlers' writes, each made under a savepoint that goes out
// with the handler's first statement (a rejection's rolled back), and the
// handlers that touch nothing cost no round trip.
func TestDeliveriesOfAGroup(t *testing.T) {
	t.Parallel()
	var rts dbtest.RoundTrips
	pool := dbtest.PoolWith(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = &rts })
	s := dbtest.StoreOnPool(t, pool, store.LineMessaging)
	ctx := context.Background()
	_, err := pool.Exec(ctx, fmt.Sprintf("CREATE TABLE %q.effect (message_id uuid PRIMARY KEY)", s.Schema()))
	require.NoError(t, err)
	kept, undone, rejected, quiet := command(uuid.New(), message.KindCommand), command(uuid.New(), message.KindCommand),
		command(uuid.New(), message.KindCommand), command(uuid.New(), message.KindCompensation)
	envs := []*message.Envelope{kept, undone, rejected, quiet}
	applied := &driver.BarrierMark{Outcome: driver.BarrierApplied, ReplyKind: message.KindReplySuccess, ReplyPayload: []byte(`{}`)}

	rts.Start()
	tx := s.Begin(nil)
	defer tx.Rollback(ctx)
	dels, err := s.DeliveryBeginMany(ctx, tx, envs, [][]byte{nil, nil, nil, []byte(`{"reason":"blocked"}`)})
	require.NoError(t, err)
	ends := make([]driver.DeliveryEnd, len(envs))
	for i, env := range envs {
		d := dels[i]
		require.True(t, d.Marked, "message %d marks its step", i)
		require.False(t, d.Duplicate)
		switch env {
		case kept, undone, rejected:
			_, err := d.Tx.Exec(ctx, fmt.Sprintf("INSERT INTO %q.effect VALUES ($1)", s.Schema()), env.MessageID)
			require.NoError(t, err)
			ends[i] = driver.DeliveryEnd{Mark: applied, Reply: reply(env, message.KindReplySuccess, `{}`)}
		case quiet:
			require.Equal(t, driver.BarrierBlocked, d.Action, "the compensation came first: its action is blocked")
			ends[i] = driver.DeliveryEnd{Mark: &driver.BarrierMark{Outcome: driver.BarrierSkipped, ReplyKind: message.KindReplySuccess, ReplyPayload: []byte(`{}`)},
				Reply: reply(env, message.KindReplySuccess, `{}`)}
		}
		switch env {
		case undone:
			ends[i] = driver.DeliveryEnd{Undo: true}
		case rejected:
			ends[i] = driver.DeliveryEnd{Discard: true, Mark: &driver.BarrierMark{Outcome: driver.BarrierRejected, ReplyKind: message.KindReplyFailure, ReplyPayload: []byte(`{}`)},
				Reply: reply(env, message.KindReplyFailure, `{}`)}
		}
		require.NoError(t, s.DeliveryEndHandler(ctx, d, ends[i]))
	}
	require.NoError(t, s.DeliveryFinishMany(ctx, tx, envs, dels, ends))
	dbtest.Commit(t, tx)
	rts.Stop()

	require.Equal(t, 3, count.n(t, s, `SELECT count(*) FROM %q.sagabox_inbox`), "the undone delivery left no inbox record")
	require.Equal(t, 0, count.n(t, s, `SELECT count(*) FROM %q.sagabox_inbox WHERE message_id = $1`, undone.MessageID))
	require.Equal(t, 0, count.n(t, s, `SELECT count(*) FROM %q.sagabox_barrier WHERE saga_id = $1`, undone.SagaID), "nor barrier mark")
	require.Equal(t, 3, count.n(t, s, `SELECT count(*) FROM %q.sagabox_outbox`), "nor reply")
	require.Equal(t, 1, count.n(t, s, `SELECT count(*) FROM %q.effect`), "only the kept handler's write committed")
	require.Equal(t, 1, count.n(t, s, `SELECT count(*) FROM %q.effect WHERE message_id = $1`, kept.MessageID))
	require.Equal(t, 1, count.n(t, s, `SELECT count(*) FROM %q.sagabox_barrier WHERE saga_id = $1 AND outcome = 'rejected'`, rejected.SagaID))
	require.Equal(t, 2, count.n(t, s, `SELECT count(*) FROM %q.sagabox_barrier WHERE saga_id = $1`, quiet.SagaID), "the compensation's mark and its action's, blocked")
	txs := rts.Transactions()
	require.Len(t, txs, 1)
	for _, rt := range txs[0].RoundTrips {
		t.Logf("round trip: %d statements, last %.40q", len(rt.SQL), rt.SQL[len(rt.SQL)-1])
	}
	require.Len(t, txs[0].RoundTrips, 2+2*3, "begin, each writing handler's savepoint and statement, finish")

	// The same messages again: duplicates, each counted once, nothing run.
	tx = s.Begin(nil)
	defer tx.Rollback(ctx)
	dels, err = s.DeliveryBeginMany(ctx, tx, []*message.Envelope{kept, rejected}, [][]byte{nil, nil})
	require.NoError(t, err)
	for _, d := range dels {
		require.True(t, d.Duplicate)
		require.NoError(t, s.DeliveryEndHandler(ctx, d, driver.DeliveryEnd{}))
	}
	require.NoError(t, s.DeliveryFinishMany(ctx, tx, []*message.Envelope{kept, rejected}, dels, make([]driver.DeliveryEnd, 2)))
	dbtest.Commit(t, tx)
	require.Equal(t, 2, count.n(t, s, `SELECT sum(duplicates)::int FROM %q.sagabox_inbox`))
}

// A handler of a group that sends its statements on the connection itself
// (pgx.Tx.Conn) writes inside its own savepoint too: what it does survives
// the previous handler's rejection, and is rolled back with its own
// failure.
func TestDeliveriesOfAGroupIsolateWritesThroughTheConnection(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t, store.LineMessaging)
	ctx := context.Background()
	effect := fmt.Sprintf("%q.effect", s.Schema())
	_, err := s.Pool.Exec(ctx, "CREATE TABLE "+effect+" (message_id uuid PRIMARY KEY)")
	require.NoError(t, err)
	rejected, kept, failed := command(uuid.New(), message.KindCommand), command(uuid.New(), message.KindCommand), command(uuid.New(), message.KindCommand)
	envs := []*message.Envelope{rejected, kept, failed}
	tx := s.Begin(nil)
	defer tx.Rollback(ctx)
	dels, err := s.DeliveryBeginMany(ctx, tx, envs, [][]byte{nil, nil, nil})
	require.NoError(t, err)
	ends := []driver.DeliveryEnd{
		{Discard: true, Mark: &driver.BarrierMark{Outcome: driver.BarrierRejected, ReplyKind: message.KindReplyFailure, ReplyPayload: []byte(`{}`)}},
		{Mark: &driver.BarrierMark{Outcome: driver.BarrierApplied, ReplyKind: message.KindReplySuccess, ReplyPayload: []byte(`{}`)}},
		{Undo: true},
	}
	for i, env := range envs {
		var err error
		if env == rejected {
			_, err = dels[i].Tx.Exec(ctx, "INSERT INTO "+effect+" VALUES ($1)", env.MessageID)
		} else {
			_, err = dels[i].Tx.Conn().Exec(ctx, "INSERT INTO "+effect+" VALUES ($1)", env.MessageID)
		}
		require.NoError(t, err)
		require.NoError(t, s.DeliveryEndHandler(ctx, dels[i], ends[i]))
	}
	require.NoError(t, s.DeliveryFinishMany(ctx, tx, envs, dels, ends))
	dbtest.Commit(t, tx)
	var ids []uuid.UUID
	rows, err := s.Pool.Query(ctx, "SELECT message_id FROM "+effect)
	require.NoError(t, err)
	ids, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{kept.MessageID}, ids, "only the kept handler's write, made on the connection, committed")
}

// A group's statements find the marks and inbox entries they change by
// primary key, whatever the tables' size was when a connection built their
// generic plans: the finish runs under the transition write's planner
// setting (on a never-analysed table the generic plan of its array join
// scans the table), the begin needs none.
func TestDeliveriesOfAGroupArePlannedByPrimaryKey(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t, store.LineMessaging)
	plan := explainGeneric(t, s, store.DeliveryFinishManySQLForTest())
	require.Contains(t, plan, "Seq Scan on sagabox_barrier", "the hazard: the generic plan of a never analysed table scans it:\n%s", plan)
	plan = explainGeneric(t, s, store.DeliveryFinishManySQLForTest(), store.WritePlanForTest())
	for _, table := range []string{"sagabox_barrier", "sagabox_inbox"} {
		require.NotContains(t, plan, "Seq Scan on "+table, "the finish must not scan %s:\n%s", table, plan)
	}
	require.Contains(t, plan, "sagabox_barrier_pkey", "the finish finds its marks by primary key:\n%s", plan)
	plan = explainGeneric(t, s, store.DeliveryBeginManySQLForTest())
	for _, table := range []string{"sagabox_barrier", "sagabox_inbox"} {
		require.NotContains(t, plan, "Seq Scan on "+table, "the begin must not scan %s:\n%s", table, plan)
	}
}

// A finish that fails (a reply PostgreSQL cannot hold) commits nothing of
// the group.
func TestDeliveriesOfAGroupFailTogether(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t, store.LineMessaging)
	ctx := context.Background()
	first, second := command(uuid.New(), message.KindCommand), command(uuid.New(), message.KindCommand)
	envs := []*message.Envelope{first, second}
	tx := s.Begin(nil)
	defer tx.Rollback(ctx)
	dels, err := s.DeliveryBeginMany(ctx, tx, envs, [][]byte{nil, nil})
	require.NoError(t, err)
	bad := reply(first, message.KindReplySuccess, `{}`)
	bad.RoutingKey = "nul\x00byte" // PostgreSQL text cannot hold NUL
	ends := []driver.DeliveryEnd{{Reply: bad}, {Reply: reply(second, message.KindReplySuccess, `{}`)}}
	for i, d := range dels {
		require.NoError(t, s.DeliveryEndHandler(ctx, d, ends[i]))
	}
	require.NoError(t, s.DeliveryFinishMany(ctx, tx, envs, dels, ends), "the statement goes out with the commit")
	_, err = tx.Commit(ctx)
	require.ErrorIs(t, err, driver.ErrDataRefused, "the commit fails with the finish's statement")
	tx.Rollback(ctx)
	require.Equal(t, 0, count.n(t, s, `SELECT count(*) FROM %q.sagabox_inbox`), "nothing was committed")
}
