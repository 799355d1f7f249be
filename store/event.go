package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sagabox/sagabox/store/driver"
	"github.com/sagabox/sagabox/store/internal/dbsqlc"
)

// eventDB returns the executor of an outside-event statement: in t, one of
// the engine's transactions, or else in tx, a caller's.
func (s *executor) eventDB(ctx context.Context, t driver.Tx, tx pgx.Tx) (dbsqlc.DBTX, error) {
	switch {
	case t != nil:
		return txOf(t).exec(ctx, false), nil
	case tx != nil:
		return s.db(tx), nil
	}
	return nil, errors.New("outside event: no transaction")
}

// RecordEvent records ev in t or else tx, the sender's transaction, and
// reports whether it is new (false: its saga has an event with its id
// already).
func (s *executor) RecordEvent(ctx context.Context, t driver.Tx, tx pgx.Tx, ev *driver.OutsideEvent) (bool, error) {
	db, err := s.eventDB(ctx, t, tx)
	if err != nil {
		return false, err
	}
	n, err := s.queries.EventRecord(ctx, db, &dbsqlc.EventRecordParams{
		SagaID: ev.SagaID, EventID: ev.EventID, Name: ev.Name, Payload: ev.Payload, ReceivedAt: ev.ReceivedAt,
	})
	if err != nil {
		return false, fmt.Errorf("record event %q for saga %s: %w", ev.EventID, ev.SagaID, err)
	}
	return n == 1, nil
}

// PendingEvent returns the oldest pending event called name of saga id, in
// t or else tx; nil if there is none.
func (s *executor) PendingEvent(ctx context.Context, t driver.Tx, tx pgx.Tx, id uuid.UUID, name string) (*driver.OutsideEvent, error) {
	db, err := s.eventDB(ctx, t, tx)
	if err != nil {
		return nil, err
	}
	rows, err := s.queries.EventPending(ctx, db, &dbsqlc.EventPendingParams{SagaID: id, Name: name})
	if err != nil {
		return nil, fmt.Errorf("find pending event %q of saga %s: %w", name, id, err)
	}
	if len(rows) == 0 {
		return nil, nil
	}
	r := rows[0]
	return &driver.OutsideEvent{SagaID: id, EventID: r.EventID, Name: r.Name, Payload: r.Payload, ReceivedAt: r.ReceivedAt}, nil
}

// SettleEvent marks the event eventID of saga id consumed or ignored
// (status), in t or else tx.
func (s *executor) SettleEvent(ctx context.Context, t driver.Tx, tx pgx.Tx, id uuid.UUID, eventID, status, detail string, now time.Time) error {
	db, err := s.eventDB(ctx, t, tx)
	if err != nil {
		return err
	}
	err = s.queries.EventSettle(ctx, db, &dbsqlc.EventSettleParams{
		SagaID: id, EventID: eventID, Status: status, Detail: storableText(detail), SettledAt: now,
	})
	if err != nil {
		return fmt.Errorf("settle event %q of saga %s: %w", eventID, id, err)
	}
	return nil
}
