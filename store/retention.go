package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sagabox/sagabox/store/internal/dbsqlc"
)

// RetentionTable names a table that retention prunes.
type RetentionTable string

// The tables retention prunes.
const (
	RetentionOutbox       RetentionTable = "outbox"
	RetentionInbox        RetentionTable = "inbox"
	RetentionInboxAttempt RetentionTable = "inbox_attempt"
	RetentionBarrier      RetentionTable = "barrier"
)

// DeleteBefore deletes at most max rows of table that are older than before
// (published rows of the outbox; received inbox rows; barrier and attempt
// rows), in one short transaction under statement and lock timeouts. It
// returns how many rows it deleted; callers loop while it returns max.
func (s *Store) DeleteBefore(ctx context.Context, table RetentionTable, before time.Time, max int) (int64, error) {
	var n int64
	err := s.InTx(ctx, func(tx pgx.Tx) error {
		if err := s.setLocalTimeouts(ctx, tx); err != nil {
			return err
		}
		db := s.db(tx)
		var err error
		switch table {
		case RetentionOutbox:
			n, err = s.queries.OutboxDeletePublished(ctx, db, &dbsqlc.OutboxDeletePublishedParams{PublishedBefore: before, Max: int32(max)})
		case RetentionInbox:
			n, err = s.queries.InboxDeleteBefore(ctx, db, &dbsqlc.InboxDeleteBeforeParams{ReceivedBefore: before, Max: int32(max)})
		case RetentionInboxAttempt:
			n, err = s.queries.InboxAttemptDeleteBefore(ctx, db, &dbsqlc.InboxAttemptDeleteBeforeParams{UpdatedBefore: before, Max: int32(max)})
		case RetentionBarrier:
			n, err = s.queries.BarrierDeleteBefore(ctx, db, &dbsqlc.BarrierDeleteBeforeParams{CreatedBefore: before, Max: int32(max)})
		default:
			return fmt.Errorf("unknown retention table %q", table)
		}
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("delete old %s rows in schema %q: %w", table, s.schema, err)
	}
	return n, nil
}
