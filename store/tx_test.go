package store_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/driver"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store"
)

// Deliveries of a group run in subtransactions of one transaction: what a
// committed one did commits with the transaction, what a rolled-back one
// did is gone, and neither costs a round trip of its own: a delivery's
// first statement goes out with its SAVEPOINT (and the previous delivery's
// last statement and RELEASE), the last delivery's with COMMIT.
func TestSubtransactionsOfAGroup(t *testing.T) {
	t.Parallel()
	var rts dbtest.RoundTrips
	pool := dbtest.PoolWith(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = &rts })
	s := dbtest.StoreOnPool(t, pool, store.LineMessaging)
	ctx := context.Background()
	kept, dropped, last := command(uuid.New(), message.KindCommand), command(uuid.New(), message.KindCommand), command(uuid.New(), message.KindCommand)
	applied := driver.DeliveryEnd{Mark: &driver.BarrierMark{Outcome: driver.BarrierApplied, ReplyKind: message.KindReplySuccess, ReplyPayload: []byte(`{}`)}}

	rts.Start()
	tx := s.Begin()
	defer tx.Rollback(ctx)
	for _, env := range []*message.Envelope{kept, dropped, last} {
		sub := tx.Sub()
		d, err := s.BeginDelivery(ctx, sub, env, nil)
		require.NoError(t, err)
		require.True(t, d.Marked)
		if env == dropped {
			sub.Rollback(ctx)
			continue
		}
		end := applied
		end.Reply = reply(env, message.KindReplySuccess, `{}`)
		require.NoError(t, s.FinishDelivery(ctx, sub, env, d, end))
	}
	require.NoError(t, tx.Commit(ctx))
	rts.Stop()

	require.Equal(t, 2, count.n(t, s, `SELECT count(*) FROM %q.sagabox_inbox`), "the rolled-back delivery left no inbox record")
	require.Equal(t, 0, count.n(t, s, `SELECT count(*) FROM %q.sagabox_inbox WHERE message_id = $1`, dropped.MessageID))
	require.Equal(t, 2, count.n(t, s, `SELECT count(*) FROM %q.sagabox_barrier WHERE outcome = 'applied'`), "nor barrier mark")
	require.Equal(t, 2, count.n(t, s, `SELECT count(*) FROM %q.sagabox_outbox`), "nor reply")
	txs := rts.Transactions()
	require.Len(t, txs, 1)
	for _, rt := range txs[0].RoundTrips {
		t.Logf("round trip: %d statements, last %.30q", len(rt.SQL), rt.SQL[len(rt.SQL)-1])
	}
	require.Len(t, txs[0].RoundTrips, 4, "one round trip per delivery and COMMIT")
}

// The last statement of a subtransaction goes out with the next one's
// first: when it fails, the whole transaction fails and commits nothing.
func TestSubtransactionDeferredFailureFailsTheTransaction(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t, store.LineMessaging)
	ctx := context.Background()
	first, second := command(uuid.New(), message.KindCommand), command(uuid.New(), message.KindCommand)
	tx := s.Begin()
	defer tx.Rollback(ctx)
	sub := tx.Sub()
	d, err := s.BeginDelivery(ctx, sub, first, nil)
	require.NoError(t, err)
	bad := reply(first, message.KindReplySuccess, `{}`)
	bad.RoutingKey = "nul\x00byte" // PostgreSQL text cannot hold NUL
	require.NoError(t, s.FinishDelivery(ctx, sub, first, d, driver.DeliveryEnd{Reply: bad}), "the statement waits to go out")
	_, err = s.BeginDelivery(ctx, tx.Sub(), second, nil)
	require.Error(t, err, "the next statement reports the failure")
	require.Error(t, tx.Commit(ctx), "and the transaction cannot commit")
	require.Equal(t, 0, count.n(t, s, `SELECT count(*) FROM %q.sagabox_inbox`), "nothing was committed")
}
