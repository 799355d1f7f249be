package store

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"sort"
	"strconv"
	"time"

	"github.com/sagabox/sagabox/store/driver"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store/internal/dbsqlc"
)

// OutboxWrite inserts msgs into the outbox in tx, the caller's transaction, so
// they are published if and only if tx commits. It completes and validates
// each message (message.Message.Prepare) and modifies msgs in place, so the
// caller learns the ids.
func (s *executor) OutboxWrite(ctx context.Context, tx pgx.Tx, msgs []message.Message) error {
	if tx == nil {
		return fmt.Errorf("write outbox: transaction is nil")
	}
	if len(msgs) == 0 {
		return nil
	}
	cols, err := outboxColumns(msgs, time.Now().UTC())
	if err != nil {
		return fmt.Errorf("write outbox: %w", err)
	}
	p := &dbsqlc.OutboxInsertParams{
		MessageID: cols.messageID, OrderingKey: cols.orderingKey, Kind: cols.kind, Type: cols.typ,
		RoutingKey: cols.routingKey, SagaID: cols.sagaID, SagaType: cols.sagaType, Step: cols.step,
		StepIndex: cols.stepIndex, Attempt: cols.attempt, ReplyTo: cols.replyTo, CorrelationID: cols.correlationID,
		Traceparent: cols.traceparent, Tracestate: cols.tracestate, Headers: cols.headers, Payload: cols.payload,
		CreatedAt: cols.createdAt,
	}
	if err := s.queries.OutboxInsert(ctx, s.db(tx), p); err != nil {
		return fmt.Errorf("write outbox: insert %d messages into schema %q: %w", len(msgs), s.schema, err)
	}
	s.noteUnleased(tx, len(msgs))
	return nil
}

// outboxCols are messages as the columns of an unnest insert.
type outboxCols struct {
	messageID     []uuid.UUID
	orderingKey   []string
	kind          []string
	typ           []string
	routingKey    []string
	sagaID        []uuid.UUID
	sagaType      []string
	step          []string
	stepIndex     []int32
	attempt       []int32
	replyTo       []string
	correlationID []string
	traceparent   []string
	tracestate    []string
	headers       [][]byte
	payload       [][]byte
	createdAt     []time.Time
}

// outboxColumns prepares msgs (message.Message.Prepare, in place) and
// returns them as columns.
func outboxColumns(msgs []message.Message, now time.Time) (*outboxCols, error) {
	n := len(msgs)
	c := &outboxCols{
		messageID: make([]uuid.UUID, n), orderingKey: make([]string, n), kind: make([]string, n),
		typ: make([]string, n), routingKey: make([]string, n), sagaID: make([]uuid.UUID, n),
		sagaType: make([]string, n), step: make([]string, n), stepIndex: make([]int32, n),
		attempt: make([]int32, n), replyTo: make([]string, n), correlationID: make([]string, n),
		traceparent: make([]string, n), tracestate: make([]string, n), headers: make([][]byte, n),
		payload: make([][]byte, n), createdAt: make([]time.Time, n),
	}
	for i := range msgs {
		m := &msgs[i]
		if err := m.Prepare(now); err != nil {
			return nil, fmt.Errorf("message %d (type %q): %w", i, m.Type, err)
		}
		headers := []byte("{}")
		if len(m.Headers) > 0 || m.Run > 0 {
			h := m.Headers
			if m.Run > 0 {
				h = maps.Clone(h)
				if h == nil {
					h = make(map[string]string, 1)
				}
				h[runHeader] = strconv.Itoa(m.Run)
			}
			var err error
			if headers, err = json.Marshal(h); err != nil {
				return nil, fmt.Errorf("encode headers of message %s: %w", m.MessageID, err)
			}
		}
		c.messageID[i], c.orderingKey[i], c.kind[i], c.typ[i] = m.MessageID, m.OrderingKey, string(m.Kind), m.Type
		c.routingKey[i], c.sagaID[i], c.sagaType[i], c.step[i] = m.RoutingKey, m.SagaID, m.SagaType, m.Step
		c.stepIndex[i], c.attempt[i], c.replyTo[i], c.correlationID[i] = int32(m.StepIndex), int32(m.Attempt), m.ReplyTo, m.CorrelationID
		c.traceparent[i], c.tracestate[i], c.headers[i], c.payload[i], c.createdAt[i] = m.TraceParent, m.TraceState, headers, m.Payload, m.CreatedAt
	}
	return c, nil
}

// OutboxClaim implements driver.Executor.
func (s *executor) OutboxClaim(ctx context.Context, opts driver.OutboxClaimOpts) ([]driver.OutboxRow, error) {
	if s.pool == nil {
		return nil, fmt.Errorf("store for schema %q has no connection pool", s.schema)
	}
	st := opts.Settle
	cause := ""
	if st.Cause != nil {
		cause = storableText(st.Cause.Error())
	}
	// One round trip: BEGIN, the plan's settings, the claim (which cannot
	// wait on a lock: SKIP LOCKED) and COMMIT. The settings keep the plan
	// bounded by the batch even when the planner misjudges the backlog (a
	// table never analysed): the first rows come from walking the
	// unpublished index in id order, never from sorting the backlog.
	t := txOf(s.Begin(nil))
	defer t.Rollback(ctx)
	t.queue(claimPlan)
	if len(st.Late) > 0 {
		// A round trip of its own, only after an outage or a backlog: the
		// sagas whose commands went out late get their deadlines back.
		if err := s.shiftDeadlines(ctx, t, st.Late); err != nil {
			return nil, err
		}
	}
	dead, reasons := make([]int64, len(st.Dead)), make([]string, len(st.Dead))
	for i, d := range st.Dead {
		dead[i], reasons[i] = d.ID, storableText(d.Reason)
	}
	rows, err := s.queries.OutboxClaim(ctx, t.exec(ctx, true), &dbsqlc.OutboxClaimParams{
		Published: nonNil(st.Published), KeepPublished: st.KeepPublished, Failed: nonNil(st.Failed),
		RetryAfterSeconds: st.RetryAfter.Seconds(), LastError: cause, Dead: dead, DeadReason: reasons,
		LeaseSeconds: opts.Lease.Seconds(), ClaimedBy: opts.ClaimedBy, Max: int32(opts.Max),
	})
	if err != nil {
		return nil, fmt.Errorf("claim outbox batch in schema %q: %w", s.schema, err)
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].ID < rows[j].ID })
	out := make([]driver.OutboxRow, len(rows))
	for i, r := range rows {
		out[i] = driver.OutboxRow{ID: r.ID, Message: outboxMessage(r), PublishAttempts: int(r.PublishAttempts)}
	}
	return out, nil
}

// claimPlan are the planner settings of the claim's transaction. The claim
// runs on its generic plan, built once per connection: left to choose, the
// plan cache planned it anew for most claims (its parameters are arrays),
// and the planning cost more of PostgreSQL's time than the claim itself.
// The settings and the statement's shape keep that plan bounded by the
// batch whatever the backlog was when it was built
// (TestClaimPlanIgnoresPublishedBacklog checks it).
const claimPlan = "select set_config('enable_sort', 'off', true), set_config('enable_bitmapscan', 'off', true), " +
	"set_config('enable_seqscan', 'off', true), set_config('statement_timeout', '30s', true), " +
	"set_config('plan_cache_mode', 'force_generic_plan', true)"

// runHeader is the key under which the outbox keeps a message's Run among
// its headers (the reserved prefix keeps it apart from the user's), so that
// a restarted saga's messages need no column of their own.
const runHeader = message.ReservedHeaderPrefix + "run"

func outboxMessage(r *dbsqlc.SagaboxOutbox) message.Message {
	var headers map[string]string
	if len(r.Headers) > 0 && string(r.Headers) != "{}" {
		_ = json.Unmarshal(r.Headers, &headers) // written by outboxColumns from a map[string]string
	}
	run := 0
	if v, ok := headers[runHeader]; ok {
		run, _ = strconv.Atoi(v)
		delete(headers, runHeader)
		if len(headers) == 0 {
			headers = nil
		}
	}
	return message.Message{
		Envelope: message.Envelope{
			Version:       message.Version,
			MessageID:     r.MessageID,
			Type:          r.Type,
			Kind:          message.Kind(r.Kind),
			RoutingKey:    r.RoutingKey,
			SagaID:        nullUUID(r.SagaID),
			SagaType:      r.SagaType,
			Step:          r.Step,
			StepIndex:     int(r.StepIndex),
			Attempt:       int(r.Attempt),
			Run:           run,
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

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func nullUUID(u uuid.NullUUID) uuid.UUID {
	if u.Valid {
		return u.UUID
	}
	return uuid.Nil
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// OutboxPresent implements driver.Executor.
func (s *executor) OutboxPresent(ctx context.Context, ids []int64) ([]int64, error) {
	db, err := s.pooled()
	if err != nil {
		return nil, err
	}
	present, err := s.queries.OutboxPresent(ctx, db, nonNil(ids))
	if err != nil {
		return nil, fmt.Errorf("look up %d outbox rows in schema %q: %w", len(ids), s.schema, err)
	}
	return present, nil
}

// shiftDeadlines pushes back, in t, the deadlines of the steps whose
// commands late were published late.
func (s *executor) shiftDeadlines(ctx context.Context, t *engineTx, late []driver.LateSend) error {
	p := &dbsqlc.SagaShiftDeadlinesParams{
		SagaID: make([]uuid.UUID, len(late)), StepIndex: make([]int32, len(late)), Phase: make([]string, len(late)),
		Attempt: make([]int32, len(late)), DelaySeconds: make([]float64, len(late)),
	}
	for i, l := range late {
		p.SagaID[i], p.StepIndex[i], p.Phase[i] = l.SagaID, int32(l.StepIndex), string(l.Phase)
		p.Attempt[i], p.DelaySeconds[i] = int32(l.Attempt), l.Delay.Seconds()
	}
	if err := s.queries.SagaShiftDeadlines(ctx, t.exec(ctx, false), p); err != nil {
		return fmt.Errorf("push back the deadlines of %d late commands in schema %q: %w", len(late), s.schema, err)
	}
	return nil
}
