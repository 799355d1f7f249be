package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store/internal/dbsqlc"
)

// InboxRow is a message a receiver has processed.
type InboxRow struct {
	MessageID uuid.UUID
	Kind      message.Kind
	Type      string
	// SagaID is uuid.Nil for a plain event.
	SagaID     uuid.UUID
	Step       string
	ReceivedAt time.Time
	// Duplicates counts the arrivals of the message after it was processed.
	Duplicates int
	// LastDuplicateAt is when the last duplicate arrived; nil when none did.
	LastDuplicateAt *time.Time
}

// InboxRecord records env as received in tx, the transaction that applies
// its effect, so that the message counts as processed if and only if tx
// commits. It reports duplicate = true when the message was processed
// before; it then counts the duplicate (in tx) and the caller must apply
// nothing else. A concurrent delivery of the same message waits for the
// first one's transaction to end.
func (s *Store) InboxRecord(ctx context.Context, tx pgx.Tx, env *message.Envelope) (duplicate bool, err error) {
	if tx == nil {
		return false, errors.New("record inbox: transaction is nil")
	}
	n, err := s.queries.InboxInsert(ctx, s.db(tx), &dbsqlc.InboxInsertParams{
		MessageID: env.MessageID, Kind: string(env.Kind), Type: env.Type, SagaID: env.SagaID, Step: env.Step,
	})
	if err != nil {
		return false, fmt.Errorf("record message %s in inbox of schema %q: %w", env.MessageID, s.schema, err)
	}
	if n == 1 {
		return false, nil
	}
	if _, err := s.queries.InboxCountDuplicate(ctx, s.db(tx), env.MessageID); err != nil {
		return true, fmt.Errorf("count duplicate of message %s in inbox of schema %q: %w", env.MessageID, s.schema, err)
	}
	return true, nil
}

// InboxGet returns the inbox row of message id, or an error wrapping
// message.ErrNotFound.
func (s *Store) InboxGet(ctx context.Context, id uuid.UUID) (InboxRow, error) {
	r, err := s.queries.InboxGet(ctx, s.db(nil), id)
	if errors.Is(err, pgx.ErrNoRows) {
		return InboxRow{}, fmt.Errorf("inbox message %s: %w", id, message.ErrNotFound)
	}
	if err != nil {
		return InboxRow{}, fmt.Errorf("get inbox message %s in schema %q: %w", id, s.schema, err)
	}
	return inboxRow(r), nil
}

func inboxRow(r *dbsqlc.SagaboxInbox) InboxRow {
	return InboxRow{
		MessageID: r.MessageID, Kind: message.Kind(r.Kind), Type: r.Type, SagaID: nullUUID(r.SagaID),
		Step: r.Step, ReceivedAt: r.ReceivedAt, Duplicates: int(r.Duplicates), LastDuplicateAt: r.LastDuplicateAt,
	}
}

func nullUUID(u uuid.NullUUID) uuid.UUID {
	if u.Valid {
		return u.UUID
	}
	return uuid.Nil
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

// InboxStats summarises the inbox; recent is the window of
// RecentlyDuplicated.
func (s *Store) InboxStats(ctx context.Context, recent time.Duration) (InboxStats, error) {
	r, err := s.queries.InboxStats(ctx, s.db(nil), recent.Seconds())
	if err != nil {
		return InboxStats{}, fmt.Errorf("inbox stats of schema %q: %w", s.schema, err)
	}
	return InboxStats{
		Total: r.Total, Duplicates: r.Duplicates, DuplicatedMessages: r.DuplicatedMessages, RecentlyDuplicated: r.RecentlyDuplicated,
	}, nil
}

// InboxDuplicated lists at most max messages that arrived more than once,
// most recently duplicated first.
func (s *Store) InboxDuplicated(ctx context.Context, max int) ([]InboxRow, error) {
	rows, err := s.queries.InboxListDuplicated(ctx, s.db(nil), int32(max))
	if err != nil {
		return nil, fmt.Errorf("list duplicated inbox messages of schema %q: %w", s.schema, err)
	}
	out := make([]InboxRow, len(rows))
	for i, r := range rows {
		out[i] = inboxRow(r)
	}
	return out, nil
}

// InboxAttempt is the record of a message's failed processing attempts.
type InboxAttempt struct {
	MessageID uuid.UUID
	Kind      message.Kind
	Type      string
	SagaID    uuid.UUID
	// Attempts counts the failed processing attempts.
	Attempts int
	// LastError is the error of the last failed attempt, or the reason the
	// message was dead-lettered.
	LastError string
	// DeadLetteredAt is when the message was dead-lettered; nil if it was not.
	DeadLetteredAt *time.Time
	UpdatedAt      time.Time
}

// InboxAttemptRecord counts one failed processing attempt of env, with its
// cause, in a statement of its own (the processing transaction was rolled
// back), and returns the number of failed attempts so far. A cause that is
// not valid UTF-8 or holds NUL bytes is stored with those replaced.
func (s *Store) InboxAttemptRecord(ctx context.Context, env *message.Envelope, cause string) (int, error) {
	n, err := s.queries.InboxAttemptRecord(ctx, s.db(nil), &dbsqlc.InboxAttemptRecordParams{
		MessageID: env.MessageID, Kind: string(env.Kind), Type: env.Type, SagaID: env.SagaID, LastError: storableText(cause),
	})
	if err != nil {
		return 0, fmt.Errorf("record failed attempt of message %s in schema %q: %w", env.MessageID, s.schema, err)
	}
	return int(n), nil
}

// InboxAttemptMarkDeadLettered records, in tx (nil: a statement of its
// own), that env was dead-lettered for reason.
func (s *Store) InboxAttemptMarkDeadLettered(ctx context.Context, tx pgx.Tx, env *message.Envelope, reason string) error {
	if err := s.queries.InboxAttemptMarkDeadLettered(ctx, s.db(tx), &dbsqlc.InboxAttemptMarkDeadLetteredParams{
		MessageID: env.MessageID, Kind: string(env.Kind), Type: env.Type, SagaID: env.SagaID, Reason: storableText(reason),
	}); err != nil {
		return fmt.Errorf("mark message %s dead-lettered in schema %q: %w", env.MessageID, s.schema, err)
	}
	return nil
}

// InboxAttemptGet returns the attempt record of message id, or an error
// wrapping message.ErrNotFound when it never failed.
func (s *Store) InboxAttemptGet(ctx context.Context, id uuid.UUID) (InboxAttempt, error) {
	r, err := s.queries.InboxAttemptGet(ctx, s.db(nil), id)
	if errors.Is(err, pgx.ErrNoRows) {
		return InboxAttempt{}, fmt.Errorf("attempts of message %s: %w", id, message.ErrNotFound)
	}
	if err != nil {
		return InboxAttempt{}, fmt.Errorf("get attempts of message %s in schema %q: %w", id, s.schema, err)
	}
	return inboxAttempt(r), nil
}

// InboxAttemptListOpts filters InboxAttemptList.
type InboxAttemptListOpts struct {
	// DeadLetteredOnly keeps only dead-lettered messages.
	DeadLetteredOnly bool
	// Max is the most rows returned. Defaults to 100.
	Max int
}

// InboxAttemptList lists attempt records, most recently updated first. opts
// may be nil.
func (s *Store) InboxAttemptList(ctx context.Context, opts *InboxAttemptListOpts) ([]InboxAttempt, error) {
	var o InboxAttemptListOpts
	if opts != nil {
		o = *opts
	}
	if o.Max <= 0 {
		o.Max = 100
	}
	rows, err := s.queries.InboxAttemptList(ctx, s.db(nil), &dbsqlc.InboxAttemptListParams{
		DeadLetteredOnly: o.DeadLetteredOnly, Max: int32(o.Max),
	})
	if err != nil {
		return nil, fmt.Errorf("list inbox attempts of schema %q: %w", s.schema, err)
	}
	out := make([]InboxAttempt, len(rows))
	for i, r := range rows {
		out[i] = inboxAttempt(r)
	}
	return out, nil
}

func inboxAttempt(r *dbsqlc.SagaboxInboxAttempt) InboxAttempt {
	return InboxAttempt{
		MessageID: r.MessageID, Kind: message.Kind(r.Kind), Type: r.Type, SagaID: nullUUID(r.SagaID),
		Attempts: int(r.Attempts), LastError: r.LastError, DeadLetteredAt: r.DeadLetteredAt, UpdatedAt: r.UpdatedAt,
	}
}

// BarrierPhase is the phase of a saga step a barrier mark belongs to.
type BarrierPhase string

// The barrier phases.
const (
	BarrierAction       BarrierPhase = "action"
	BarrierCompensation BarrierPhase = "compensation"
)

// BarrierOutcome is what happened to the phase of a step at a participant.
type BarrierOutcome string

// The barrier outcomes.
const (
	// BarrierApplied: the handler ran and its effect committed.
	BarrierApplied BarrierOutcome = "applied"
	// BarrierRejected: the action was rejected (or failed for good); it had
	// no effect.
	BarrierRejected BarrierOutcome = "rejected"
	// BarrierSkipped: a compensation with nothing to undo (the action never
	// ran or was rejected), answered with success.
	BarrierSkipped BarrierOutcome = "skipped"
	// BarrierBlocked: an action mark left by a compensation that came first;
	// the action, should it arrive, is not applied.
	BarrierBlocked BarrierOutcome = "blocked"
)

// BarrierMark is the record of one phase of one saga step at a participant,
// with the reply every later message of that phase gets.
type BarrierMark struct {
	SagaID uuid.UUID
	Step   string
	Phase  BarrierPhase
	// MessageID is the message that left the mark.
	MessageID uuid.UUID
	Outcome   BarrierOutcome
	// ReplyKind and ReplyPayload are the reply sent for the phase.
	ReplyKind    message.Kind
	ReplyPayload []byte
	CreatedAt    time.Time
}

// BarrierInsert leaves mark in tx unless a mark of the same saga, step and
// phase exists; it reports whether it inserted. A concurrent insert of the
// same key waits for the other transaction to end, so an action and its
// compensation racing on one step are serialised.
func (s *Store) BarrierInsert(ctx context.Context, tx pgx.Tx, mark BarrierMark) (inserted bool, err error) {
	if tx == nil {
		return false, errors.New("insert barrier mark: transaction is nil")
	}
	n, err := s.queries.BarrierInsert(ctx, s.db(tx), &dbsqlc.BarrierInsertParams{
		SagaID: mark.SagaID, Step: mark.Step, Phase: string(mark.Phase), MessageID: mark.MessageID,
		Outcome: string(mark.Outcome), ReplyKind: string(mark.ReplyKind), ReplyPayload: mark.ReplyPayload,
	})
	if err != nil {
		return false, fmt.Errorf("insert %s barrier of saga %s step %q in schema %q: %w", mark.Phase, mark.SagaID, mark.Step, s.schema, err)
	}
	return n == 1, nil
}

// BarrierGet returns the mark of (sagaID, step, phase), read in tx (nil: on
// the pool), or an error wrapping message.ErrNotFound.
func (s *Store) BarrierGet(ctx context.Context, tx pgx.Tx, sagaID uuid.UUID, step string, phase BarrierPhase) (BarrierMark, error) {
	r, err := s.queries.BarrierGet(ctx, s.db(tx), &dbsqlc.BarrierGetParams{SagaID: sagaID, Step: step, Phase: string(phase)})
	if errors.Is(err, pgx.ErrNoRows) {
		return BarrierMark{}, fmt.Errorf("%s barrier of saga %s step %q: %w", phase, sagaID, step, message.ErrNotFound)
	}
	if err != nil {
		return BarrierMark{}, fmt.Errorf("get %s barrier of saga %s step %q in schema %q: %w", phase, sagaID, step, s.schema, err)
	}
	return barrierMark(r), nil
}

// BarrierUpdate sets the outcome and reply of an existing mark in tx.
func (s *Store) BarrierUpdate(ctx context.Context, tx pgx.Tx, mark BarrierMark) error {
	n, err := s.queries.BarrierSetOutcome(ctx, s.db(tx), &dbsqlc.BarrierSetOutcomeParams{
		Outcome: string(mark.Outcome), ReplyKind: string(mark.ReplyKind), ReplyPayload: mark.ReplyPayload,
		SagaID: mark.SagaID, Step: mark.Step, Phase: string(mark.Phase),
	})
	if err != nil {
		return fmt.Errorf("update %s barrier of saga %s step %q in schema %q: %w", mark.Phase, mark.SagaID, mark.Step, s.schema, err)
	}
	if n == 0 {
		return fmt.Errorf("update %s barrier of saga %s step %q: %w", mark.Phase, mark.SagaID, mark.Step, message.ErrNotFound)
	}
	return nil
}

// BarrierList returns the marks of one saga, oldest first.
func (s *Store) BarrierList(ctx context.Context, sagaID uuid.UUID) ([]BarrierMark, error) {
	rows, err := s.queries.BarrierListBySaga(ctx, s.db(nil), sagaID)
	if err != nil {
		return nil, fmt.Errorf("list barrier of saga %s in schema %q: %w", sagaID, s.schema, err)
	}
	out := make([]BarrierMark, len(rows))
	for i, r := range rows {
		out[i] = barrierMark(r)
	}
	return out, nil
}

func barrierMark(r *dbsqlc.SagaboxBarrier) BarrierMark {
	return BarrierMark{
		SagaID: r.SagaID, Step: r.Step, Phase: BarrierPhase(r.Phase), MessageID: r.MessageID,
		Outcome: BarrierOutcome(r.Outcome), ReplyKind: message.Kind(r.ReplyKind), ReplyPayload: r.ReplyPayload,
		CreatedAt: r.CreatedAt,
	}
}

// storableText returns s as Postgres text can hold it: valid UTF-8 without
// NUL bytes. Error texts come from handlers and from the messages they
// handle, and a failure that cannot be recorded could never be counted.
func storableText(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\\x00")
}
