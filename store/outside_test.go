package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/store/driver"
)

// The statements of an outside handler's delivery: the first transaction
// commits the inbox entry and the mark "started"; a redelivery of the
// message is resumed (not a duplicate), counting an attempt; the second
// transaction claims the entry once (a second claim is a duplicate); a
// message recorded "done" is a duplicate. Retention keeps "started"
// entries, whatever their age.
func TestOutsideDeliveryStatements(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := dbtest.Store(t, store.LineMessaging)
	env := command(uuid.New(), message.KindCommand)
	state := func() (st string, attempt int) {
		t.Helper()
		require.NoError(t, s.Pool.QueryRow(ctx, fmt.Sprintf(`SELECT state, attempt FROM %q.sagabox_inbox WHERE message_id = $1`, s.Schema()), env.MessageID).Scan(&st, &attempt))
		return st, attempt
	}
	begin := func() *driver.Delivery {
		t.Helper()
		tx := s.Begin(nil)
		defer tx.Rollback(ctx)
		d, err := s.DeliveryBeginOutside(ctx, tx, env, nil)
		require.NoError(t, err)
		dbtest.Commit(t, tx)
		return d
	}

	d := begin()
	require.True(t, d.Marked)
	require.False(t, d.Resumed)
	require.Equal(t, 1, d.Attempt)
	st, attempt := state()
	require.Equal(t, "started", st)
	require.Equal(t, 1, attempt)

	d = begin()
	require.False(t, d.Duplicate, "a started entry is no duplicate")
	require.True(t, d.Resumed)
	require.Equal(t, 2, d.Attempt)

	_, err := s.Pool.Exec(ctx, fmt.Sprintf(`UPDATE %q.sagabox_inbox SET received_at = now() - interval '30 days'`, s.Schema()))
	require.NoError(t, err)
	p, err := s.RetentionPrune(ctx, driver.Retention{Inbox: time.Now(), Batch: 10})
	require.NoError(t, err)
	require.Zero(t, p.Inbox, "a started entry is kept")

	tx := s.Begin(nil)
	r, err := s.DeliveryResume(ctx, tx, env)
	require.NoError(t, err)
	require.False(t, r.Duplicate)
	require.NoError(t, s.DeliveryFinish(ctx, tx, env, r, driver.DeliveryEnd{
		Mark: &driver.BarrierMark{Outcome: driver.BarrierApplied, ReplyKind: message.KindReplySuccess, ReplyPayload: []byte(`{}`)},
	}))
	dbtest.Commit(t, tx)
	st, _ = state()
	require.Equal(t, "done", st)

	again := s.Begin(nil)
	defer again.Rollback(ctx)
	r, err = s.DeliveryResume(ctx, again, env)
	require.NoError(t, err)
	require.True(t, r.Duplicate, "the entry is claimed once")
	again.Rollback(ctx)

	d = begin()
	require.True(t, d.Duplicate, "a done entry is a duplicate")
	require.Equal(t, 1, count.n(t, s, `SELECT duplicates FROM %q.sagabox_inbox`))
	require.Equal(t, 1, count.n(t, s, `SELECT count(*) FROM %q.sagabox_barrier WHERE outcome = 'applied'`))
}
