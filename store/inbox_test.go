package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/dbtest"
	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/transport"
)

func command(sagaID uuid.UUID) *transport.Envelope {
	return &transport.Envelope{
		MessageID: uuid.New(), Type: "inventory.reserve", Kind: transport.KindCommand, SagaID: sagaID, Step: "reserve",
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
	require.Equal(t, transport.KindCommand, row.Kind)
	require.NotNil(t, row.LastDuplicateAt)

	stats, err := s.InboxStats(ctx, time.Hour)
	require.NoError(t, err)
	require.Equal(t, store.InboxStats{Total: 1, Duplicates: 2, DuplicatedMessages: 1, RecentlyDuplicated: 1}, stats)

	dups, err := s.InboxDuplicated(ctx, 10)
	require.NoError(t, err)
	require.Len(t, dups, 1)

	_, err = s.InboxGet(ctx, uuid.New())
	require.ErrorIs(t, err, store.ErrNotFound)
}

func TestInboxRecordRolledBackIsNotRecorded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.Store(t, store.LineMessaging)
	env := &transport.Envelope{MessageID: uuid.New(), Type: "order.placed", Kind: transport.KindEvent}
	tx, err := s.Pool().Begin(ctx)
	require.NoError(t, err)
	dup, err := s.InboxRecord(ctx, tx, env)
	require.NoError(t, err)
	require.False(t, dup)
	require.NoError(t, tx.Rollback(ctx))
	_, err = s.InboxGet(ctx, env.MessageID)
	require.ErrorIs(t, err, store.ErrNotFound, "an inbox row exists only if its transaction committed")
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
	require.ErrorIs(t, err, store.ErrNotFound)
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

	mark.ReplyKind, mark.ReplyPayload = transport.KindReplySuccess, []byte(`{"ok":true}`)
	require.NoError(t, s.InTx(ctx, func(tx pgx.Tx) error { return s.BarrierUpdate(ctx, tx, mark) }))
	got, err := s.BarrierGet(ctx, nil, sagaID, "reserve", store.BarrierAction)
	require.NoError(t, err)
	require.Equal(t, mark.MessageID, got.MessageID)
	require.Equal(t, transport.KindReplySuccess, got.ReplyKind)
	require.JSONEq(t, `{"ok":true}`, string(got.ReplyPayload))

	comp := mark
	comp.Phase, comp.Outcome = store.BarrierCompensation, store.BarrierApplied
	require.True(t, insert(comp))
	list, err := s.BarrierList(ctx, sagaID)
	require.NoError(t, err)
	require.Len(t, list, 2)

	_, err = s.BarrierGet(ctx, nil, sagaID, "other", store.BarrierAction)
	require.ErrorIs(t, err, store.ErrNotFound)
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
	require.False(t, store.IsConnectionError(nil))
}
