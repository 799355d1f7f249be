package store

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store/internal/dbsqlc"
)

// OutboxRow is a claimed outbox row: the message and its publishing state.
type OutboxRow struct {
	// ID is the row's position in write order.
	ID int64
	// Message is the message to publish, exactly as written.
	Message message.Message
	// PublishAttempts counts claims of the row, this one included.
	PublishAttempts int
}

// OutboxWrite inserts msgs into the outbox in tx, the caller's transaction, so
// they are published if and only if tx commits. It completes and validates
// each message (message.Message.Prepare) and modifies msgs in place, so the
// caller learns the ids.
func (s *Store) OutboxWrite(ctx context.Context, tx pgx.Tx, msgs []message.Message) error {
	if tx == nil {
		return fmt.Errorf("write outbox: transaction is nil")
	}
	if len(msgs) == 0 {
		return nil
	}
	n := len(msgs)
	p := &dbsqlc.OutboxInsertBatchParams{
		MessageID: make([]uuid.UUID, n), OrderingKey: make([]string, n), Kind: make([]string, n),
		Type: make([]string, n), RoutingKey: make([]string, n), SagaID: make([]uuid.UUID, n),
		SagaType: make([]string, n), Step: make([]string, n), StepIndex: make([]int32, n),
		Attempt: make([]int32, n), ReplyTo: make([]string, n), CorrelationID: make([]string, n),
		Traceparent: make([]string, n), Tracestate: make([]string, n), Headers: make([][]byte, n),
		Payload: make([][]byte, n), CreatedAt: make([]time.Time, n),
	}
	now := time.Now().UTC()
	for i := range msgs {
		m := &msgs[i]
		if err := m.Prepare(now); err != nil {
			return fmt.Errorf("write outbox: message %d (type %q): %w", i, m.Type, err)
		}
		headers, err := json.Marshal(m.Headers)
		if err != nil {
			return fmt.Errorf("write outbox: encode headers of message %s: %w", m.MessageID, err)
		}
		if m.Headers == nil {
			headers = []byte("{}")
		}
		p.MessageID[i] = m.MessageID
		p.OrderingKey[i] = m.OrderingKey
		p.Kind[i] = string(m.Kind)
		p.Type[i] = m.Type
		p.RoutingKey[i] = m.RoutingKey
		p.SagaID[i] = m.SagaID
		p.SagaType[i] = m.SagaType
		p.Step[i] = m.Step
		p.StepIndex[i] = int32(m.StepIndex)
		p.Attempt[i] = int32(m.Attempt)
		p.ReplyTo[i] = m.ReplyTo
		p.CorrelationID[i] = m.CorrelationID
		p.Traceparent[i] = m.TraceParent
		p.Tracestate[i] = m.TraceState
		p.Headers[i] = headers
		p.Payload[i] = m.Payload
		p.CreatedAt[i] = m.CreatedAt
	}
	if _, err := s.queries.OutboxInsertBatch(ctx, s.db(tx), p); err != nil {
		return fmt.Errorf("write outbox: insert %d messages into schema %q: %w", n, s.schema, err)
	}
	return nil
}

// OutboxClaimOpts tunes OutboxClaim.
type OutboxClaimOpts struct {
	// Max is the most rows to claim.
	Max int
	// Lease is how long the claim holds; past it another relay may claim the
	// rows again.
	Lease time.Duration
	// ClaimedBy names the claimer, for inspection.
	ClaimedBy string
}

// OutboxClaim claims unpublished rows and returns them in write order. The
// claim is one statement, committed at once. Rows locked or leased by another
// relay are skipped; rows whose ordering key has an earlier unpublished row
// outside this claim are left for later, so one key's rows are never
// published out of order by two relays.
func (s *Store) OutboxClaim(ctx context.Context, opts OutboxClaimOpts) ([]OutboxRow, error) {
	// One statement in autocommit: the claim cannot wait on a lock (SKIP
	// LOCKED) and needs no BEGIN/COMMIT round trips on the hot path.
	rows, err := s.queries.OutboxClaim(ctx, s.db(nil), &dbsqlc.OutboxClaimParams{
		LeaseSeconds: opts.Lease.Seconds(),
		ClaimedBy:    opts.ClaimedBy,
		Max:          int32(opts.Max),
	})
	if err != nil {
		return nil, fmt.Errorf("claim outbox batch in schema %q: %w", s.schema, err)
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].ID < rows[j].ID })
	out := make([]OutboxRow, len(rows))
	for i, r := range rows {
		out[i] = OutboxRow{ID: r.ID, Message: outboxMessage(r), PublishAttempts: int(r.PublishAttempts)}
	}
	return out, nil
}

func outboxMessage(r *dbsqlc.SagaboxOutbox) message.Message {
	var headers map[string]string
	if len(r.Headers) > 0 && string(r.Headers) != "{}" {
		_ = json.Unmarshal(r.Headers, &headers) // written by OutboxWrite from a map[string]string
	}
	sagaID := uuid.Nil
	if r.SagaID.Valid {
		sagaID = r.SagaID.UUID
	}
	return message.Message{
		Envelope: message.Envelope{
			Version:       message.Version,
			MessageID:     r.MessageID,
			Type:          r.Type,
			Kind:          message.Kind(r.Kind),
			RoutingKey:    r.RoutingKey,
			SagaID:        sagaID,
			SagaType:      r.SagaType,
			Step:          r.Step,
			StepIndex:     int(r.StepIndex),
			Attempt:       int(r.Attempt),
			ReplyTo:       r.ReplyTo,
			CorrelationID: r.CorrelationID,
			CreatedAt:     r.CreatedAt,
			TraceParent:   r.Traceparent,
			TraceState:    r.Tracestate,
			OrderingKey:   r.OrderingKey,
			Headers:       headers,
		},
		Payload: r.Payload,
	}
}

// OutboxMarkPublished records that the rows ids were confirmed by the broker.
func (s *Store) OutboxMarkPublished(ctx context.Context, ids []int64) error {
	if len(ids) == 0 {
		return nil
	}
	if _, err := s.queries.OutboxMarkPublished(ctx, s.db(nil), ids); err != nil {
		return fmt.Errorf("mark %d outbox rows published in schema %q: %w", len(ids), s.schema, err)
	}
	return nil
}

// OutboxRelease gives claimed rows back after a failed publish. They can be
// claimed again after retryAfter.
func (s *Store) OutboxRelease(ctx context.Context, ids []int64, retryAfter time.Duration, cause error) error {
	if len(ids) == 0 {
		return nil
	}
	msg := ""
	if cause != nil {
		msg = cause.Error()
	}
	if _, err := s.queries.OutboxRelease(ctx, s.db(nil), &dbsqlc.OutboxReleaseParams{
		ID: ids, RetryAfterSeconds: retryAfter.Seconds(), LastError: msg,
	}); err != nil {
		return fmt.Errorf("release %d outbox rows in schema %q: %w", len(ids), s.schema, err)
	}
	return nil
}

// OutboxStats is the publishing state of an outbox.
type OutboxStats struct {
	// Backlog is the number of unpublished rows.
	Backlog int64
	// OldestAge is the age of the oldest unpublished row; zero when none.
	OldestAge time.Duration
	// Retrying counts unpublished rows that were claimed at least once.
	Retrying int64
}

// OutboxStats returns the backlog of the outbox.
func (s *Store) OutboxStats(ctx context.Context) (OutboxStats, error) {
	r, err := s.queries.OutboxStats(ctx, s.db(nil))
	if err != nil {
		return OutboxStats{}, fmt.Errorf("outbox stats of schema %q: %w", s.schema, err)
	}
	return OutboxStats{
		Backlog:   r.Backlog,
		OldestAge: time.Duration(r.OldestAgeSeconds * float64(time.Second)),
		Retrying:  r.Retrying,
	}, nil
}

// OutboxNotify sends a NOTIFY on channel in tx, waking relays of other
// processes that listen on it once tx commits. It is off the default path:
// NOTIFY serialises commits.
func (s *Store) OutboxNotify(ctx context.Context, tx pgx.Tx, channel string) error {
	if err := s.queries.OutboxNotify(ctx, s.db(tx), channel); err != nil {
		return fmt.Errorf("notify %q: %w", channel, err)
	}
	return nil
}

// NotifyChannel is the LISTEN/NOTIFY channel on which relays of this schema
// can be woken.
func (s *Store) NotifyChannel() string { return "sagabox_outbox_" + s.schema }

// setLocalTimeouts bounds the statements of a background transaction.
func (s *Store) setLocalTimeouts(ctx context.Context, tx pgx.Tx) error {
	if err := s.queries.SetLocalTimeouts(ctx, s.db(tx), &dbsqlc.SetLocalTimeoutsParams{
		StatementTimeout: "30s", LockTimeout: "10s",
	}); err != nil {
		return fmt.Errorf("set local timeouts: %w", err)
	}
	return nil
}
