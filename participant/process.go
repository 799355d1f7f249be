package participant

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/sagabox/sagabox/internal/driver"
	"github.com/sagabox/sagabox/internal/engine"
	"github.com/sagabox/sagabox/internal/telemetry"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/transport"
)

// componentName is the component attribute of the Client's logs, spans and
// metrics.
const componentName = "participant"

// processor is the participant's part of the delivery engine: it runs a
// handler behind the barrier.
type processor struct{ c *Client }

// Process handles one delivery in one transaction of two round trips: the
// inbox record and the barrier mark go out with BEGIN, the reply and the
// mark's outcome with COMMIT, and the handler runs in between, under a
// savepoint.
//
// A message of an outside handler (HandleOutsideCommand) takes two
// transactions instead, around its outside call (deliverOutside).
func (p processor) Process(ctx context.Context, d *transport.Delivery, attempt int) (engine.Result, error) {
	h, data, poison := p.c.dispatch(d)
	if poison != nil {
		return engine.Result{}, poison
	}
	var res engine.Result
	var err error
	if h.outside != nil {
		res, err = p.c.deliverOutside(ctx, d, h, data, attempt)
	} else {
		t := p.c.db.Begin()
		defer t.Rollback(ctx)
		res, err = p.c.deliver(ctx, t, d, h, data, attempt)
	}
	if err == nil && p.c.testHookAfterCommit != nil {
		p.c.testHookAfterCommit(d)
	}
	return res, err
}

// ProcessBatch handles a batch of deliveries in one transaction (group
// commit, Config.MaxBatch): each runs as it would on its own, in a
// subtransaction of the batch's, and the batch commits once. A delivery
// that fails is rolled back to its savepoint, leaving the others' work in
// place, and is deferred: the engine processes it again on its own, with
// its retries and dead-lettering. So is a message of an outside handler,
// which needs transactions of its own, and a poison message.
func (p processor) ProcessBatch(ctx context.Context, items []engine.Item) ([]engine.Result, error) {
	c := p.c
	t := c.db.Begin()
	defer t.Rollback(ctx)
	results := make([]engine.Result, len(items))
	for i, it := range items {
		h, data, poison := c.dispatch(it.Delivery)
		if poison != nil || h.outside != nil {
			results[i].Defer = true
			continue
		}
		sub := t.Sub()
		res, err := c.deliver(it.Ctx, sub, it.Delivery, h, data, 1)
		sub.Rollback(it.Ctx)
		if err != nil {
			results[i].Defer = true
			continue
		}
		results[i] = res
	}
	if err := t.Commit(ctx); err != nil {
		return nil, err
	}
	if c.testHookAfterCommit != nil {
		for i, it := range items {
			if !results[i].Defer {
				c.testHookAfterCommit(it.Delivery)
			}
		}
	}
	return results, nil
}

// deliver handles d in t, committing t: the inbox record and the barrier
// mark go out with t's first statement, the reply and the mark's outcome
// with its commit, and the handler runs in between, under a savepoint.
func (c *Client) deliver(ctx context.Context, t driver.Tx, d *transport.Delivery, h *handler, data any, attempt int) (engine.Result, error) {
	del, err := c.db.BeginDelivery(ctx, t, &d.Envelope, blockedReply(d))
	if err != nil {
		return engine.Result{}, err
	}
	if del.Duplicate {
		return c.finish(ctx, t, d, del, driver.DeliveryEnd{}, engine.Result{Outcome: telemetry.OutcomeDuplicate})
	}
	switch d.Kind {
	case message.KindCommand:
		return c.action(ctx, t, d, del, h, data, attempt)
	case message.KindCompensation:
		return c.compensation(ctx, t, d, del, h, data, attempt)
	}
	if err := c.callErr(ctx, del, h, d, data, attempt); err != nil {
		return engine.Result{}, err
	}
	return c.finish(ctx, t, d, del, driver.DeliveryEnd{}, engine.Result{Outcome: telemetry.OutcomeApplied, Note: "event handled"})
}

// dispatch finds the handler of d and decodes its payload, or says why d is
// poison.
func (c *Client) dispatch(d *transport.Delivery) (*handler, any, *engine.Poison) {
	switch d.Kind {
	case message.KindCommand, message.KindCompensation, message.KindEvent:
	default:
		return nil, nil, &engine.Poison{Class: telemetry.ReasonUnexpectedKind,
			Reason: fmt.Sprintf("a %s message cannot be handled by participant %q", d.Kind, c.cfg.Service)}
	}
	h := c.lookup(d.Kind, d.Type)
	if h == nil {
		return nil, nil, &engine.Poison{Class: telemetry.ReasonUnknownType, Code: saga.CodeUnknownType,
			Reason: fmt.Sprintf("no %s handler is registered for type %q at participant %q", d.Kind, d.Type, c.cfg.Service)}
	}
	data, err := h.decode(d.Payload)
	if err != nil {
		return nil, nil, &engine.Poison{Class: telemetry.ReasonInvalidPayload, Code: saga.CodeInvalidPayload,
			Reason: fmt.Sprintf("payload does not decode: %v", err)}
	}
	return h, data, nil
}

// finish ends the delivery begun in t and commits t.
func (c *Client) finish(ctx context.Context, t driver.Tx, d *transport.Delivery, del *driver.Delivery, end driver.DeliveryEnd, res engine.Result) (engine.Result, error) {
	if err := c.db.FinishDelivery(ctx, t, &d.Envelope, del, end); err != nil {
		return engine.Result{}, err
	}
	// The handler may have written messages of its own (Publish), besides
	// the reply: the relay looks either way.
	res.Wrote = res.Outcome != telemetry.OutcomeDuplicate
	return res, nil
}

// action processes a step's action behind the barrier: the first action
// message of a (saga, step) runs the handler; every later one (a re-send
// after a timeout, or an action arriving after its compensation) gets the
// reply recorded in the barrier and runs nothing.
func (c *Client) action(ctx context.Context, t driver.Tx, d *transport.Delivery, del *driver.Delivery, h *handler, data any, attempt int) (engine.Result, error) {
	if !del.Marked {
		note := "action already handled for this saga step; answered with the first reply"
		if del.Prior.Outcome == driver.BarrierBlocked {
			note = "action arrived after its compensation; not applied"
		}
		return c.finish(ctx, t, d, del, driver.DeliveryEnd{Reply: c.reply(ctx, d, del.Prior.ReplyKind, del.Prior.ReplyPayload)},
			engine.Result{Outcome: telemetry.OutcomeApplied, Note: note})
	}
	reply, err := c.call(ctx, del.Tx, h, d, data, attempt)
	switch {
	case err == nil:
		mark := &driver.BarrierMark{Outcome: driver.BarrierApplied, ReplyKind: message.KindReplySuccess, ReplyPayload: reply}
		return c.finish(ctx, t, d, del, driver.DeliveryEnd{Mark: mark, Reply: c.reply(ctx, d, mark.ReplyKind, reply)},
			engine.Result{Outcome: telemetry.OutcomeApplied, Note: "applied"})
	case errors.Is(err, saga.ErrRejected):
		// The rejection keeps the inbox record and the barrier mark but none
		// of the handler's writes.
		failure := encodeFailure(failureOf(err))
		mark := &driver.BarrierMark{Outcome: driver.BarrierRejected, ReplyKind: message.KindReplyFailure, ReplyPayload: failure}
		return c.finish(ctx, t, d, del, driver.DeliveryEnd{Discard: true, Mark: mark, Reply: c.reply(ctx, d, mark.ReplyKind, failure)},
			engine.Result{Outcome: telemetry.OutcomeRejected, Note: "rejected"})
	}
	return engine.Result{}, err
}

// compensation processes a step's compensation behind the barrier. It runs
// the handler only if the step's action was applied here, and at most once
// per (saga, step). When the action never arrived the barrier left the
// action's mark itself ("blocked"), so that a late action is not applied,
// and the compensation succeeds: there is nothing to undo.
func (c *Client) compensation(ctx context.Context, t driver.Tx, d *transport.Delivery, del *driver.Delivery, h *handler, data any, attempt int) (engine.Result, error) {
	if !del.Marked {
		return c.finish(ctx, t, d, del, driver.DeliveryEnd{Reply: c.reply(ctx, d, del.Prior.ReplyKind, del.Prior.ReplyPayload)},
			engine.Result{Outcome: telemetry.OutcomeApplied, Note: "compensation already done; answered with its reply"})
	}
	success := []byte("{}")
	end := driver.DeliveryEnd{Reply: c.reply(ctx, d, message.KindReplySuccess, success)}
	note := "compensated"
	switch del.Action {
	case driver.BarrierApplied:
		if err := c.callErr(ctx, del, h, d, data, attempt); err != nil {
			return engine.Result{}, err
		}
	case driver.BarrierBlocked:
		end.Mark, note = &driver.BarrierMark{Outcome: driver.BarrierSkipped, ReplyKind: message.KindReplySuccess, ReplyPayload: success},
			"null compensation: the action never ran here"
	case driver.BarrierStarted:
		// The action calls an outside system and its outcome is not
		// recorded yet: wait for it rather than guess.
		return engine.Result{}, errActionInFlight(d)
	default:
		end.Mark, note = &driver.BarrierMark{Outcome: driver.BarrierSkipped, ReplyKind: message.KindReplySuccess, ReplyPayload: success},
			"nothing to compensate: the action was "+string(del.Action)
	}
	return c.finish(ctx, t, d, del, end, engine.Result{Outcome: telemetry.OutcomeApplied, Note: note})
}

// callErr runs a compensation or event handler; only a command can reject,
// so a rejection is a transient error here.
func (c *Client) callErr(ctx context.Context, del *driver.Delivery, h *handler, d *transport.Delivery, data any, attempt int) error {
	_, err := c.call(ctx, del.Tx, h, d, data, attempt)
	if errors.Is(err, saga.ErrRejected) {
		return fmt.Errorf("a %s cannot reject, retrying it: %w", d.Kind, err)
	}
	return err
}

// GiveUp records d as processed and dead-lettered, in one transaction, and
// answers a saga message with the failure p (or with the reply the barrier
// already holds), so that the saga does not wait for it.
func (p processor) GiveUp(ctx context.Context, d *transport.Delivery, poison *engine.Poison) (engine.Result, error) {
	c := p.c
	t := c.db.Begin()
	defer t.Rollback(ctx)
	h := c.lookup(d.Kind, d.Type)
	outside := h != nil && h.outside != nil
	fresh := false
	var err error
	if outside {
		// An entry left "started" by the call given up on is this
		// message's, not a duplicate.
		if fresh, err = c.db.SettleStarted(ctx, t, &d.Envelope); err != nil {
			return engine.Result{}, err
		}
	}
	if !fresh {
		if fresh, err = c.db.RecordInbox(ctx, t, &d.Envelope); err != nil {
			return engine.Result{}, err
		}
	}
	if !fresh {
		return c.finish(ctx, t, d, nil, driver.DeliveryEnd{}, engine.Result{Outcome: telemetry.OutcomeDuplicate})
	}
	if err := c.db.MarkDeadLettered(ctx, t, &d.Envelope, poison.Reason); err != nil {
		return engine.Result{}, err
	}
	failure := encodeFailure(saga.Failure{Reason: poison.Reason, Code: poison.Code})
	var end driver.DeliveryEnd
	if outside {
		c.log.Error("outside call given up on: whether the outside system acted is unknown; check it with the idempotency key",
			"message_id", d.MessageID.String(), "type", d.Type, "saga_id", d.SagaID.String(), "step", d.Step,
			"idempotency_key", IdempotencyKey(d.SagaID, d.Run, d.Step, d.Kind.Phase()))
	}
	switch d.Kind {
	case message.KindCommand:
		left, err := c.db.LeaveBarrier(ctx, t, &d.Envelope, driver.BarrierMark{Outcome: driver.BarrierRejected, ReplyKind: message.KindReplyFailure, ReplyPayload: failure})
		if err != nil {
			return engine.Result{}, err
		}
		end.Reply = c.reply(ctx, d, message.KindReplyFailure, failure)
		if !left {
			prior, err := c.db.Barrier(ctx, t, &d.Envelope, message.PhaseAction)
			if err != nil {
				return engine.Result{}, err
			}
			if prior.Outcome != driver.BarrierStarted {
				end.Reply = c.reply(ctx, d, prior.ReplyKind, prior.ReplyPayload)
			}
		}
	case message.KindCompensation:
		// A compensation that failed for good leaves no mark, so that an
		// operator's retry runs it again, unless one succeeded already.
		end.Reply = c.reply(ctx, d, message.KindReplyFailure, failure)
		if outside {
			if err := c.db.DropStartedMark(ctx, t, &d.Envelope); err != nil {
				return engine.Result{}, err
			}
		}
		prior, err := c.db.Barrier(ctx, t, &d.Envelope, message.PhaseCompensation)
		switch {
		case err == nil && prior.Outcome == driver.BarrierStarted:
		case err == nil:
			end.Reply = c.reply(ctx, d, prior.ReplyKind, prior.ReplyPayload)
		case !errors.Is(err, message.ErrNotFound):
			return engine.Result{}, err
		}
	}
	return c.finish(ctx, t, d, nil, end, engine.Result{Outcome: telemetry.OutcomeDeadLetter})
}

// blockedReply is the failure reply an action of d's step gets when d, a
// compensation, arrives first.
func blockedReply(d *transport.Delivery) []byte {
	if d.Kind != message.KindCompensation {
		return nil
	}
	return encodeFailure(saga.Failure{
		Reason: fmt.Sprintf("compensated before it ran: step %q of saga %s was compensated before this action arrived", d.Step, d.SagaID),
		Code:   saga.CodeCompensatedBeforeRun,
	})
}

// call runs the handler in tx, turning a panic into an error, and records
// its duration (sagabox.handler.duration).
func (c *Client) call(ctx context.Context, tx pgx.Tx, h *handler, d *transport.Delivery, data any, attempt int) (reply []byte, err error) {
	start := time.Now()
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("handler panicked", "message_id", d.MessageID.String(), "type", d.Type, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			err = fmt.Errorf("handler of %s %q panicked: %v", d.Kind, d.Type, r)
		}
		outcome := telemetry.HandlerOK
		switch {
		case errors.Is(err, saga.ErrRejected):
			outcome = telemetry.HandlerRejected
		case err != nil:
			outcome = telemetry.HandlerError
		}
		c.tel.HandlerDone(ctx, c.cfg.Schema, d.Type, string(d.Kind), outcome, time.Since(start))
	}()
	return h.call(ctx, tx, &d.Envelope, data, attempt)
}

// reply builds the reply to d, or nil when d has no ReplyTo. A reply carries
// the type of the message it answers, goes to its ReplyTo, is correlated by
// its message id and copies its saga, step and attempt. Its trace context is
// ctx's (the consumer span of d), or d's own when ctx carries no span.
func (c *Client) reply(ctx context.Context, d *transport.Delivery, kind message.Kind, payload []byte) *message.Message {
	if d.ReplyTo == "" {
		c.log.Warn("message has no reply_to; no reply sent", "message_id", d.MessageID.String(), "type", d.Type)
		return nil
	}
	traceParent, traceState := d.TraceParent, d.TraceState
	if trace.SpanContextFromContext(ctx).IsValid() {
		traceParent, traceState = telemetry.Inject(ctx)
	}
	return &message.Message{
		Envelope: message.Envelope{
			Type:          d.Type,
			Kind:          kind,
			RoutingKey:    d.ReplyTo,
			SagaID:        d.SagaID,
			SagaType:      d.SagaType,
			Step:          d.Step,
			StepIndex:     d.StepIndex,
			Attempt:       d.Attempt,
			Run:           d.Run,
			CorrelationID: d.MessageID.String(),
			TraceParent:   traceParent,
			TraceState:    traceState,
		},
		Payload: payload,
	}
}

func encodeFailure(f saga.Failure) []byte {
	b, err := json.Marshal(f)
	if err != nil {
		// Two strings always encode.
		panic(fmt.Sprintf("participant: encode failure reply: %v", err))
	}
	return b
}
