package participant

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
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

// componentName is the component attribute of the Client's logs, spans and
// metrics.
const componentName = "participant"

// processor is the participant's part of the delivery engine: it runs a
// handler behind the barrier.
type processor struct{ c *Client }

// Process handles one delivery in one transaction of two round trips: the
// inbox record and the barrier mark go out with BEGIN, the reply and the
// mark's outcome with COMMIT, and the handler runs in between, under a
// savepoint. The reply takes lease, the relay's write-time lease.
//
// A message of an outside handler (HandleOutsideCommand) takes two
// transactions instead, around its outside call (deliverOutside).
func (p processor) Process(ctx context.Context, d *transport.Delivery, attempt int, lease *driver.OutboxLease) (engine.Result, error) {
	h, data, poison := p.c.dispatch(d)
	if poison != nil {
		return engine.Result{}, poison
	}
	var res engine.Result
	var err error
	if h.outside != nil {
		res, err = p.c.deliverOutside(ctx, d, h, data, attempt, lease)
	} else {
		t := p.c.db.Begin(&driver.BeginOpts{Lease: lease})
		defer t.Rollback(ctx)
		res, err = p.c.deliver(ctx, t, d, h, data, attempt)
	}
	if err == nil && p.c.testHookAfterCommit != nil {
		p.c.testHookAfterCommit(d)
	}
	return res, err
}

// ProcessBatch handles a batch of deliveries in one transaction (group
// commit, Config.MaxBatch) of two round trips besides the handlers' own
// statements: the inbox records and barrier marks of all of them go out
// with BEGIN in one statement, the handlers run one after the other, each
// under a savepoint of its own begun with its first statement, and the
// replies (under lease) and the marks' outcomes go out with COMMIT in one
// statement. A delivery whose handler fails leaves nothing (its savepoint
// is rolled back and its inbox record and marks removed) and is reported
// failed (engine.Result.Failed): that was its first attempt, and the engine
// retries it after its backoff, on its own. Deferred, processed again on
// its own at once, are a message of an outside handler, which needs
// transactions of its own, a poison message, and a second message of one
// message id or saga step in the batch, which must see the first one's
// outcome.
func (p processor) ProcessBatch(ctx context.Context, items []engine.Item, lease *driver.OutboxLease) ([]engine.Result, driver.Committed, error) {
	c := p.c
	results := make([]engine.Result, len(items))
	g := c.groupOf(items, results)
	if len(g.members) == 0 {
		return results, driver.Committed{}, nil
	}
	t := c.db.Begin(&driver.BeginOpts{Lease: lease})
	defer t.Rollback(ctx)
	dels, err := c.db.DeliveryBeginMany(ctx, t, g.envs, g.blocked)
	if err != nil {
		return nil, driver.Committed{}, err
	}
	ends, abandoned, err := c.runGroup(items, g, dels, results)
	if err != nil || abandoned {
		return results, driver.Committed{}, err
	}
	if err := c.db.DeliveryFinishMany(ctx, t, g.envs, dels, ends); err != nil {
		return nil, driver.Committed{}, err
	}
	committed, err := t.Commit(ctx)
	if err != nil {
		return nil, driver.Committed{}, err
	}
	if c.testHookAfterCommit != nil {
		for i, it := range items {
			if !results[i].Defer && results[i].Failed == nil {
				c.testHookAfterCommit(it.Delivery)
			}
		}
	}
	return results, committed, nil
}

// group is the part of a batch applied in one transaction: its members,
// with their envelopes and the replies their actions get when their
// compensations came first (driver.Executor.DeliveryBeginMany).
type group struct {
	members []member
	envs    []*message.Envelope
	blocked [][]byte
}

// member is a delivery of a group: items[at], its handler and its decoded
// payload.
type member struct {
	at   int
	h    *handler
	data any
}

// groupOf picks the deliveries of items that can be applied together and
// marks the others deferred in results: a poison message, a message of an
// outside handler, and a second message of one message id or saga step.
func (c *Client) groupOf(items []engine.Item, results []engine.Result) group {
	type stepKey struct {
		saga uuid.UUID
		step string
		run  int
	}
	var g group
	ids := make(map[uuid.UUID]bool, len(items))
	steps := make(map[stepKey]bool, len(items))
	for i, it := range items {
		d := it.Delivery
		h, data, poison := c.dispatch(d)
		key := stepKey{d.SagaID, d.Step, d.Run}
		sagaStep := d.Kind != message.KindEvent
		if poison != nil || h.outside != nil || ids[d.MessageID] || (sagaStep && steps[key]) {
			results[i].Defer = true
			continue
		}
		ids[d.MessageID] = true
		if sagaStep {
			steps[key] = true
		}
		g.members = append(g.members, member{at: i, h: h, data: data})
		g.envs = append(g.envs, &d.Envelope)
		g.blocked = append(g.blocked, blockedReply(d))
	}
	return g
}

// runGroup runs the handlers of g's members, begun as dels, one after the
// other, each ended before the next, and returns how each delivery ends.
// It reports the group abandoned when a handler timed out: pgx closed the
// group's connection under it, so the group cannot commit. That handler's
// run counts as failed, as do the runs that failed before it; the others,
// whether they ran or not, are handled again on their own.
func (c *Client) runGroup(items []engine.Item, g group, dels []*driver.Delivery, results []engine.Result) (ends []driver.DeliveryEnd, abandoned bool, err error) {
	ends = make([]driver.DeliveryEnd, len(g.members))
	for k, m := range g.members {
		it := items[m.at]
		end, res, err := c.decide(it.Ctx, it.Delivery, dels[k], m.h, m.data, 1)
		if errors.Is(err, errHandlerTimedOut) {
			for _, other := range g.members {
				if results[other.at].Failed == nil {
					results[other.at] = engine.Result{Defer: true}
				}
			}
			results[m.at] = engine.Result{Failed: err}
			return nil, true, nil
		}
		if err != nil {
			end, res = driver.DeliveryEnd{Undo: true}, engine.Result{Failed: err}
		}
		if err := c.db.DeliveryEndHandler(it.Ctx, dels[k], end); err != nil {
			return nil, false, err
		}
		ends[k], results[m.at] = end, res
	}
	return ends, false, nil
}

// deliver handles d in t, committing t: the inbox record and the barrier
// mark go out with t's first statement, the reply and the mark's outcome
// with its commit, and the handler runs in between, under a savepoint.
func (c *Client) deliver(ctx context.Context, t driver.Tx, d *transport.Delivery, h *handler, data any, attempt int) (engine.Result, error) {
	del, err := c.db.DeliveryBegin(ctx, t, &d.Envelope, blockedReply(d))
	if err != nil {
		return engine.Result{}, err
	}
	end, res, err := c.decide(ctx, d, del, h, data, attempt)
	if err != nil {
		return engine.Result{}, err
	}
	return c.finish(ctx, t, d, del, end, res)
}

// decide runs d's handler, when the inbox and the barrier say it runs, and
// returns how its delivery del ends.
func (c *Client) decide(ctx context.Context, d *transport.Delivery, del *driver.Delivery, h *handler, data any, attempt int) (driver.DeliveryEnd, engine.Result, error) {
	if del.Duplicate {
		return driver.DeliveryEnd{}, engine.Result{Outcome: telemetry.OutcomeDuplicate}, nil
	}
	switch d.Kind {
	case message.KindCommand:
		return c.action(ctx, d, del, h, data, attempt)
	case message.KindCompensation:
		return c.compensation(ctx, d, del, h, data, attempt)
	}
	if err := c.callErr(ctx, del, h, d, data, attempt); err != nil {
		return driver.DeliveryEnd{}, engine.Result{}, err
	}
	return driver.DeliveryEnd{}, engine.Result{Outcome: telemetry.OutcomeApplied, Note: "event handled"}, nil
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

// finish ends the delivery begun in t and commits t: res, with what the
// commit wrote to the outbox.
func (c *Client) finish(ctx context.Context, t driver.Tx, d *transport.Delivery, del *driver.Delivery, end driver.DeliveryEnd, res engine.Result) (engine.Result, error) {
	if err := c.db.DeliveryFinish(ctx, t, &d.Envelope, del, end); err != nil {
		return engine.Result{}, err
	}
	committed, err := t.Commit(ctx)
	if err != nil {
		return engine.Result{}, err
	}
	res.Committed = res.Committed.Add(committed)
	return res, nil
}

// action processes a step's action behind the barrier: the first action
// message of a (saga, step) runs the handler; every later one (a re-send
// after a timeout, or an action arriving after its compensation) gets the
// reply recorded in the barrier and runs nothing.
func (c *Client) action(ctx context.Context, d *transport.Delivery, del *driver.Delivery, h *handler, data any, attempt int) (driver.DeliveryEnd, engine.Result, error) {
	if !del.Marked {
		note := "action already handled for this saga step; answered with the first reply"
		if del.Prior.Outcome == driver.BarrierBlocked {
			note = "action arrived after its compensation; not applied"
		}
		return driver.DeliveryEnd{Reply: c.reply(ctx, d, del.Prior.ReplyKind, del.Prior.ReplyPayload)},
			engine.Result{Outcome: telemetry.OutcomeApplied, Note: note}, nil
	}
	reply, err := c.call(ctx, del.Tx, h, d, data, attempt)
	switch {
	case err == nil:
		mark := &driver.BarrierMark{Outcome: driver.BarrierApplied, ReplyKind: message.KindReplySuccess, ReplyPayload: reply}
		return driver.DeliveryEnd{Mark: mark, Reply: c.reply(ctx, d, mark.ReplyKind, reply)},
			engine.Result{Outcome: telemetry.OutcomeApplied, Note: "applied"}, nil
	case errors.Is(err, saga.ErrRejected):
		// The rejection keeps the inbox record and the barrier mark but none
		// of the handler's writes.
		failure := encodeFailure(failureOf(err))
		mark := &driver.BarrierMark{Outcome: driver.BarrierRejected, ReplyKind: message.KindReplyFailure, ReplyPayload: failure}
		return driver.DeliveryEnd{Discard: true, Mark: mark, Reply: c.reply(ctx, d, mark.ReplyKind, failure)},
			engine.Result{Outcome: telemetry.OutcomeRejected, Note: "rejected"}, nil
	}
	return driver.DeliveryEnd{}, engine.Result{}, err
}

// compensation processes a step's compensation behind the barrier. It runs
// the handler only if the step's action was applied here, and at most once
// per (saga, step). When the action never arrived the barrier left the
// action's mark itself ("blocked"), so that a late action is not applied,
// and the compensation succeeds: there is nothing to undo.
func (c *Client) compensation(ctx context.Context, d *transport.Delivery, del *driver.Delivery, h *handler, data any, attempt int) (driver.DeliveryEnd, engine.Result, error) {
	if !del.Marked {
		return driver.DeliveryEnd{Reply: c.reply(ctx, d, del.Prior.ReplyKind, del.Prior.ReplyPayload)},
			engine.Result{Outcome: telemetry.OutcomeApplied, Note: "compensation already done; answered with its reply"}, nil
	}
	success := []byte("{}")
	end := driver.DeliveryEnd{Reply: c.reply(ctx, d, message.KindReplySuccess, success)}
	note := "compensated"
	switch del.Action {
	case driver.BarrierApplied:
		if err := c.callErr(ctx, del, h, d, data, attempt); err != nil {
			return driver.DeliveryEnd{}, engine.Result{}, err
		}
	case driver.BarrierBlocked:
		end.Mark, note = &driver.BarrierMark{Outcome: driver.BarrierSkipped, ReplyKind: message.KindReplySuccess, ReplyPayload: success},
			"null compensation: the action never ran here"
	case driver.BarrierStarted:
		// The action calls an outside system and its outcome is not
		// recorded yet: wait for it rather than guess.
		return driver.DeliveryEnd{}, engine.Result{}, errActionInFlight(d)
	default:
		end.Mark, note = &driver.BarrierMark{Outcome: driver.BarrierSkipped, ReplyKind: message.KindReplySuccess, ReplyPayload: success},
			"nothing to compensate: the action was "+string(del.Action)
	}
	return end, engine.Result{Outcome: telemetry.OutcomeApplied, Note: note}, nil
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
	t := c.db.Begin(nil)
	defer t.Rollback(ctx)
	h := c.lookup(d.Kind, d.Type)
	outside := h != nil && h.outside != nil
	fresh := false
	var err error
	if outside {
		// An entry left "started" by the call given up on is this
		// message's, not a duplicate.
		if fresh, err = c.db.InboxSettleStarted(ctx, t, &d.Envelope); err != nil {
			return engine.Result{}, err
		}
	}
	if !fresh {
		if fresh, err = c.db.InboxRecord(ctx, t, &d.Envelope); err != nil {
			return engine.Result{}, err
		}
	}
	if !fresh {
		return c.finish(ctx, t, d, nil, driver.DeliveryEnd{}, engine.Result{Outcome: telemetry.OutcomeDuplicate})
	}
	if err := c.db.AttemptMarkDeadLettered(ctx, t, &d.Envelope, poison.Reason); err != nil {
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
		left, err := c.db.BarrierLeave(ctx, t, &d.Envelope, driver.BarrierMark{Outcome: driver.BarrierRejected, ReplyKind: message.KindReplyFailure, ReplyPayload: failure})
		if err != nil {
			return engine.Result{}, err
		}
		end.Reply = c.reply(ctx, d, message.KindReplyFailure, failure)
		if !left {
			prior, err := c.db.BarrierGet(ctx, t, &d.Envelope, message.PhaseAction)
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
			if err := c.db.BarrierDropStarted(ctx, t, &d.Envelope); err != nil {
				return engine.Result{}, err
			}
		}
		prior, err := c.db.BarrierGet(ctx, t, &d.Envelope, message.PhaseCompensation)
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

// call runs the handler in tx under Config.HandlerTimeout, turning a panic
// into an error and a run past its timeout into errHandlerTimedOut, and
// records its duration (sagabox.handler.duration).
func (c *Client) call(ctx context.Context, tx pgx.Tx, h *handler, d *transport.Delivery, data any, attempt int) (reply []byte, err error) {
	start := time.Now()
	hctx, timedOut, cancel := c.handlerContext(ctx, d)
	defer cancel()
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("handler panicked", "message_id", d.MessageID.String(), "type", d.Type, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			err = fmt.Errorf("handler of %s %q panicked: %v", d.Kind, d.Type, r)
		}
		err = timedOut(err)
		outcome := telemetry.HandlerOK
		switch {
		case errors.Is(err, saga.ErrRejected):
			outcome = telemetry.HandlerRejected
		case err != nil:
			outcome = telemetry.HandlerError
		}
		c.tel.HandlerDone(ctx, c.cfg.Schema, d.Type, string(d.Kind), outcome, time.Since(start))
	}()
	return h.call(hctx, tx, &d.Envelope, data, attempt)
}

// errHandlerTimedOut is the failure of a handler run that returned after
// Config.HandlerTimeout.
var errHandlerTimedOut = errors.New("handler timed out")

// handlerContext returns the context of one handler run of d: ctx, ended
// after Config.HandlerTimeout. timedOut turns the run's error into one
// wrapping errHandlerTimedOut when that timeout ended the context, whatever
// the handler returned: its statement was cancelled and pgx closed the
// delivery's connection, so the transaction cannot commit, and a nil or a
// connection error would not count the run as failed. cancel releases the
// context.
func (c *Client) handlerContext(ctx context.Context, d *transport.Delivery) (hctx context.Context, timedOut func(error) error, cancel context.CancelFunc) {
	if c.cfg.HandlerTimeout < 0 {
		return ctx, func(err error) error { return err }, func() {}
	}
	hctx, cancel = context.WithTimeoutCause(ctx, c.cfg.HandlerTimeout, errHandlerTimedOut)
	timedOut = func(err error) error {
		if ctx.Err() != nil || !errors.Is(context.Cause(hctx), errHandlerTimedOut) {
			return err
		}
		c.log.Warn("handler timed out", "message_id", d.MessageID.String(), "type", d.Type, "timeout", c.cfg.HandlerTimeout)
		if err == nil {
			return fmt.Errorf("%w: the handler of %s %q returned after its timeout of %s (participant.Config.HandlerTimeout)", errHandlerTimedOut, d.Kind, d.Type, c.cfg.HandlerTimeout)
		}
		// Its text only: the run's own error (a rejection among them) no longer
		// decides anything.
		return fmt.Errorf("%w: the handler of %s %q did not return within its timeout of %s (participant.Config.HandlerTimeout): %s", errHandlerTimedOut, d.Kind, d.Type, c.cfg.HandlerTimeout, err.Error())
	}
	return hctx, timedOut, cancel
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
