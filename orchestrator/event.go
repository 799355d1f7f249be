package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/sagabox/sagabox/internal/engine"
	"github.com/sagabox/sagabox/internal/telemetry"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store/driver"
	"github.com/sagabox/sagabox/transport"
)

// SagaRef names the saga an outside event is for: by ID, or by the
// definition name and start key it was started with (see GetByKey).
type SagaRef struct {
	ID       uuid.UUID
	Type     string
	StartKey string
}

// EventOutcome says what SendEvent did with an event.
type EventOutcome string

// The outcomes of SendEvent.
const (
	// EventConsumed: the saga waited for the event and applied it.
	EventConsumed EventOutcome = "consumed"
	// EventKept: the saga does not wait for the event yet; it is kept and
	// consumed when a step of the saga waits for it.
	EventKept EventOutcome = "kept"
	// EventIgnored: the saga will never wait for the event (it has ended,
	// is compensating, or no step ahead waits for it); the event is
	// recorded and ignored.
	EventIgnored EventOutcome = "ignored"
	// EventDuplicate: the saga already has an event with this id; nothing
	// was written.
	EventDuplicate EventOutcome = "duplicate"
)

// EventSent is the result of SendEvent.
type EventSent struct {
	// SagaID is the saga the event was sent to.
	SagaID uuid.UUID
	// Outcome says what happened to the event.
	Outcome EventOutcome
	// Status is the saga's status after the event.
	Status saga.Status
}

// Event settlements stored on the event's row.
const (
	eventConsumed = "consumed"
	eventIgnored  = "ignored"
)

// SendEvent sends the outside event ev with payload v to the saga to, in
// tx, the caller's transaction, so that the caller's business write (a
// webhook's, say) and the event commit together: nothing of it exists
// unless tx commits. eventID, chosen by the sender (the provider's event
// id, for instance), deduplicates: a second event with the same id for the
// saga writes nothing and reports EventDuplicate.
//
// If the saga waits for ev now (saga.WaitEvent), the event is applied in tx:
// the saga moves on and its next commands are written to the outbox (call
// c.Wake after committing). If it does not wait for it yet, the event is
// kept and applied when the saga reaches a step that waits for it; if the
// saga will never wait for it (it has ended, is compensating, or no step
// ahead waits for it), the event is recorded and ignored. A saga that does not
// exist gives an error wrapping ErrNotFound. SendEvent locks the saga's row
// until tx ends.
func SendEvent[T any](ctx context.Context, c *Client, tx pgx.Tx, to SagaRef, ev saga.EventType[T], eventID string, v T) (*EventSent, error) {
	payload, err := ev.Encode(v)
	if err != nil {
		return nil, fmt.Errorf("orchestrator: send event %s: %w", ev.Name(), err)
	}
	sent, err := c.sendEvent(ctx, tx, to, ev.Name(), eventID, payload)
	if err != nil {
		return nil, fmt.Errorf("orchestrator: send event %s (%s): %w", ev.Name(), eventID, err)
	}
	return sent, nil
}

func (c *Client) sendEvent(ctx context.Context, tx pgx.Tx, to SagaRef, name, eventID string, payload []byte) (*EventSent, error) {
	switch {
	case tx == nil:
		return nil, errors.New("transaction is nil")
	case eventID == "":
		return nil, errors.New("event id is empty")
	}
	id := to.ID
	if id == uuid.Nil {
		rec, err := c.db.SagaGetByStartKey(ctx, tx, to.Type, to.StartKey)
		if err != nil {
			return nil, err
		}
		id = rec.ID
	}
	recs, err := c.db.SagaLockIn(ctx, tx, []uuid.UUID{id})
	if err != nil {
		return nil, err
	}
	if len(recs) == 0 {
		return nil, fmt.Errorf("saga %s: %w", id, message.ErrNotFound)
	}
	if !trace.SpanContextFromContext(ctx).IsValid() {
		// A sender without a trace of its own (a webhook handler): the
		// event's work, and the commands it sends, continue the saga's.
		var span trace.Span
		ctx, span = c.sagaSpan(ctx, "saga event", recs[0])
		defer span.End()
	}
	sent, tr, write, err := c.applyOutside(ctx, nil, tx, recs[0], name, eventID, payload)
	if err != nil || !write {
		return sent, err
	}
	// The caller's commit, which this Client does not see, changes the
	// saga: what the cache kept of it is out of date either way.
	c.cache.forget(id)
	if err := c.db.SagaWriteIn(ctx, tx, writes(tr), tr.at); err != nil {
		return nil, err
	}
	if c.cfg.Relay.Notify && len(tr.res.Emit) > 0 {
		if err := c.db.OutboxNotify(ctx, tx); err != nil {
			return nil, err
		}
	}
	if !tr.rec.Deadline.IsZero() {
		c.noteDeadline(tr.rec.Deadline)
	}
	c.wokenSinceStart.Store(false)
	select {
	case c.startWake <- struct{}{}: // the relay, a few times after the caller's commit
	default:
	}
	return sent, nil
}

// applyOutside records the outside event eventID (name, payload) for the
// saga rec, locked in t or else tx, and applies it if the saga waits for it
// now, with the kept events it then waits for. It reports whether there is
// a transition to write (the caller writes it).
func (c *Client) applyOutside(ctx context.Context, t driver.Tx, tx pgx.Tx, rec driver.SagaRecord, name, eventID string, payload []byte) (*EventSent, transition, bool, error) {
	now := c.now()
	id := rec.ID
	in := driver.In{T: t, Caller: tx}
	fresh, err := c.db.EventRecord(ctx, in, &driver.OutsideEvent{SagaID: id, EventID: eventID, Name: name, Payload: payload, ReceivedAt: now})
	if err != nil {
		return nil, transition{}, false, err
	}
	sent := &EventSent{SagaID: id, Outcome: EventDuplicate, Status: saga.Status(rec.Status)}
	if !fresh {
		return sent, transition{}, false, nil
	}
	runner, err := c.registry.Lookup(rec.Type, rec.Version)
	if err != nil {
		return nil, transition{}, false, err
	}
	s, err := sagaFromRecord(&rec)
	if err != nil {
		return nil, transition{}, false, err
	}
	scope := withTx(ctx, tx)
	if t != nil {
		scope = c.localScope(ctx, t)
	}
	res, err := runner.Apply(scope, s.Instance(), saga.Event{
		Kind: saga.EventOutside, Type: name, Payload: payload, EventID: eventID, At: now,
	})
	if err != nil {
		return nil, transition{}, false, err
	}
	if res.Ignored {
		sent.Outcome = EventKept
		if !waitsAhead(runner, s, name) {
			sent.Outcome = EventIgnored
			if err := c.db.EventSettle(ctx, in, driver.EventSettlement{SagaID: id, EventID: eventID, Status: eventIgnored, Detail: res.IgnoreReason, At: now}); err != nil {
				return nil, transition{}, false, err
			}
		}
		return sent, transition{}, false, nil
	}
	if err := c.db.EventSettle(ctx, in, driver.EventSettlement{SagaID: id, EventID: eventID, Status: eventConsumed, At: now}); err != nil {
		return nil, transition{}, false, err
	}
	tr, err := c.transition(ctx, rec, res, now)
	if err != nil {
		return nil, transition{}, false, err
	}
	if tr, err = c.consumeKept(ctx, t, tx, runner, tr, now); err != nil {
		return nil, transition{}, false, err
	}
	tr.phase, tr.at = s.Phase, now
	sent.Outcome, sent.Status = EventConsumed, tr.res.Instance.Status
	return sent, tr, true, nil
}

// waitsAhead reports whether the saga s may still wait for the event name:
// it is running, or queued (flow control), and a step not yet reached (or
// the current one) waits for it. An event it will never wait for is
// recorded and ignored.
func waitsAhead(runner saga.Runner, s *Saga, name string) bool {
	if s.Status != saga.StatusRunning && s.Status != saga.StatusQueued {
		return false
	}
	for i, info := range runner.Steps() {
		if i >= s.CurrentStep && info.WaitEvent == name && i < len(s.Steps) &&
			(s.Steps[i].Status == saga.StepPending || s.Steps[i].Status == saga.StepWaitingEvent) {
			return true
		}
	}
	return false
}

// awaited returns the name of the outside event inst waits for now, or "".
func awaited(runner saga.Runner, inst *saga.Instance) string {
	i := inst.CurrentStep
	if inst.Status != saga.StatusRunning || i < 0 || i >= len(inst.Steps) || inst.Steps[i].Status != saga.StepWaitingEvent {
		return ""
	}
	return runner.Steps()[i].WaitEvent
}

// maxChainedEvents bounds the kept events one transition consumes.
const maxChainedEvents = 16

// consumeKept applies to tr, a transition about to be written in t (or
// else tx), the kept events its saga now waits for, one after the other:
// an event sent before the saga reached its step is consumed as soon as it
// does. It returns the transition with them.
func (c *Client) consumeKept(ctx context.Context, t driver.Tx, tx pgx.Tx, runner saga.Runner, tr transition, now time.Time) (transition, error) {
	if tr.res.Ignored {
		return tr, nil
	}
	res := tr.res
	for range maxChainedEvents {
		name := awaited(runner, &res.Instance)
		if name == "" {
			break
		}
		ev, err := c.db.EventPending(ctx, driver.In{T: t, Caller: tx}, res.Instance.ID, name)
		if err != nil {
			return tr, err
		}
		if ev == nil {
			break
		}
		scope := withTx(ctx, tx)
		if t != nil {
			scope = c.localScope(ctx, t)
		}
		next, err := runner.Apply(scope, res.Instance, saga.Event{
			Kind: saga.EventOutside, Type: ev.Name, Payload: ev.Payload, EventID: ev.EventID, At: now,
		})
		if err != nil || next.Ignored {
			// A kept event the saga cannot apply (its contract changed) is
			// set aside rather than blocking the saga's transitions.
			detail := fmt.Sprint("not applicable: ", err)
			if err == nil {
				detail = next.IgnoreReason
			}
			if serr := c.db.EventSettle(ctx, driver.In{T: t, Caller: tx}, driver.EventSettlement{SagaID: ev.SagaID, EventID: ev.EventID, Status: eventIgnored, Detail: detail, At: now}); serr != nil {
				return tr, serr
			}
			break
		}
		if err := c.db.EventSettle(ctx, driver.In{T: t, Caller: tx}, driver.EventSettlement{SagaID: ev.SagaID, EventID: ev.EventID, Status: eventConsumed, At: now}); err != nil {
			return tr, err
		}
		res = saga.Result{Instance: next.Instance, Emit: append(res.Emit, next.Emit...), History: append(res.History, next.History...)}
	}
	if len(res.History) == len(tr.res.History) {
		return tr, nil
	}
	merged, err := c.transition(ctx, tr.orig, res, now)
	if err != nil {
		return tr, err
	}
	merged.phase, merged.at, merged.before, merged.since = tr.phase, tr.at, tr.before, tr.since
	return merged, nil
}

// processEvent applies an outside event that arrived as a message on the
// orchestrator's queue (another service published it, with the saga's id
// in its envelope), as SendEvent does, in one transaction with its inbox
// record; the message id is the event id.
func (c *Client) processEvent(ctx context.Context, d *transport.Delivery, lease *driver.OutboxLease) (engine.Result, error) {
	t := c.db.Begin(&driver.BeginOpts{Lease: lease})
	defer t.Rollback(ctx)
	rcpts, err := c.db.ReplyReceive(ctx, t, []*message.Envelope{&d.Envelope})
	if err != nil {
		return engine.Result{}, err
	}
	commit := func(res engine.Result) (engine.Result, error) {
		committed, err := t.Commit(ctx)
		res.Committed = committed
		return res, err
	}
	switch r := rcpts[0]; {
	case !r.Fresh:
		return commit(engine.Result{Outcome: telemetry.OutcomeDuplicate})
	case r.Saga == nil:
		c.log.Warn("event for a saga that does not exist here acknowledged without effect", "message_id", d.MessageID.String(),
			"saga_id", d.SagaID.String(), "type", d.Type)
		return commit(engine.Result{Outcome: telemetry.OutcomeUnknownSaga})
	}
	sent, tr, write, err := c.applyOutside(ctx, t, nil, *rcpts[0].Saga, d.Type, d.MessageID.String(), d.Payload)
	switch {
	case errors.Is(err, saga.ErrInvalidPayload):
		return engine.Result{}, &engine.Poison{Class: telemetry.ReasonInvalidPayload, Reason: fmt.Sprintf("event %s for saga %s: %v", d.MessageID, d.SagaID, err)}
	case errors.Is(err, saga.ErrUnknownDefinition), errors.Is(err, saga.ErrInvalidInstance):
		return engine.Result{}, &engine.Poison{Class: telemetry.ReasonInvalidInstance, Reason: fmt.Sprintf("event %s for saga %s: %v", d.MessageID, d.SagaID, err)}
	case err != nil:
		return engine.Result{}, err
	case !write:
		return commit(engine.Result{Outcome: telemetry.OutcomeIgnored, Note: string(sent.Outcome)})
	}
	if err := c.db.SagaWrite(ctx, t, writes(tr), tr.at); err != nil {
		return engine.Result{}, err
	}
	res, err := commit(engine.Result{Outcome: telemetry.OutcomeApplied})
	if err != nil {
		return engine.Result{}, err
	}
	c.applied(ctx, tr)
	return res, nil
}

// awaitedEvents names the outside events the Client's definitions wait for:
// the events its queue receives from other services.
func (c *Client) awaitedEvents() []string {
	seen := map[string]bool{}
	var out []string
	for _, r := range c.registry.Runners() {
		for _, st := range r.Steps() {
			if st.WaitEvent != "" && !seen[st.WaitEvent] {
				seen[st.WaitEvent] = true
				out = append(out, st.WaitEvent)
			}
		}
	}
	return out
}
