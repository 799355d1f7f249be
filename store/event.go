package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/sagabox/sagabox/store/driver"
	"github.com/sagabox/sagabox/store/internal/dbsqlc"
)

// eventDB returns the executor of an outside-event statement in in: one of
// the engine's transactions, or else a caller's.
func (s *executor) eventDB(ctx context.Context, in driver.In) (dbsqlc.DBTX, error) {
	switch {
	case in.T != nil:
		return txOf(in.T).exec(ctx, false), nil
	case in.Caller != nil:
		return s.db(in.Caller), nil
	}
	return nil, errors.New("outside event: no transaction")
}

// EventRecord records ev in t or else tx, the sender's transaction, and
// reports whether it is new (false: its saga has an event with its id
// already).
func (s *executor) EventRecord(ctx context.Context, in driver.In, ev *driver.OutsideEvent) (bool, error) {
	db, err := s.eventDB(ctx, in)
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

// EventPending returns the oldest pending event called name of saga id, in
// t or else tx; nil if there is none.
func (s *executor) EventPending(ctx context.Context, in driver.In, id uuid.UUID, name string) (*driver.OutsideEvent, error) {
	db, err := s.eventDB(ctx, in)
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

// EventSettle records, in in, what became of an event: consumed or
// ignored.
func (s *executor) EventSettle(ctx context.Context, in driver.In, e driver.EventSettlement) error {
	db, err := s.eventDB(ctx, in)
	if err != nil {
		return err
	}
	err = s.queries.EventSettle(ctx, db, &dbsqlc.EventSettleParams{
		SagaID: e.SagaID, EventID: e.EventID, Status: e.Status, Detail: storableText(e.Detail), SettledAt: e.At,
	})
	if err != nil {
		return fmt.Errorf("settle event %q of saga %s: %w", e.EventID, e.SagaID, err)
	}
	return nil
}
