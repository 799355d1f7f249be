package participant

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/sagabox/sagabox/internal/lifecycle"
	"github.com/sagabox/sagabox/internal/telemetry"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/transport"
)

// Codes of the failure replies (saga.Failure.Code) that a participant sends
// on its own, as opposed to a handler's rejection.
const (
	// CodeDeadLettered: the handler kept failing and the message was
	// dead-lettered after Retry.MaxAttempts attempts.
	CodeDeadLettered = "dead-lettered"
	// CodeInvalidPayload: the payload did not decode into the request type.
	CodeInvalidPayload = "invalid-payload"
	// CodeUnknownType: no handler is registered for the message's type.
	CodeUnknownType = "unknown-type"
	// CodePayloadTooLarge: the payload is over MaxPayloadBytes.
	CodePayloadTooLarge = "payload-too-large"
	// CodeCompensatedBeforeRun: the action arrived after the compensation of
	// its step (a "hanging action") and was not applied.
	CodeCompensatedBeforeRun = "compensated-before-run"
)

// serializationRetries is how many times a transaction that failed with a
// serialization failure or deadlock is run again at once.
const serializationRetries = 3

// result is what one processing transaction did.
type result struct {
	duplicate bool
	// rejected is set when the handler rejected the command.
	rejected bool
	// note says what happened, for the log.
	note string
}

// componentName is the component attribute of the Client's logs, spans and
// metrics.
const componentName = "participant"

// handle is the transport.Handler of the Client: it runs the whole
// pipeline for one delivery, in a consumer span that is a child of the
// producer span that sent it, and returns the broker's verdict. ctx is the
// Client's work context, not the subscription's.
func (c *Client) handle(ctx context.Context, d *transport.Delivery) transport.Outcome {
	ctx, span := c.tel.StartProcess(ctx, &d.Envelope, componentName)
	defer span.End()
	span.SetAttributes(telemetry.AttrSchema.String(c.cfg.Schema))
	return c.dispatch(ctx, d)
}

func (c *Client) dispatch(ctx context.Context, d *transport.Delivery) transport.Outcome {
	var h *handler
	switch d.Kind {
	case message.KindCommand, message.KindCompensation, message.KindEvent:
		h = c.lookup(d.Kind, d.Type)
	default:
		return c.poison(ctx, d, telemetry.ReasonUnexpectedKind, "", fmt.Sprintf("a %s message cannot be handled by participant %q", d.Kind, c.cfg.Service))
	}
	if h == nil {
		return c.poison(ctx, d, telemetry.ReasonUnknownType, CodeUnknownType, fmt.Sprintf("no %s handler is registered for type %q at participant %q", d.Kind, d.Type, c.cfg.Service))
	}
	if len(d.Payload) > c.cfg.MaxPayloadBytes {
		return c.poison(ctx, d, telemetry.ReasonPayloadTooLarge, CodePayloadTooLarge, fmt.Sprintf("payload of %s %q is %d bytes, over MaxPayloadBytes %d", d.Kind, d.Type, len(d.Payload), c.cfg.MaxPayloadBytes))
	}
	data, err := h.decode(d.Payload)
	if err != nil {
		return c.poison(ctx, d, telemetry.ReasonInvalidPayload, CodeInvalidPayload, fmt.Sprintf("payload does not decode: %v", err))
	}

	failures := 0
	if d.Redelivered {
		// Only a redelivered message can have failed before: the first
		// delivery costs no lookup.
		a, err := c.store.InboxAttemptGet(ctx, d.MessageID)
		switch {
		case err == nil:
			failures = a.Attempts
			if failures >= c.cfg.Retry.MaxAttempts {
				return c.giveUp(ctx, d, fmt.Sprintf("gave up after %d attempts: %s", failures, a.LastError))
			}
		case !errors.Is(err, message.ErrNotFound):
			return c.infraRetry(ctx, d, err)
		}
	}

	res, err := c.process(ctx, d, h, data, failures+1, nil)
	if err != nil {
		return c.failed(ctx, d, err)
	}
	return c.done(ctx, d, res)
}

// inboxOutcome records on ctx's span whether the inbox saw d for the first
// time, and counts a duplicate.
func (c *Client) inboxOutcome(ctx context.Context, d *transport.Delivery, duplicate bool) {
	span := trace.SpanFromContext(ctx)
	if duplicate {
		span.SetAttributes(telemetry.AttrInbox.String(telemetry.InboxDuplicate))
		c.tel.Duplicate(ctx, c.cfg.Schema, d.Type)
		return
	}
	span.SetAttributes(telemetry.AttrInbox.String(telemetry.InboxNew))
}

// done finishes a delivery whose transaction committed.
func (c *Client) done(ctx context.Context, d *transport.Delivery, res result) transport.Outcome {
	c.inboxOutcome(ctx, d, res.duplicate)
	if res.duplicate {
		c.tel.Handled(ctx, c.cfg.Schema, componentName, d.Type, telemetry.OutcomeDuplicate)
		c.log.Info("duplicate message ignored", logAttrs(d)...)
		return transport.Ack()
	}
	outcome := telemetry.OutcomeApplied
	if res.rejected {
		outcome = telemetry.OutcomeRejected
	}
	trace.SpanFromContext(ctx).SetAttributes(telemetry.AttrOutcome.String(outcome))
	c.tel.Handled(ctx, c.cfg.Schema, componentName, d.Type, outcome)
	if c.testHookAfterCommit != nil {
		c.testHookAfterCommit(d)
	}
	c.relay.Wake()
	c.log.Debug("message processed", append(logAttrs(d), "outcome", res.note)...)
	return transport.Ack()
}

// failed handles a processing transaction that failed: the failure is
// counted in a statement of its own and the message retried with backoff,
// or given up once Retry.MaxAttempts is reached.
func (c *Client) failed(ctx context.Context, d *transport.Delivery, cause error) transport.Outcome {
	if ctx.Err() != nil {
		// Shutting down past StopTimeout: not the handler's fault.
		c.log.Info("delivery cancelled by shutdown; it will be redelivered", logAttrs(d)...)
		return transport.Retry(0)
	}
	if store.IsConnectionError(cause) {
		// Postgres is restarting or unreachable: not the message's fault,
		// so it does not count against Retry.MaxAttempts.
		return c.infraRetry(ctx, d, cause)
	}
	if errors.Is(cause, saga.ErrRejected) && d.Kind != message.KindCommand {
		cause = fmt.Errorf("a %s cannot reject, retrying it: %w", d.Kind, cause)
	}
	telemetry.Fail(trace.SpanFromContext(ctx), cause)
	n, err := c.store.InboxAttemptRecord(ctx, &d.Envelope, cause.Error())
	if err != nil {
		c.log.Warn("handler failed and its attempt could not be recorded", append(logAttrs(d), "err", cause, "record_err", err)...)
		return c.infraRetry(ctx, d, nil)
	}
	if n >= c.cfg.Retry.MaxAttempts {
		return c.giveUp(ctx, d, fmt.Sprintf("gave up after %d attempts: %v", n, cause))
	}
	delay := retryDelay(c.cfg.Retry, n)
	c.retried(ctx, d, telemetry.CauseHandler)
	c.log.Warn("handler failed; retrying", append(logAttrs(d), "delivery_attempt", n, "retry_in", delay, "err", cause)...)
	return transport.Retry(delay)
}

// retried counts a delivery sent back for another attempt.
func (c *Client) retried(ctx context.Context, d *transport.Delivery, cause string) {
	trace.SpanFromContext(ctx).SetAttributes(telemetry.AttrOutcome.String(telemetry.OutcomeRetry), telemetry.AttrCause.String(cause))
	c.tel.Retry(ctx, componentName, d.Type, cause)
	c.tel.Handled(ctx, c.cfg.Schema, componentName, d.Type, telemetry.OutcomeRetry)
}

// giveUp dead-letters a message whose handler kept failing, after recording
// it as processed and, for a saga message, writing a failure reply so that
// the saga does not wait for it.
func (c *Client) giveUp(ctx context.Context, d *transport.Delivery, reason string) transport.Outcome {
	return c.deadLetter(ctx, d, telemetry.ReasonRetriesExhausted, saga.Failure{Reason: reason, Code: CodeDeadLettered})
}

// poison dead-letters a message that no retry can cure, like giveUp. class
// is the metric's reason class.
func (c *Client) poison(ctx context.Context, d *transport.Delivery, class, code, reason string) transport.Outcome {
	return c.deadLetter(ctx, d, class, saga.Failure{Reason: reason, Code: code})
}

func (c *Client) deadLetter(ctx context.Context, d *transport.Delivery, class string, f saga.Failure) transport.Outcome {
	attrs := logAttrs(d)
	res, err := c.process(ctx, d, nil, nil, 0, &f)
	switch {
	case err == nil && res.duplicate && !c.wasDeadLettered(ctx, d):
		// Another delivery of this message was processed meanwhile (a
		// concurrent copy, or a commit reported as failed that went
		// through): it is done, not poison.
		c.inboxOutcome(ctx, d, true)
		c.log.Info("message given up on was processed by another delivery; acknowledged", logAttrs(d)...)
		return transport.Ack()
	case err == nil:
		c.inboxOutcome(ctx, d, res.duplicate)
		if !res.duplicate {
			c.relay.Wake()
		}
	case store.IsDataError(err) && ctx.Err() == nil:
		// Postgres refuses the message's own data (text it cannot hold, a
		// step too long for the barrier's key): every retry would fail the
		// same way. It cannot be recorded nor answered, only dead-lettered.
		f.Reason += " (not recorded nor answered: the database refuses the message)"
		attrs = append(attrs, "err", err)
	default:
		return c.infraRetry(ctx, d, err)
	}
	span := trace.SpanFromContext(ctx)
	span.SetAttributes(telemetry.AttrOutcome.String(telemetry.OutcomeDeadLetter), telemetry.AttrReason.String(class))
	span.SetStatus(codes.Error, f.Reason)
	c.tel.DeadLetter(ctx, c.cfg.Schema, componentName, class)
	c.tel.Handled(ctx, c.cfg.Schema, componentName, d.Type, telemetry.OutcomeDeadLetter)
	c.log.Error("message dead-lettered", append(attrs, "reason", f.Reason, "reason_class", class, "code", f.Code)...)
	return transport.DeadLetter(f.Reason)
}

// wasDeadLettered reports whether an earlier delivery of d was given up on
// (dead-lettered); a failure to read says yes, so that the message is
// dead-lettered again rather than dropped.
func (c *Client) wasDeadLettered(ctx context.Context, d *transport.Delivery) bool {
	a, err := c.store.InboxAttemptGet(ctx, d.MessageID)
	if errors.Is(err, message.ErrNotFound) {
		return false
	}
	return err != nil || a.DeadLetteredAt != nil
}

// infraRetry retries a delivery that failed for want of Postgres, pacing
// such retries by the number of consecutive ones.
func (c *Client) infraRetry(ctx context.Context, d *transport.Delivery, err error) transport.Outcome {
	if ctx.Err() != nil {
		return transport.Retry(0)
	}
	n := c.infraFailures.Add(1)
	delay := retryDelay(c.cfg.Retry, int(min(n, 64)))
	if err != nil {
		telemetry.Fail(trace.SpanFromContext(ctx), err)
	}
	c.retried(ctx, d, telemetry.CauseDatabase)
	if err != nil {
		c.log.Warn("cannot process message; retrying", append(logAttrs(d), "retry_in", delay, "err", err)...)
	}
	// The database is down for every message: hold this one (and the
	// worker) for the delay, then put it back, rather than cycling the
	// whole backlog through the broker's retry queues.
	lifecycle.Pause(ctx, delay)
	return transport.Retry(0)
}

// process runs the processing transaction of d, again at once when it
// fails with a serialization failure or a deadlock. With giveUp set it does
// not run the handler: it records d as processed and answers it with the
// failure giveUp (or with the reply the barrier already holds).
func (c *Client) process(ctx context.Context, d *transport.Delivery, h *handler, data any, attempt int, giveUp *saga.Failure) (result, error) {
	var res result
	err := c.store.InTxRetrying(ctx, serializationRetries, func(tx pgx.Tx) error {
		var err error
		res, err = c.processTx(ctx, tx, d, h, data, attempt, giveUp)
		return err
	})
	if err == nil {
		c.infraFailures.Store(0)
	}
	return res, err
}

func (c *Client) processTx(ctx context.Context, tx pgx.Tx, d *transport.Delivery, h *handler, data any, attempt int, giveUp *saga.Failure) (result, error) {
	dup, err := c.store.InboxRecord(ctx, tx, &d.Envelope)
	if err != nil || dup {
		return result{duplicate: dup}, err
	}
	if giveUp != nil {
		if err := c.store.InboxAttemptMarkDeadLettered(ctx, tx, &d.Envelope, giveUp.Reason); err != nil {
			return result{}, err
		}
	}
	switch d.Kind {
	case message.KindCommand:
		return c.action(ctx, tx, d, h, data, attempt, giveUp)
	case message.KindCompensation:
		return c.compensation(ctx, tx, d, h, data, attempt, giveUp)
	}
	if giveUp != nil {
		return result{note: "dead-lettered"}, nil
	}
	if err := c.callIsolated(ctx, tx, h, d, data, attempt); err != nil {
		return result{}, err
	}
	return result{note: "applied"}, nil
}

// action processes a step's action behind the barrier: the first action
// message of a (saga, step) runs the handler; every later one (a re-send
// after a timeout, or an action arriving after its compensation) gets the
// reply recorded in the barrier and runs nothing.
func (c *Client) action(ctx context.Context, tx pgx.Tx, d *transport.Delivery, h *handler, data any, attempt int, giveUp *saga.Failure) (result, error) {
	mark := store.BarrierMark{
		SagaID: d.SagaID, Step: d.Step, Phase: store.BarrierAction, MessageID: d.MessageID, Outcome: store.BarrierApplied,
	}
	inserted, err := c.store.BarrierInsert(ctx, tx, mark)
	if err != nil {
		return result{}, err
	}
	if !inserted {
		prev, err := c.store.BarrierGet(ctx, tx, d.SagaID, d.Step, store.BarrierAction)
		if err != nil {
			return result{}, err
		}
		note := "action already handled for this saga step; answered with the first reply"
		if prev.Outcome == store.BarrierBlocked {
			note = "action arrived after its compensation; not applied"
		}
		return result{note: note}, c.reply(ctx, tx, d, prev.ReplyKind, prev.ReplyPayload)
	}

	switch {
	case giveUp != nil:
		mark.Outcome, mark.ReplyKind, mark.ReplyPayload = store.BarrierRejected, message.KindReplyFailure, encodeFailure(*giveUp)
	default:
		// The handler runs under a savepoint so that a rejection keeps the
		// inbox record and barrier mark but none of the handler's writes.
		sp, err := tx.Begin(ctx)
		if err != nil {
			return result{}, fmt.Errorf("create savepoint: %w", err)
		}
		reply, herr := c.call(ctx, sp, h, d, data, attempt)
		switch {
		case herr == nil:
			if err := sp.Commit(ctx); err != nil {
				return result{}, fmt.Errorf("release savepoint: %w", err)
			}
			mark.ReplyKind, mark.ReplyPayload = message.KindReplySuccess, reply
		case errors.Is(herr, saga.ErrRejected):
			if err := sp.Rollback(ctx); err != nil {
				return result{}, fmt.Errorf("roll back to savepoint after a rejection: %w", err)
			}
			mark.Outcome, mark.ReplyKind, mark.ReplyPayload = store.BarrierRejected, message.KindReplyFailure, encodeFailure(failureOf(herr))
		default:
			return result{}, herr
		}
	}
	if err := c.store.BarrierUpdate(ctx, tx, mark); err != nil {
		return result{}, err
	}
	res := result{note: string(mark.Outcome), rejected: giveUp == nil && mark.Outcome == store.BarrierRejected}
	return res, c.reply(ctx, tx, d, mark.ReplyKind, mark.ReplyPayload)
}

// compensation processes a step's compensation behind the barrier. It runs
// the handler only if the step's action was applied here, and at most once
// per (saga, step). When the action never arrived it leaves the action mark
// itself ("blocked"), so that a late action is not applied, and replies
// success: there is nothing to undo.
func (c *Client) compensation(ctx context.Context, tx pgx.Tx, d *transport.Delivery, h *handler, data any, attempt int, giveUp *saga.Failure) (result, error) {
	if giveUp != nil {
		// A compensation that failed for good leaves no mark, so that an
		// operator's retry runs it again, unless one succeeded already.
		prev, err := c.store.BarrierGet(ctx, tx, d.SagaID, d.Step, store.BarrierCompensation)
		switch {
		case err == nil:
			return result{note: "compensation already done; answered with its reply"}, c.reply(ctx, tx, d, prev.ReplyKind, prev.ReplyPayload)
		case !errors.Is(err, message.ErrNotFound):
			return result{}, err
		}
		return result{note: "compensation failed"}, c.reply(ctx, tx, d, message.KindReplyFailure, encodeFailure(*giveUp))
	}

	success := []byte("{}")
	mark := store.BarrierMark{
		SagaID: d.SagaID, Step: d.Step, Phase: store.BarrierCompensation, MessageID: d.MessageID,
		Outcome: store.BarrierApplied, ReplyKind: message.KindReplySuccess, ReplyPayload: success,
	}
	inserted, err := c.store.BarrierInsert(ctx, tx, mark)
	if err != nil {
		return result{}, err
	}
	if !inserted {
		prev, err := c.store.BarrierGet(ctx, tx, d.SagaID, d.Step, store.BarrierCompensation)
		if err != nil {
			return result{}, err
		}
		return result{note: "compensation already done; answered with its reply"}, c.reply(ctx, tx, d, prev.ReplyKind, prev.ReplyPayload)
	}

	blocked, err := c.store.BarrierInsert(ctx, tx, store.BarrierMark{
		SagaID: d.SagaID, Step: d.Step, Phase: store.BarrierAction, MessageID: d.MessageID, Outcome: store.BarrierBlocked,
		ReplyKind: message.KindReplyFailure,
		ReplyPayload: encodeFailure(saga.Failure{
			Reason: fmt.Sprintf("compensated before it ran: step %q of saga %s was compensated before this action arrived", d.Step, d.SagaID),
			Code:   CodeCompensatedBeforeRun,
		}),
	})
	if err != nil {
		return result{}, err
	}
	note := "compensated"
	if blocked {
		mark.Outcome, note = store.BarrierSkipped, "null compensation: the action never ran here"
	} else {
		act, err := c.store.BarrierGet(ctx, tx, d.SagaID, d.Step, store.BarrierAction)
		if err != nil {
			return result{}, err
		}
		if act.Outcome == store.BarrierApplied {
			if err := c.callIsolated(ctx, tx, h, d, data, attempt); err != nil {
				return result{}, err
			}
		} else {
			mark.Outcome, note = store.BarrierSkipped, "nothing to compensate: the action was "+string(act.Outcome)
		}
	}
	if mark.Outcome != store.BarrierApplied {
		if err := c.store.BarrierUpdate(ctx, tx, mark); err != nil {
			return result{}, err
		}
	}
	return result{note: note}, c.reply(ctx, tx, d, message.KindReplySuccess, success)
}

// call runs the handler, turning a panic into an error.
func (c *Client) call(ctx context.Context, tx pgx.Tx, h *handler, d *transport.Delivery, data any, attempt int) (reply []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("handler panicked", append(logAttrs(d), "panic", fmt.Sprint(r), "stack", string(debug.Stack()))...)
			err = fmt.Errorf("handler of %s %q panicked: %v", d.Kind, d.Type, r)
		}
	}()
	return h.call(ctx, tx, &d.Envelope, data, attempt)
}

// callIsolated runs a compensation or event handler under a savepoint of tx,
// as command handlers run: what the handler does to the transaction it is
// given (even calling Commit or Rollback on it) cannot end the transaction
// that also holds the inbox record, the barrier mark and the reply.
func (c *Client) callIsolated(ctx context.Context, tx pgx.Tx, h *handler, d *transport.Delivery, data any, attempt int) error {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return fmt.Errorf("create savepoint: %w", err)
	}
	if _, err := c.call(ctx, sp, h, d, data, attempt); err != nil {
		return err
	}
	if err := sp.Commit(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return fmt.Errorf("release savepoint: %w", err)
	}
	return nil
}

// reply writes the reply to d to the outbox in tx. A reply carries the type
// of the message it answers, goes to its ReplyTo, is correlated by its
// message id and copies its saga, step and attempt. Its trace context is
// ctx's (the consumer span of d), or d's own when ctx carries no span.
func (c *Client) reply(ctx context.Context, tx pgx.Tx, d *transport.Delivery, kind message.Kind, payload []byte) error {
	if d.ReplyTo == "" {
		c.log.Warn("message has no reply_to; no reply sent", logAttrs(d)...)
		return nil
	}
	traceParent, traceState := d.TraceParent, d.TraceState
	if trace.SpanContextFromContext(ctx).IsValid() {
		traceParent, traceState = telemetry.Inject(ctx)
	}
	return c.store.OutboxWrite(ctx, tx, []message.Message{{
		Envelope: message.Envelope{
			Type:          d.Type,
			Kind:          kind,
			RoutingKey:    d.ReplyTo,
			SagaID:        d.SagaID,
			SagaType:      d.SagaType,
			Step:          d.Step,
			StepIndex:     d.StepIndex,
			Attempt:       d.Attempt,
			CorrelationID: d.MessageID.String(),
			TraceParent:   traceParent,
			TraceState:    traceState,
		},
		Payload: payload,
	}})
}

func encodeFailure(f saga.Failure) []byte {
	b, err := json.Marshal(f)
	if err != nil {
		// Two strings always encode.
		panic(fmt.Sprintf("participant: encode failure reply: %v", err))
	}
	return b
}

func logAttrs(d *transport.Delivery) []any {
	if d.SagaType == "" {
		return []any{"message_id", d.MessageID.String(), "type", d.Type, "kind", string(d.Kind)}
	}
	return []any{"message_id", d.MessageID.String(), "saga_id", d.SagaID.String(), "saga_type", d.SagaType,
		"type", d.Type, "kind", string(d.Kind), "step", d.Step, "attempt", d.Attempt}
}
