package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/sagabox/sagabox/store/driver"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store/internal/dbsqlc"
)

// AttemptRecord counts one failed processing attempt of env, with its cause,
// in a statement of its own (the processing transaction was rolled back),
// and returns the number of failed attempts so far. A cause that is not
// valid UTF-8 or holds NUL bytes is stored with those replaced.
func (s *executor) AttemptRecord(ctx context.Context, env *message.Envelope, cause string) (int, error) {
	db, err := s.pooled()
	if err != nil {
		return 0, err
	}
	n, err := s.queries.InboxAttemptRecord(ctx, db, &dbsqlc.InboxAttemptRecordParams{
		MessageID: env.MessageID, Kind: string(env.Kind), Type: env.Type, SagaID: env.SagaID, LastError: storableText(cause),
	})
	if err != nil {
		return 0, fmt.Errorf("record failed attempt of message %s in schema %q: %w", env.MessageID, s.schema, err)
	}
	return int(n), nil
}

// AttemptMarkDeadLettered records that env was dead-lettered for reason: in t
// (with the rest of the delivery that gives it up), or on its own when t is
// nil.
func (s *executor) AttemptMarkDeadLettered(ctx context.Context, t driver.Tx, env *message.Envelope, reason string) error {
	var db dbsqlc.DBTX
	if t != nil {
		db = txOf(t).exec(ctx, false)
	} else {
		var err error
		if db, err = s.pooled(); err != nil {
			return err
		}
	}
	if err := s.queries.InboxAttemptMarkDeadLettered(ctx, db, &dbsqlc.InboxAttemptMarkDeadLetteredParams{
		MessageID: env.MessageID, Kind: string(env.Kind), Type: env.Type, SagaID: env.SagaID, Reason: storableText(reason),
	}); err != nil {
		return fmt.Errorf("mark message %s dead-lettered in schema %q: %w", env.MessageID, s.schema, err)
	}
	return nil
}

// AttemptGet returns the attempt record of message id, or an error wrapping
// message.ErrNotFound when it never failed.
func (s *executor) AttemptGet(ctx context.Context, id uuid.UUID) (driver.Attempt, error) {
	db, err := s.pooled()
	if err != nil {
		return driver.Attempt{}, err
	}
	r, err := s.queries.InboxAttemptGet(ctx, db, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return driver.Attempt{}, fmt.Errorf("attempts of message %s: %w", id, message.ErrNotFound)
	}
	if err != nil {
		return driver.Attempt{}, fmt.Errorf("get attempts of message %s in schema %q: %w", id, s.schema, err)
	}
	return attempt(r), nil
}

func attempt(r *dbsqlc.SagaboxInboxAttempt) driver.Attempt {
	a := driver.Attempt{
		MessageID: r.MessageID, Kind: message.Kind(r.Kind), Type: r.Type, SagaID: nullUUID(r.SagaID),
		Attempts: int(r.Attempts), LastError: r.LastError, UpdatedAt: r.UpdatedAt,
	}
	if r.DeadLetteredAt != nil {
		a.DeadLetteredAt = *r.DeadLetteredAt
	}
	return a
}
