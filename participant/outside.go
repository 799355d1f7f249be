package participant

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sagabox/sagabox/internal/engine"
	"github.com/sagabox/sagabox/internal/telemetry"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store/driver"
	"github.com/sagabox/sagabox/transport"
)

// OutsideRequest is a message handed to a handler that calls an outside
// system (HandleOutsideCommand, HandleOutsideCompensation).
type OutsideRequest[T any] struct {
	Request[T]
	// IdempotencyKey is the same for every delivery of this saga step's
	// phase, whatever message carries it (a redelivery, a re-send after a
	// timeout): IdempotencyKey(SagaID, Run, Step, phase). Pass it to the outside
	// system so that a call made again has no second effect there.
	IdempotencyKey string
	// Resumed is true when an earlier delivery of this message began the
	// call and did not record its outcome (the process died, the call
	// failed, or the commit after it did): the outside system may have acted
	// already. Ask it, or rely on its idempotency.
	Resumed bool
}

// OutsideCallFunc makes a saga step's action in an outside system, outside
// any database transaction, and returns the success reply; Reject(err) for
// a business "no" (the saga compensates); any other error is transient and
// the call is made again, with the same idempotency key.
type OutsideCallFunc[Req, Reply any] func(ctx context.Context, req *OutsideRequest[Req]) (Reply, error)

// RecordCallFunc records the outcome of a successful outside call in tx,
// the transaction that also writes the reply and marks the inbox entry
// done: the service's own writes (a charge row). It cannot reject: every
// error is transient, and the call is made again before it runs again.
type RecordCallFunc[Req, Reply any] func(ctx context.Context, tx pgx.Tx, req *OutsideRequest[Req], reply Reply) error

// OutsideUndoFunc undoes a step's action in an outside system, outside any
// database transaction. Every error is transient.
type OutsideUndoFunc[Req any] func(ctx context.Context, req *OutsideRequest[Req]) error

// RecordUndoFunc records a successful undo in tx, as RecordCallFunc does.
type RecordUndoFunc[Req any] func(ctx context.Context, tx pgx.Tx, req *OutsideRequest[Req]) error

// IdempotencyKey is the idempotency key of a saga step's phase in a run of
// the saga (message.Envelope.Run): the same for every message and delivery
// of that phase, different for the action and the compensation of one step,
// and for each run an operator's restart begins: "<saga>/<step>/<phase>",
// with "/run-<n>" appended from run 1 on.
func IdempotencyKey(sagaID uuid.UUID, run int, step string, phase message.Phase) string {
	key := sagaID.String() + "/" + step + "/" + string(phase)
	if run > 0 {
		key += "/run-" + strconv.Itoa(run)
	}
	return key
}

// outsideHandler is the part of a handler registered with
// HandleOutsideCommand or HandleOutsideCompensation, types erased.
type outsideHandler struct {
	// call makes the outside call; reply is the success reply payload and
	// result the typed reply, for record.
	call func(ctx context.Context, req *outsideReq) (reply []byte, result any, err error)
	// record, nil when none was given, records the call's outcome in tx.
	record func(ctx context.Context, tx pgx.Tx, req *outsideReq, result any) error
}

// outsideReq is an OutsideRequest with its types erased.
type outsideReq struct {
	env     *message.Envelope
	data    any
	attempt int
	key     string
	resumed bool
}

func typedOutside[T any](r *outsideReq) *OutsideRequest[T] {
	return &OutsideRequest[T]{
		Request:        Request[T]{Envelope: *r.env, Data: as[T](r.data), DeliveryAttempt: r.attempt},
		IdempotencyKey: r.key,
		Resumed:        r.resumed,
	}
}

// HandleOutsideCommand registers the handler of cmd's commands for a step
// whose effect is in an outside system (a payment provider's API). Each
// delivery takes two transactions instead of one: the inbox entry and the
// barrier mark are committed, "started", before call runs outside any
// transaction, with an idempotency key of the saga step; then record (which
// may be nil) writes the call's local effect in a second transaction with
// the reply, and the entry becomes "done". A duplicate of a done message is
// acknowledged before anything is called; a message whose entry is still
// "started" calls again with the same key and Resumed set. A re-send of the
// step (after a timeout) while its first message's call is in flight is
// retried until that one is recorded, then answered with its reply. It
// panics like HandleCommand, and if call is nil.
func HandleOutsideCommand[Req, Reply any](c *Client, cmd saga.Command[Req, Reply], call OutsideCallFunc[Req, Reply], record RecordCallFunc[Req, Reply]) {
	if call == nil {
		panic("participant: HandleOutsideCommand: call is nil")
	}
	o := &outsideHandler{
		call: func(ctx context.Context, r *outsideReq) ([]byte, any, error) {
			reply, err := call(ctx, typedOutside[Req](r))
			if err != nil {
				return nil, nil, err
			}
			b, err := cmd.EncodeReply(reply)
			if err != nil {
				return nil, nil, fmt.Errorf("outside call of %s returned a reply that does not encode: %w", cmd.Name(), err)
			}
			return b, reply, nil
		},
	}
	if record != nil {
		o.record = func(ctx context.Context, tx pgx.Tx, r *outsideReq, result any) error {
			return record(ctx, tx, typedOutside[Req](r), as[Reply](result))
		}
	}
	c.register(&handler{
		kind:    message.KindCommand,
		typ:     cmd.Name(),
		decode:  func(payload []byte) (any, error) { return cmd.DecodeRequest(payload) },
		outside: o,
	})
}

// HandleOutsideCompensation registers the handler of cmd's compensation
// messages for a step whose action was done in an outside system: undo runs
// outside any transaction, with the compensation's own idempotency key,
// and record (which may be nil) in a second transaction, as for
// HandleOutsideCommand. As with HandleCompensation, undo runs only if the
// action was applied here, at most once per saga step; a compensation that
// arrives while its action's outside call is in flight (its mark
// "started") waits for it: it is retried, with backoff, until the action is
// recorded. It panics like HandleCompensation, and if undo is nil.
func HandleOutsideCompensation[Req, R any](c *Client, cmd saga.Command[Req, R], undo OutsideUndoFunc[Req], record RecordUndoFunc[Req]) {
	if undo == nil {
		panic("participant: HandleOutsideCompensation: undo is nil")
	}
	o := &outsideHandler{
		call: func(ctx context.Context, r *outsideReq) ([]byte, any, error) {
			return []byte("{}"), nil, undo(ctx, typedOutside[Req](r))
		},
	}
	if record != nil {
		o.record = func(ctx context.Context, tx pgx.Tx, r *outsideReq, _ any) error {
			return record(ctx, tx, typedOutside[Req](r))
		}
	}
	c.register(&handler{
		kind:    message.KindCompensation,
		typ:     cmd.Name(),
		decode:  func(payload []byte) (any, error) { return cmd.DecodeRequest(payload) },
		outside: o,
	})
}

// errInFlight says that a step's phase is being handled by another message
// whose outside call is in flight; the delivery is retried with backoff.
type errInFlight struct{ what string }

func (e errInFlight) Error() string { return e.what }

// deliverOutside handles d, a message of an outside handler, in two
// transactions around the outside call: the first records the inbox entry
// and the barrier mark "started" (or ends the delivery, when nothing is to
// be called), the second records the call's outcome, the reply and the
// entry "done".
func (c *Client) deliverOutside(ctx context.Context, d *transport.Delivery, h *handler, data any, attempt int, lease *driver.OutboxLease) (engine.Result, error) {
	t := c.db.Begin(&driver.BeginOpts{Lease: lease})
	defer t.Rollback(ctx)
	del, err := c.db.DeliveryBeginOutside(ctx, t, &d.Envelope, blockedReply(d))
	if err != nil {
		return engine.Result{}, err
	}
	if del.Duplicate {
		return c.finish(ctx, t, d, del, driver.DeliveryEnd{}, engine.Result{Outcome: telemetry.OutcomeDuplicate})
	}
	if !del.Resumed {
		if res, done, err := c.beginOutside(ctx, t, d, del); done || err != nil {
			return res, err
		}
	}
	// The first commit: the entry and the mark are "started" before the
	// call, so that a duplicate is caught before the side effect.
	if _, err := t.Commit(ctx); err != nil {
		return engine.Result{}, err
	}
	req := &outsideReq{env: &d.Envelope, data: data, attempt: attempt,
		key: IdempotencyKey(d.SagaID, d.Run, d.Step, d.Kind.Phase()), resumed: del.Resumed}
	reply, result, err := c.callOutside(ctx, h, d, req)
	var rejected error
	switch {
	case err == nil:
	case errors.Is(err, saga.ErrRejected) && d.Kind == message.KindCommand:
		rejected = err
	case errors.Is(err, saga.ErrRejected):
		return engine.Result{}, fmt.Errorf("a %s cannot reject, retrying it: %w", d.Kind, err)
	default:
		return engine.Result{}, err
	}
	if c.testHookAfterCall != nil {
		if err := c.testHookAfterCall(d); err != nil {
			return engine.Result{}, err
		}
	}
	return c.recordOutside(ctx, d, h, req, reply, result, rejected, lease)
}

// beginOutside decides, in the first transaction, what a fresh message of
// an outside handler does: done reports that the delivery ended in t (an
// action answered from the barrier, a compensation with nothing to undo);
// an errInFlight that it waits for another message's call; neither that the
// call is made.
func (c *Client) beginOutside(ctx context.Context, t driver.Tx, d *transport.Delivery, del *driver.Delivery) (res engine.Result, done bool, err error) {
	if !del.Marked {
		if del.Prior.Outcome == driver.BarrierStarted {
			return engine.Result{}, false, errInFlight{fmt.Sprintf(
				"the %s of step %q of saga %s is in flight under another message (its outside call is not recorded yet); retrying", d.Kind.Phase(), d.Step, d.SagaID)}
		}
		note := "already handled for this saga step; answered with the first reply"
		if del.Prior.Outcome == driver.BarrierBlocked {
			note = "action arrived after its compensation; not called"
		}
		res, err := c.finish(ctx, t, d, del, driver.DeliveryEnd{Settle: true, Reply: c.reply(ctx, d, del.Prior.ReplyKind, del.Prior.ReplyPayload)},
			engine.Result{Outcome: telemetry.OutcomeApplied, Note: note})
		return res, true, err
	}
	if d.Kind != message.KindCompensation {
		return engine.Result{}, false, nil
	}
	switch del.Action {
	case driver.BarrierApplied:
		return engine.Result{}, false, nil
	case driver.BarrierStarted:
		return engine.Result{}, false, errActionInFlight(d)
	}
	success := []byte("{}")
	note := "nothing to compensate: the action was " + string(del.Action)
	if del.Action == driver.BarrierBlocked {
		note = "null compensation: the action never ran here"
	}
	res, err = c.finish(ctx, t, d, del, driver.DeliveryEnd{
		Settle: true,
		Mark:   &driver.BarrierMark{Outcome: driver.BarrierSkipped, ReplyKind: message.KindReplySuccess, ReplyPayload: success},
		Reply:  c.reply(ctx, d, message.KindReplySuccess, success),
	}, engine.Result{Outcome: telemetry.OutcomeApplied, Note: note})
	return res, true, err
}

// errActionInFlight is the error of a compensation that waits for its
// action's outside call: the compensation is retried until the action is
// recorded (applied: undone; rejected: nothing to undo).
func errActionInFlight(d *transport.Delivery) error {
	return errInFlight{fmt.Sprintf(
		"the action of step %q of saga %s is in flight (its outside call is not recorded yet); the compensation waits for it", d.Step, d.SagaID)}
}

// recordOutside is the second transaction: the handler's writes (none for a
// rejection), the barrier mark's outcome, the reply (under lease) and the
// entry "done".
// Another delivery of d that recorded its call first makes this one a
// duplicate.
func (c *Client) recordOutside(ctx context.Context, d *transport.Delivery, h *handler, req *outsideReq, reply []byte, result any, rejected error, lease *driver.OutboxLease) (engine.Result, error) {
	t := c.db.Begin(&driver.BeginOpts{Lease: lease})
	defer t.Rollback(ctx)
	del, err := c.db.DeliveryResume(ctx, t, &d.Envelope)
	if err != nil {
		return engine.Result{}, err
	}
	if del.Duplicate {
		return c.finish(ctx, t, d, del, driver.DeliveryEnd{}, engine.Result{Outcome: telemetry.OutcomeDuplicate,
			Note: "another delivery of the message recorded its outside call first"})
	}
	if rejected != nil {
		failure := encodeFailure(failureOf(rejected))
		mark := &driver.BarrierMark{Outcome: driver.BarrierRejected, ReplyKind: message.KindReplyFailure, ReplyPayload: failure}
		return c.finish(ctx, t, d, del, driver.DeliveryEnd{Discard: true, Mark: mark, Reply: c.reply(ctx, d, mark.ReplyKind, failure)},
			engine.Result{Outcome: telemetry.OutcomeRejected, Note: "rejected by the outside call"})
	}
	if h.outside.record != nil {
		if err := c.recordCall(ctx, del.Tx, h, d, req, result); err != nil {
			return engine.Result{}, err
		}
	}
	mark := &driver.BarrierMark{Outcome: driver.BarrierApplied, ReplyKind: message.KindReplySuccess, ReplyPayload: reply}
	note := "applied"
	if d.Kind == message.KindCompensation {
		note = "compensated"
	}
	return c.finish(ctx, t, d, del, driver.DeliveryEnd{Mark: mark, Reply: c.reply(ctx, d, mark.ReplyKind, reply)},
		engine.Result{Outcome: telemetry.OutcomeApplied, Note: note})
}

// callOutside makes the outside call under Config.HandlerTimeout, turning
// a panic into an error and an error past the timeout into
// errHandlerTimedOut. A result (a success or a rejection) is kept even past
// the timeout: no transaction is open, and an outcome the outside system
// reported must be recorded.
func (c *Client) callOutside(ctx context.Context, h *handler, d *transport.Delivery, req *outsideReq) (reply []byte, result any, err error) {
	hctx, timedOut, cancel := c.handlerContext(ctx, d)
	defer cancel()
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("outside call panicked", "message_id", d.MessageID.String(), "type", d.Type, "idempotency_key", req.key, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			err = fmt.Errorf("outside call of %s %q panicked: %v", d.Kind, d.Type, r)
		}
		if err != nil && !errors.Is(err, saga.ErrRejected) {
			// A connection error of the call's own (a client that
			// connects with its context) would otherwise count as a
			// database outage, retried uncounted for ever.
			err = timedOut(err)
		}
	}()
	return h.outside.call(hctx, req)
}

// recordCall runs the handler's record function in tx under
// Config.HandlerTimeout, turning a panic into an error, a run past its
// timeout into errHandlerTimedOut and a rejection into a transient error:
// the call was made.
func (c *Client) recordCall(ctx context.Context, tx pgx.Tx, h *handler, d *transport.Delivery, req *outsideReq, result any) (err error) {
	hctx, timedOut, cancel := c.handlerContext(ctx, d)
	defer cancel()
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("record of outside call panicked", "message_id", d.MessageID.String(), "type", d.Type, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			err = fmt.Errorf("record of %s %q panicked: %v", d.Kind, d.Type, r)
		}
		err = timedOut(err)
	}()
	err = h.outside.record(hctx, tx, req, result)
	if errors.Is(err, saga.ErrRejected) {
		return fmt.Errorf("the record of an outside call cannot reject (the call was made), retrying it: %w", err)
	}
	return err
}
