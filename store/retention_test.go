package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/store/driver"
)

// Each table keeps its rows for its own period; unpublished outbox rows and
// unfinished sagas are never deleted, whatever their age.
func TestPruneRespectsEachRetention(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t)
	ctx := context.Background()
	exec := func(sql string) {
		t.Helper()
		_, err := s.Pool.Exec(ctx, fmt.Sprintf(sql, s.Schema()))
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
	exec(`INSERT INTO %q.sagabox_saga (id, saga_type, version, status, data, steps, finished_at)
		VALUES (gen_random_uuid(), 'x', 1, 'completed', '{}', '[]', now() - interval '40 days'),
		       (gen_random_uuid(), 'x', 1, 'failed', '{}', '[]', NULL)`)

	now := time.Now()
	r := driver.Retention{
		Outbox: now.Add(-24 * time.Hour), Inbox: now.Add(-7 * 24 * time.Hour), Barrier: now.Add(-30 * 24 * time.Hour),
		Sagas: now.Add(-30 * 24 * time.Hour), Batch: 10,
	}
	p, err := s.RetentionPrune(ctx, r)
	require.NoError(t, err)
	require.EqualValues(t, 25, p.Outbox, "published rows past 24h, in batches of 10")
	require.EqualValues(t, 7, p.Inbox)
	require.EqualValues(t, 1, p.Barrier, "only the mark past 30 days")
	require.EqualValues(t, 1, p.Sagas, "the finished saga; the failed one waits for an operator")

	stats, err := s.OutboxStats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, stats.Backlog, "an unpublished row is never pruned")

	again, err := s.RetentionPrune(ctx, r)
	require.NoError(t, err)
	require.Zero(t, again.Total())

	none, err := s.RetentionPrune(ctx, driver.Retention{Batch: 10})
	require.NoError(t, err)
	require.Zero(t, none.Total(), "a zero cutoff keeps a table as it is")
}
