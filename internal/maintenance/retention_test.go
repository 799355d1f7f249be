package maintenance

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/store"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"))
}

// Each table keeps its rows for its own period; unpublished outbox rows are
// never deleted, whatever their age.
func TestPruneRespectsEachRetention(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t, store.LineMessaging)
	ctx := context.Background()
	exec := func(sql string) {
		t.Helper()
		_, err := s.Pool().Exec(ctx, fmt.Sprintf(sql, s.Schema()))
		require.NoError(t, err)
	}
	// 10 days old: past inbox (7d) retention, within barrier (30d) retention.
	exec(`INSERT INTO %q.sagabox_outbox (message_id, ordering_key, kind, type, routing_key, payload, created_at, published_at)
		SELECT gen_random_uuid(), g::text, 'event', 'e', 'e', '{}', now() - interval '10 days', now() - interval '10 days'
		FROM generate_series(1, 25) g`)
	exec(`INSERT INTO %q.sagabox_outbox (message_id, ordering_key, kind, type, routing_key, payload, created_at)
		VALUES (gen_random_uuid(), 'old-unpublished', 'event', 'e', 'e', '{}', now() - interval '60 days')`)
	exec(`INSERT INTO %q.sagabox_inbox (message_id, kind, type, received_at)
		SELECT gen_random_uuid(), 'event', 'e', now() - interval '10 days' FROM generate_series(1, 7) g`)
	exec(`INSERT INTO %q.sagabox_inbox (message_id, kind, type) VALUES (gen_random_uuid(), 'event', 'e')`)
	exec(`INSERT INTO %q.sagabox_barrier (saga_id, step, phase, message_id, outcome, created_at)
		VALUES (gen_random_uuid(), 's', 'action', gen_random_uuid(), 'applied', now() - interval '10 days'),
		       (gen_random_uuid(), 's', 'action', gen_random_uuid(), 'applied', now() - interval '40 days')`)

	r, err := NewRetention(RetentionConfig{Store: s, BatchSize: 10})
	require.NoError(t, err)
	deleted, err := r.Prune(ctx, time.Now())
	require.NoError(t, err)
	require.EqualValues(t, 25, deleted[store.RetentionOutbox], "published rows past 24h, in batches of 10")
	require.EqualValues(t, 7, deleted[store.RetentionInbox])
	require.EqualValues(t, 1, deleted[store.RetentionBarrier], "only the mark past 30 days")

	stats, err := s.OutboxStats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, stats.Backlog, "an unpublished row is never pruned")

	again, err := r.Prune(ctx, time.Now())
	require.NoError(t, err)
	require.Zero(t, again[store.RetentionOutbox]+again[store.RetentionInbox]+again[store.RetentionBarrier])
}
