package store

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/google/uuid"

	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store/driver"
	"github.com/sagabox/sagabox/store/internal/dbsqlc"
)

// The operations of a schema for operators and their tools (the sagabox
// CLI, the console, dashboards built in Go): what its outbox and inbox
// hold, the rows and messages given up on, the barrier marks a saga left,
// and the log relay's set-up. Operator actions on sagas are the
// orchestrator's (orchestrator.Client); the SQL views (sagabox_*_v) show
// the same from SQL.

// OutboxStats is the publishing state of an outbox.
type OutboxStats = driver.OutboxStats

// Attempt is the record of a message's failed processing attempts.
type Attempt = driver.Attempt

// LogStatus is the state of log mode's set-up and slot in the database.
type LogStatus = driver.LogStatus

// OutboxStats returns the backlog of the schema's outbox.
func (s *Store) OutboxStats(ctx context.Context) (OutboxStats, error) {
	return (&executor{s}).OutboxStats(ctx)
}

// SagaCount is the number of sagas of one type (in one status, where it
// applies).
type SagaCount = driver.SagaCount

// OutboxTypeBacklog is the unpublished commands (or compensations) of one
// type in an outbox.
type OutboxTypeBacklog = driver.OutboxTypeBacklog

// UnpublishedOverdue counts, by saga type, the running or compensating sagas
// that have waited longer than grace for a command or compensation still
// unpublished, past their deadline or without one: no deadline fires while
// a saga's message is unpublished, so they wait for it (for ever, unless the
// step has a schedule-to-start timeout). The sagabox.sagas.unpublished_overdue
// gauge reports the same.
func (s *Store) UnpublishedOverdue(ctx context.Context, grace time.Duration) ([]SagaCount, error) {
	return (&executor{s}).SagaCountUnpublishedOverdue(ctx, time.Now().Add(-grace))
}

// OutboxUnpublishedByType returns the commands and compensations waiting in
// the schema's outbox, unpublished, by type, most first, at most max types:
// a type no queue takes shows here with the relay's last error.
func (s *Store) OutboxUnpublishedByType(ctx context.Context, max int) ([]OutboxTypeBacklog, error) {
	return (&executor{s}).OutboxUnpublishedByType(ctx, max)
}

// InboxStats is a summary of an inbox.
type InboxStats struct {
	// Total is the number of processed messages still kept.
	Total int64
	// Duplicates is the number of duplicate arrivals, summed over messages.
	Duplicates int64
	// DuplicatedMessages is the number of messages that arrived more than once.
	DuplicatedMessages int64
	// RecentlyDuplicated is the number of messages whose last duplicate
	// arrived within the window passed to InboxStats.
	RecentlyDuplicated int64
}

// InboxStats summarises the schema's inbox; recent is the window of
// InboxStats.RecentlyDuplicated.
func (s *Store) InboxStats(ctx context.Context, recent time.Duration) (InboxStats, error) {
	db, err := s.pooled()
	if err != nil {
		return InboxStats{}, err
	}
	r, err := s.queries.InboxStats(ctx, db, recent.Seconds())
	if err != nil {
		return InboxStats{}, fmt.Errorf("inbox stats of schema %q: %w", s.schema, err)
	}
	return InboxStats{
		Total: r.Total, Duplicates: r.Duplicates, DuplicatedMessages: r.DuplicatedMessages, RecentlyDuplicated: r.RecentlyDuplicated,
	}, nil
}

// DeadRow is an outbox row the relay gave up on (a reply or an event no
// queue takes): set aside until an operator retries or deletes it.
type DeadRow struct {
	// ID is the row's position in write order.
	ID int64
	// Message is the message, exactly as written.
	Message message.Message
	// PublishAttempts counts the times the relay published it.
	PublishAttempts int
	// Reason is why it was given up on.
	Reason string
	// DeadAt is when.
	DeadAt time.Time
}

// endOfTime is the position after every row of a list paged by time, most
// recent first: its first page starts there.
var endOfTime = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)

// DeadRows lists up to max rows the relay gave up on, most recent first. A
// non-nil after is the last row of the previous page (its DeadAt and ID are
// read): the list goes on after it.
func (s *Store) DeadRows(ctx context.Context, after *DeadRow, max int) ([]DeadRow, error) {
	db, err := s.pooled()
	if err != nil {
		return nil, err
	}
	p := &dbsqlc.OutboxDeadListParams{AfterDeadAt: endOfTime, AfterID: math.MaxInt64, Max: int32(max)}
	if after != nil {
		p.AfterID, p.AfterDeadAt = after.ID, after.DeadAt
	}
	rows, err := s.queries.OutboxDeadList(ctx, db, p)
	if err != nil {
		return nil, fmt.Errorf("list dead outbox rows in schema %q: %w", s.schema, err)
	}
	out := make([]DeadRow, len(rows))
	for i, r := range rows {
		out[i] = DeadRow{ID: r.ID, Message: outboxMessage(r), PublishAttempts: int(r.PublishAttempts), Reason: r.LastError}
		if r.DeadAt != nil {
			out[i].DeadAt = *r.DeadAt
		}
	}
	return out, nil
}

// RetryDeadRows makes the dead rows ids unpublished again, their attempts
// reset, for the relay to publish, and returns how many it found.
func (s *Store) RetryDeadRows(ctx context.Context, ids []int64) (int64, error) {
	db, err := s.pooled()
	if err != nil {
		return 0, err
	}
	n, err := s.queries.OutboxDeadRetry(ctx, db, nonNil(ids))
	if err != nil {
		return 0, fmt.Errorf("retry dead outbox rows in schema %q: %w", s.schema, err)
	}
	return n, nil
}

// DeleteDeadRows deletes the dead rows ids and returns how many it found.
func (s *Store) DeleteDeadRows(ctx context.Context, ids []int64) (int64, error) {
	db, err := s.pooled()
	if err != nil {
		return 0, err
	}
	n, err := s.queries.OutboxDeadDelete(ctx, db, nonNil(ids))
	if err != nil {
		return 0, fmt.Errorf("delete dead outbox rows in schema %q: %w", s.schema, err)
	}
	return n, nil
}

// Attempts lists up to max records of messages whose processing failed,
// most recently updated first; only those of dead-lettered messages with
// deadLetteredOnly. A non-nil after is the last record of the previous
// page (its UpdatedAt and MessageID are read): the list goes on after it.
func (s *Store) Attempts(ctx context.Context, deadLetteredOnly bool, after *Attempt, max int) ([]Attempt, error) {
	db, err := s.pooled()
	if err != nil {
		return nil, err
	}
	p := &dbsqlc.InboxAttemptListParams{DeadLetteredOnly: deadLetteredOnly, AfterUpdatedAt: endOfTime, AfterMessageID: uuid.Max, Max: int32(max)}
	if after != nil {
		p.AfterUpdatedAt, p.AfterMessageID = after.UpdatedAt, after.MessageID
	}
	rows, err := s.queries.InboxAttemptList(ctx, db, p)
	if err != nil {
		return nil, fmt.Errorf("list inbox attempts of schema %q: %w", s.schema, err)
	}
	out := make([]Attempt, len(rows))
	for i, r := range rows {
		out[i] = attempt(r)
	}
	return out, nil
}

// BarrierRecord is one barrier mark a participant left for a saga step: what
// happened to the step's action or compensation here, and the reply every
// later message of that phase gets.
type BarrierRecord struct {
	SagaID uuid.UUID
	// Run is the saga's run (message.Envelope.Run) the mark belongs to.
	Run       int
	Step      string
	Phase     message.Phase
	MessageID uuid.UUID
	Outcome   driver.BarrierOutcome
	ReplyKind message.Kind
	CreatedAt time.Time
}

// BarrierMarks returns the barrier marks saga id left in the schema, in the
// order they were left.
func (s *Store) BarrierMarks(ctx context.Context, id uuid.UUID) ([]BarrierRecord, error) {
	db, err := s.pooled()
	if err != nil {
		return nil, err
	}
	rows, err := s.queries.BarrierListBySaga(ctx, db, id)
	if err != nil {
		return nil, fmt.Errorf("list barrier marks of saga %s in schema %q: %w", id, s.schema, err)
	}
	out := make([]BarrierRecord, len(rows))
	for i, r := range rows {
		step, run := splitBarrierStep(r.Step)
		out[i] = BarrierRecord{
			SagaID: r.SagaID, Run: run, Step: step, Phase: message.Phase(r.Phase), MessageID: r.MessageID,
			Outcome: driver.BarrierOutcome(r.Outcome), ReplyKind: message.Kind(r.ReplyKind), CreatedAt: r.CreatedAt,
		}
	}
	return out, nil
}

// OutboxLogNames names the replication slot and the publication that a
// relay in log mode reads. Empty fields stand for the defaults of the
// schema: sagabox_<schema> (cut to PostgreSQL's 63 characters), the names
// the clients' relays derive when their Relay config names none.
type OutboxLogNames struct {
	Slot, Publication string
}

// DefaultOutboxLogNames returns the replication slot and the publication
// of schema's outbox in log mode when none are named: both
// sagabox_<schema>, cut to PostgreSQL's 63 characters.
func DefaultOutboxLogNames(schema string) (slot, publication string) { return driver.LogNames(schema) }

// resolve returns n with its empty fields set to the defaults of schema.
func (n OutboxLogNames) resolve(schema string) (slot, publication string) {
	slot, publication = driver.LogNames(schema)
	if n.Slot != "" {
		slot = n.Slot
	}
	if n.Publication != "" {
		publication = n.Publication
	}
	return slot, publication
}

// SetupOutboxLog creates, unless they exist, the publication of the
// schema's outbox inserts and the logical replication slot that a relay in
// log mode reads (names, empty for the defaults), as `sagabox relay
// setup-log` does, and reports whether it created the slot. The server
// needs wal_level = logical.
func (s *Store) SetupOutboxLog(ctx context.Context, names OutboxLogNames) (bool, error) {
	slot, pub := names.resolve(s.schema)
	return (&executor{s}).OutboxLogSetup(ctx, slot, pub)
}

// DropOutboxLog drops the slot and publication SetupOutboxLog creates, as
// `sagabox relay drop-log` does; it refuses while a relay reads the slot.
func (s *Store) DropOutboxLog(ctx context.Context, names OutboxLogNames) error {
	slot, pub := names.resolve(s.schema)
	return (&executor{s}).outboxLogDrop(ctx, slot, pub)
}

// OutboxLogStatus returns the state of the log mode's set-up and slot
// (names, empty for the defaults).
func (s *Store) OutboxLogStatus(ctx context.Context, names OutboxLogNames) (LogStatus, error) {
	slot, pub := names.resolve(s.schema)
	return (&executor{s}).OutboxLogStatus(ctx, slot, pub)
}
