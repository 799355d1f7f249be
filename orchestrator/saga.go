package orchestrator

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"

	"github.com/sagabox/sagabox/internal/telemetry"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store/driver"
)

// Saga is the stored state of one saga instance, as Get and List return it.
type Saga struct {
	// ID identifies the saga (a UUIDv7).
	ID uuid.UUID
	// Type and Version name the definition the saga runs under.
	Type    string
	Version int
	// Status is the saga's lifecycle status.
	Status saga.Status
	// Phase is saga.PhaseAction until the first compensation, then
	// saga.PhaseCompensation.
	Phase saga.Phase
	// CurrentStep is the index of the step in flight, or in a failed saga of
	// the step whose compensation failed; -1 once completed, compensated or
	// terminated.
	CurrentStep int
	// Run counts the operator's restarts (Restart): 0 for a saga never
	// restarted.
	Run int
	// Data is the saga's typed data as JSON (decode it with the
	// definition's DecodeData).
	Data json.RawMessage
	// Steps holds the state of every step of the definition, in order.
	Steps []saga.StepState
	// Deadline is when the next timer is due; zero when none is.
	Deadline time.Time
	// LastError is the most recent failure reason (rejection, timeout,
	// abort, compensation failure, or a reply the orchestrator could not
	// apply).
	LastError string
	// StartKey is the idempotency key the saga was started with, if any.
	StartKey string
	// Revision counts the transitions applied to the saga.
	Revision int64
	// CreatedAt, UpdatedAt and FinishedAt are Clock times; FinishedAt is
	// zero until the saga is completed, compensated or terminated (a failed
	// saga waits for an operator and is not finished).
	CreatedAt  time.Time
	UpdatedAt  time.Time
	FinishedAt time.Time
	// ConcurrencyKey is the key the saga was started with
	// (StartOpts.ConcurrencyKey), if any.
	ConcurrencyKey string
	// AdmittedAt is when the saga's first step ran: CreatedAt for a saga
	// started at once, later for one that was queued (flow control), zero
	// while it is queued.
	AdmittedAt time.Time
	// TraceParent is the W3C trace context of the span that started the
	// saga (its trace id is the saga's trace); empty without tracing.
	TraceParent string
}

// Instance returns the saga as the saga core sees it.
func (s *Saga) Instance() saga.Instance {
	return saga.Instance{
		ID: s.ID, Type: s.Type, Version: s.Version, Status: s.Status, Phase: s.Phase,
		CurrentStep: s.CurrentStep, Run: s.Run, Data: s.Data, Steps: s.Steps, Deadline: s.Deadline, LastError: s.LastError,
	}
}

func sagaFromRecord(rec *driver.SagaRecord) (*Saga, error) {
	s := &Saga{
		ID: rec.ID, Type: rec.Type, Version: rec.Version, Status: saga.Status(rec.Status), Phase: saga.Phase(rec.Phase),
		CurrentStep: rec.CurrentStep, Run: rec.Run, Data: json.RawMessage(rec.Data), LastError: rec.LastError, StartKey: rec.StartKey,
		Revision: rec.Revision, CreatedAt: rec.CreatedAt, UpdatedAt: rec.UpdatedAt, Deadline: rec.Deadline,
		FinishedAt: rec.FinishedAt, ConcurrencyKey: rec.ConcurrencyKey, AdmittedAt: rec.AdmittedAt, TraceParent: rec.TraceParent,
	}
	if err := json.Unmarshal(rec.Steps, &s.Steps); err != nil {
		return nil, fmt.Errorf("%w: saga %s: decode step states: %w", saga.ErrInvalidInstance, rec.ID, err)
	}
	return s, nil
}

// sagaRead returns the saga of a record the driver read, or the error of
// the read or of the record, for a public read (Get, GetByKey).
func sagaRead(rec driver.SagaRecord, err error) (*Saga, error) {
	if err != nil {
		return nil, fmt.Errorf("orchestrator: %w", err)
	}
	s, err := sagaFromRecord(&rec)
	if err != nil {
		return nil, fmt.Errorf("orchestrator: %w", err)
	}
	return s, nil
}

// applyToRecord writes inst into rec, the row it came from (or a new one).
func applyToRecord(rec *driver.SagaRecord, inst *saga.Instance, now time.Time) error {
	steps, err := json.Marshal(inst.Steps)
	if err != nil {
		return fmt.Errorf("encode step states of saga %s: %w", inst.ID, err)
	}
	rec.ID, rec.Type, rec.Version = inst.ID, inst.Type, inst.Version
	rec.Status, rec.Phase, rec.CurrentStep, rec.Run = string(inst.Status), string(inst.Phase), inst.CurrentStep, inst.Run
	rec.Data, rec.Steps, rec.LastError = inst.Data, steps, inst.LastError
	rec.Deadline = inst.Deadline
	rec.Attempts = 0
	if inst.CurrentStep >= 0 && inst.CurrentStep < len(inst.Steps) {
		st := inst.Steps[inst.CurrentStep]
		rec.Attempts = st.Attempt
		if inst.Phase == saga.PhaseCompensation {
			rec.Attempts = st.CompensationAttempt
		}
	}
	finished := inst.Status.Finished()
	switch {
	case finished && rec.FinishedAt.IsZero():
		rec.FinishedAt = now
	case !finished:
		rec.FinishedAt = time.Time{}
	}
	return nil
}

func historyRecords(id uuid.UUID, entries []saga.HistoryEntry) []driver.HistoryRecord {
	out := make([]driver.HistoryRecord, len(entries))
	for i, e := range entries {
		out[i] = driver.HistoryRecord{
			SagaID: id, At: e.At, Event: string(e.Event), Step: e.Step, StepIndex: e.StepIndex, Phase: string(e.Phase),
			Attempt: e.Attempt, Detail: e.Detail, Actor: e.Actor, MessageID: e.MessageID,
		}
	}
	return out
}

// messages maps the core's outgoing commands to outbox messages, which
// carry ctx's trace context: the one place it is set. Each compensation
// sent is also an event on ctx's span.
func (c *Client) messages(ctx context.Context, inst *saga.Instance, emit []saga.Outgoing) []message.Message {
	if len(emit) == 0 {
		return nil
	}
	tp, ts := telemetry.Inject(ctx)
	span := trace.SpanFromContext(ctx)
	out := make([]message.Message, len(emit))
	for i, o := range emit {
		kind := message.KindOf(message.Phase(o.Phase))
		if kind == message.KindCompensation && span.IsRecording() {
			span.AddEvent("compensation sent", trace.WithAttributes(
				telemetry.AttrSagaType.String(inst.Type), telemetry.AttrSagaID.String(inst.ID.String()),
				telemetry.AttrStep.String(o.Step), telemetry.AttrMessageType.String(o.Type), telemetry.AttrAttempt.Int(o.Attempt)))
		}
		out[i] = message.Message{
			Envelope: message.Envelope{
				Type: o.Type, Kind: kind, RoutingKey: o.Type, SagaID: inst.ID, SagaType: inst.Type,
				Step: o.Step, StepIndex: o.StepIndex, Attempt: o.Attempt, Run: o.Run, ReplyTo: c.cfg.Service,
				TraceParent: tp, TraceState: ts,
			},
			Payload: o.Payload,
		}
	}
	return out
}

// transition is a decision of the core about to be written, with what the
// caller needs after the commit.
type transition struct {
	// before is the status before the event; since the time of the
	// previous transition; phase the phase the event belonged to.
	before saga.Status
	since  time.Time
	phase  saga.Phase
	// at is the time of the event.
	at time.Time
	// deadlineFailed marks the record of a timer the core refused.
	deadlineFailed bool
	// orig is the saga as read, before the event; rec as written.
	orig  driver.SagaRecord
	rec   driver.SagaRecord
	res   saga.Result
	write driver.Transition
}

// transition turns res, the outcome of applying an event to the saga rec,
// into what is written: the new state (revision-checked), its history and
// its outgoing messages. An ignored result writes only its history.
func (c *Client) transition(ctx context.Context, rec driver.SagaRecord, res saga.Result, now time.Time) (transition, error) {
	tr := transition{before: saga.Status(rec.Status), since: rec.UpdatedAt, res: res, orig: rec, rec: rec}
	tr.write.History = historyRecords(rec.ID, res.History)
	if res.Ignored {
		return tr, nil
	}
	if err := applyToRecord(&tr.rec, &res.Instance, now); err != nil {
		return tr, err
	}
	next := tr.rec
	tr.write.Saga = &next
	tr.write.Messages = c.messages(ctx, &res.Instance, res.Emit)
	// A terminated saga sends nothing more, not even what it wrote before
	// and no relay has published yet (a command to a queue that does not
	// exist, retried for ever).
	tr.write.WithdrawUnsent = res.Instance.Status == saga.StatusTerminated && tr.before != saga.StatusTerminated
	tr.rec.Revision++
	tr.rec.UpdatedAt = now
	return tr, nil
}

// writes returns what trs write.
func writes(trs ...transition) []driver.Transition {
	out := make([]driver.Transition, len(trs))
	for i := range trs {
		out[i] = trs[i].write
	}
	return out
}

// committed does what follows the commit of transitions: wake the relay and
// the sweeper, count metrics.
func (c *Client) committed(ctx context.Context, trs ...transition) {
	if c.applied(ctx, trs...) {
		c.wakeRelay()
	}
}

// applied is committed without the relay's wake-up, for a delivery's
// transitions: the engine wakes the relay after the delivery when a
// message its transaction wrote needs a claim (engine.Result.Wrote), and
// not when the relay was handed them all (the write-time lease). It
// reports whether the transitions sent messages.
func (c *Client) applied(ctx context.Context, trs ...transition) (sent bool) {
	admit := false
	for _, tr := range trs {
		if tr.res.Ignored {
			continue
		}
		if tr.write.Saga != nil {
			c.cache.put(tr.write.Saga) // as stored (driver.Executor.WriteTransitions)
		}
		if len(tr.res.Emit) > 0 {
			sent = true
		}
		if !tr.rec.Deadline.IsZero() {
			c.noteDeadline(tr.rec.Deadline)
		}
		after := tr.res.Instance.Status
		if after != tr.before && after.Terminal() {
			admit = true
			c.waiters.ended(tr.rec.ID)
			c.tel.SagaFinished(ctx, tr.rec.Type, string(after), tr.rec.UpdatedAt.Sub(tr.rec.CreatedAt))
			lvl := slog.LevelDebug
			switch after {
			case saga.StatusCompensated:
				lvl = slog.LevelInfo
			case saga.StatusFailed, saga.StatusTerminated:
				lvl = slog.LevelWarn
			}
			c.log.Log(ctx, lvl, "saga "+string(after), "saga_id", tr.rec.ID.String(), "saga_type", tr.rec.Type, "last_error", tr.rec.LastError)
		}
	}
	if admit && c.mayBeQueued.Load() {
		c.wakeAdmission() // a place for a queued saga may have freed
	}
	return sent
}
