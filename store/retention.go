package store

import (
	"context"
	"fmt"
	"time"

	"github.com/sagabox/sagabox/store/internal/dbsqlc"
)

// Retention says which processed rows Prune deletes: those older than each
// cutoff (a zero cutoff keeps the table as it is), at most Batch rows per
// statement.
type Retention struct {
	// Outbox: published rows published before it.
	Outbox time.Time
	// Inbox: inbox rows received before it, and attempt rows last updated
	// before it.
	Inbox time.Time
	// Barrier: barrier marks left before it.
	Barrier time.Time
	// Sagas: completed and compensated sagas (with their history) finished
	// before it.
	Sagas time.Time
	// Batch is the most rows one statement deletes.
	Batch int
}

// Pruned counts the rows one Prune deleted, by table.
type Pruned struct {
	Outbox, Inbox, InboxAttempts, Barrier, Sagas int64
}

// Total is the number of rows deleted.
func (p Pruned) Total() int64 { return p.Outbox + p.Inbox + p.InboxAttempts + p.Barrier + p.Sagas }

// Prune deletes the rows r selects in small batches, each its own
// transaction of one round trip under the statement and lock timeouts of
// background work, until a batch comes back short or ctx is done.
func (s *Store) Prune(ctx context.Context, r Retention) (Pruned, error) {
	var p Pruned
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
			t := s.Begin()
			t.queue(backgroundTimeouts)
			n, err := tb.del(ctx, t.exec(ctx, true))
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
