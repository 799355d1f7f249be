package store

import (
	"context"
	"fmt"
	"time"

	"github.com/sagabox/sagabox/store/driver"

	"github.com/sagabox/sagabox/store/internal/dbsqlc"
)

// RetentionPrune deletes the rows r selects in small batches, each its own
// transaction of one round trip under the statement and lock timeouts of
// background work, until a batch comes back short or ctx is done.
func (s *executor) RetentionPrune(ctx context.Context, r driver.Retention) (driver.Pruned, error) {
	var p driver.Pruned
	if r.Batch <= 0 {
		return p, fmt.Errorf("prune schema %q: batch size %d is not positive", s.schema, r.Batch)
	}
	max := int32(r.Batch)
	tables := []struct {
		name   string
		cutoff time.Time
		count  *int64
		del    func(ctx context.Context, db dbsqlc.DBTX) (int64, error)
	}{
		{"outbox", r.Outbox, &p.Outbox, func(ctx context.Context, db dbsqlc.DBTX) (int64, error) {
			return s.queries.OutboxDeletePublished(ctx, db, &dbsqlc.OutboxDeletePublishedParams{PublishedBefore: r.Outbox, Max: max})
		}},
		{"inbox", r.Inbox, &p.Inbox, func(ctx context.Context, db dbsqlc.DBTX) (int64, error) {
			return s.queries.InboxDeleteBefore(ctx, db, &dbsqlc.InboxDeleteBeforeParams{ReceivedBefore: r.Inbox, Max: max})
		}},
		{"inbox attempts", r.Inbox, &p.InboxAttempts, func(ctx context.Context, db dbsqlc.DBTX) (int64, error) {
			return s.queries.InboxAttemptDeleteBefore(ctx, db, &dbsqlc.InboxAttemptDeleteBeforeParams{UpdatedBefore: r.Inbox, Max: max})
		}},
		{"barrier", r.Barrier, &p.Barrier, func(ctx context.Context, db dbsqlc.DBTX) (int64, error) {
			return s.queries.BarrierDeleteBefore(ctx, db, &dbsqlc.BarrierDeleteBeforeParams{CreatedBefore: r.Barrier, Max: max})
		}},
		{"sagas", r.Sagas, &p.Sagas, func(ctx context.Context, db dbsqlc.DBTX) (int64, error) {
			return s.queries.SagaDeleteFinishedBefore(ctx, db, &dbsqlc.SagaDeleteFinishedBeforeParams{FinishedBefore: r.Sagas, Max: max})
		}},
	}
	for _, tb := range tables {
		if tb.cutoff.IsZero() {
			continue
		}
		for ctx.Err() == nil {
			t := s.Begin(nil)
			txOf(t).queue(backgroundTimeouts)
			n, err := tb.del(ctx, txOf(t).exec(ctx, true))
			t.Rollback(ctx)
			if err != nil {
				return p, fmt.Errorf("delete old %s rows in schema %q: %w", tb.name, s.schema, err)
			}
			*tb.count += n
			if n < int64(r.Batch) {
				break
			}
		}
	}
	return p, nil
}
