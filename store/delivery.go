package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sagabox/sagabox/store/driver"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store/internal/dbsqlc"
)

// handlerSavepoint is the savepoint a handler runs under.
const handlerSavepoint = "sagabox_handler"

// DeliveryBegin begins t, the delivery of env at a participant, in one
// round trip with BEGIN: it records env in the inbox and, for a saga step's
// command or compensation seen for the first time, leaves the step's
// barrier mark (a compensation also leaves the action's mark, blocked, with
// the failure reply blockedReply, when the action never arrived). It ends
// with the savepoint the handler runs in. A concurrent delivery of the same
// message, or of the same step's action and compensation, waits for the
// other's transaction to end.
func (s *executor) DeliveryBegin(ctx context.Context, t driver.Tx, env *message.Envelope, blockedReply []byte) (*driver.Delivery, error) {
	return s.beginDelivery(ctx, t, env, blockedReply, false)
}

// DeliveryBeginOutside is DeliveryBegin for a handler that calls an outside
// system: the inbox entry and the barrier mark it leaves are "started", so
// that t can commit before the call, and a message whose entry is still
// "started" is resumed, not a duplicate. It begins no savepoint.
func (s *executor) DeliveryBeginOutside(ctx context.Context, t driver.Tx, env *message.Envelope, blockedReply []byte) (*driver.Delivery, error) {
	return s.beginDelivery(ctx, t, env, blockedReply, true)
}

func (s *executor) beginDelivery(ctx context.Context, t driver.Tx, env *message.Envelope, blockedReply []byte, started bool) (*driver.Delivery, error) {
	db := txOf(t).execThen("savepoint " + handlerSavepoint)
	if started {
		db = txOf(t).exec(ctx, false)
	}
	d := &driver.Delivery{}
	var err error
	switch env.Kind {
	case message.KindCommand:
		var r *dbsqlc.DeliveryBeginActionRow
		r, err = s.queries.DeliveryBeginAction(ctx, db, &dbsqlc.DeliveryBeginActionParams{
			MessageID: env.MessageID, Type: env.Type, SagaID: env.SagaID, Step: barrierStep(env), Started: started,
		})
		if err == nil {
			d.Duplicate, d.Marked, d.Resumed, d.Attempt = !r.Fresh && !r.Resumed, r.Marked, r.Resumed, int(r.InboxAttempt)
			d.Prior = driver.BarrierMark{Outcome: driver.BarrierOutcome(r.Outcome), ReplyKind: message.Kind(r.ReplyKind), ReplyPayload: r.ReplyPayload}
		}
	case message.KindCompensation:
		var r *dbsqlc.DeliveryBeginCompensationRow
		r, err = s.queries.DeliveryBeginCompensation(ctx, db, &dbsqlc.DeliveryBeginCompensationParams{
			MessageID: env.MessageID, Type: env.Type, SagaID: env.SagaID, Step: barrierStep(env), BlockedReply: blockedReply, Started: started,
		})
		if err == nil {
			d.Duplicate, d.Marked, d.Resumed, d.Attempt = !r.Fresh && !r.Resumed, r.Marked, r.Resumed, int(r.InboxAttempt)
			d.Prior = driver.BarrierMark{Outcome: driver.BarrierOutcome(r.Outcome), ReplyKind: message.Kind(r.ReplyKind), ReplyPayload: r.ReplyPayload}
			d.Action = driver.BarrierOutcome(r.ActionOutcome)
			if r.ActionBlocked {
				d.Action = driver.BarrierBlocked
			}
		}
	default:
		var fresh bool
		fresh, err = s.queries.InboxRecord(ctx, db, inboxParams(env))
		d.Duplicate = !fresh
	}
	if err != nil {
		return nil, fmt.Errorf("begin delivery of message %s in schema %q: %w", env.MessageID, s.schema, err)
	}
	if d.Marked || d.Resumed {
		d.Prior = driver.BarrierMark{}
	}
	d.Tx = &handlerTx{Tx: txOf(t).tx, t: txOf(t), closed: started}
	return d, nil
}

// DeliveryResume begins t, the transaction that records the outcome of the
// outside call of env, in one round trip with BEGIN: it marks env's
// "started" inbox entry "done", locks it, and ends with the handler's
// savepoint. Delivery.Duplicate is set when the entry was not "started".
func (s *executor) DeliveryResume(ctx context.Context, t driver.Tx, env *message.Envelope) (*driver.Delivery, error) {
	n, err := s.queries.DeliveryResume(ctx, txOf(t).execThen("savepoint "+handlerSavepoint), env.MessageID)
	d := &driver.Delivery{Marked: true, Resumed: true, Attempt: int(n)}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// Another delivery of the message, begun while this one's entry
		// was 'started' too, recorded first: this one was a duplicate
		// after all, and counts as one.
		d.Duplicate, d.Marked = true, false
		if err := s.queries.InboxCountDuplicate(ctx, txOf(t).exec(ctx, false), env.MessageID); err != nil {
			return nil, fmt.Errorf("count duplicate of message %s in schema %q: %w", env.MessageID, s.schema, err)
		}
	case err != nil:
		return nil, fmt.Errorf("resume delivery of message %s in schema %q: %w", env.MessageID, s.schema, err)
	}
	d.Tx = &handlerTx{Tx: txOf(t).tx, t: txOf(t), closed: d.Duplicate}
	return d, nil
}

// InboxSettleStarted marks env's inbox entry "done" in t if it was left
// "started", and reports whether it was.
func (s *executor) InboxSettleStarted(ctx context.Context, t driver.Tx, env *message.Envelope) (bool, error) {
	_, err := s.queries.DeliveryResume(ctx, txOf(t).exec(ctx, false), env.MessageID)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("settle started inbox entry of message %s in schema %q: %w", env.MessageID, s.schema, err)
	}
	return true, nil
}

// BarrierDropStarted removes, in t, the "started" mark env left in its phase,
// if it is still there.
func (s *executor) BarrierDropStarted(ctx context.Context, t driver.Tx, env *message.Envelope) error {
	err := s.queries.BarrierDropStarted(ctx, txOf(t).exec(ctx, false), &dbsqlc.BarrierDropStartedParams{
		SagaID: env.SagaID, Step: barrierStep(env), Phase: string(env.Kind.Phase()), MessageID: env.MessageID,
	})
	if err != nil {
		return fmt.Errorf("drop started %s mark of saga %s step %q in schema %q: %w", env.Kind.Phase(), env.SagaID, env.Step, s.schema, err)
	}
	return nil
}

func inboxParams(env *message.Envelope) *dbsqlc.InboxRecordParams {
	return &dbsqlc.InboxRecordParams{MessageID: env.MessageID, Kind: string(env.Kind), Type: env.Type, SagaID: env.SagaID, Step: env.Step}
}

// DeliveryFinish implements driver.Executor: its statement goes out with
// t's next round trip (Commit), its reply under t's write-time lease.
func (s *executor) DeliveryFinish(ctx context.Context, t driver.Tx, env *message.Envelope, d *driver.Delivery, end driver.DeliveryEnd) error {
	if d != nil {
		h := d.Tx.(*handlerTx)
		if end.Discard {
			if h.released {
				return errors.New("finish delivery: the handler released its savepoint (Commit) before rejecting, so its writes cannot be discarded")
			}
			if !h.closed {
				txOf(t).queue("rollback to savepoint " + handlerSavepoint)
			}
		}
		h.closed = true
	}
	if end.Mark == nil && end.Reply == nil && !end.Settle {
		return nil
	}
	p := &dbsqlc.DeliveryFinishParams{
		SagaID: env.SagaID, Step: barrierStep(env), Phase: string(env.Kind.Phase()),
		SettleInbox: end.Settle, InboxMessageID: env.MessageID,
		MessageID: []uuid.UUID{}, OrderingKey: []string{}, Kind: []string{}, Type: []string{}, RoutingKey: []string{},
		ReplySagaID: []uuid.UUID{}, SagaType: []string{}, ReplyStep: []string{}, StepIndex: []int32{}, Attempt: []int32{},
		ReplyTo: []string{}, CorrelationID: []string{}, Traceparent: []string{}, Tracestate: []string{},
		Headers: [][]byte{}, Payload: [][]byte{}, CreatedAt: []time.Time{},
	}
	if m := end.Mark; m != nil {
		p.SetMark, p.Outcome, p.ReplyKind, p.ReplyPayload = true, string(m.Outcome), string(m.ReplyKind), m.ReplyPayload
	}
	var reply []message.Message // as prepared and written
	if end.Reply != nil {
		reply = []message.Message{*end.Reply}
		o, err := outboxColumns(reply, time.Now().UTC())
		if err != nil {
			return fmt.Errorf("finish delivery of message %s: reply: %w", env.MessageID, err)
		}
		end.Reply.MessageID = o.messageID[0]
		p.MessageID, p.OrderingKey, p.Kind, p.Type, p.RoutingKey = o.messageID, o.orderingKey, o.kind, o.typ, o.routingKey
		p.ReplySagaID, p.SagaType, p.ReplyStep, p.StepIndex, p.Attempt = o.sagaID, o.sagaType, o.step, o.stepIndex, o.attempt
		p.ReplyTo, p.CorrelationID, p.Traceparent, p.Tracestate = o.replyTo, o.correlationID, o.traceparent, o.tracestate
		p.Headers, p.Payload, p.CreatedAt = o.headers, o.payload, o.createdAt
	}
	tx := txOf(t)
	p.LeaseSeconds, p.ClaimedBy, p.Confirmed = leaseArgs(tx.lease)
	row, err := s.queries.DeliveryFinish(ctx, tx.later(fmt.Sprintf("finish delivery of message %s in schema %q", env.MessageID, s.schema)), p)
	if err != nil {
		return fmt.Errorf("finish delivery of message %s in schema %q: %w", env.MessageID, s.schema, err)
	}
	tx.onCommit(func() { tx.noteLeased(reply, row.LeasedIds, row.LeasedMessageIds) })
	return nil
}

// InboxRecord records env in the inbox in t (the first statement of a
// delivery given up on) and reports whether it is new there; a duplicate
// counts itself.
func (s *executor) InboxRecord(ctx context.Context, t driver.Tx, env *message.Envelope) (bool, error) {
	fresh, err := s.queries.InboxRecord(ctx, txOf(t).exec(ctx, false), inboxParams(env))
	if err != nil {
		return false, fmt.Errorf("record message %s in inbox of schema %q: %w", env.MessageID, s.schema, err)
	}
	return fresh, nil
}

// BarrierGet returns, read in t, the mark of env's saga step in phase, or an
// error wrapping message.ErrNotFound.
func (s *executor) BarrierGet(ctx context.Context, t driver.Tx, env *message.Envelope, phase message.Phase) (driver.BarrierMark, error) {
	r, err := s.queries.BarrierGet(ctx, txOf(t).exec(ctx, false), &dbsqlc.BarrierGetParams{SagaID: env.SagaID, Step: barrierStep(env), Phase: string(phase)})
	if errors.Is(err, pgx.ErrNoRows) {
		return driver.BarrierMark{}, fmt.Errorf("%s barrier of saga %s step %q: %w", phase, env.SagaID, env.Step, message.ErrNotFound)
	}
	if err != nil {
		return driver.BarrierMark{}, fmt.Errorf("get %s barrier of saga %s step %q in schema %q: %w", phase, env.SagaID, env.Step, s.schema, err)
	}
	return driver.BarrierMark{Outcome: driver.BarrierOutcome(r.Outcome), ReplyKind: message.Kind(r.ReplyKind), ReplyPayload: r.ReplyPayload}, nil
}

// BarrierLeave leaves, in t, the final mark of env's saga step in env's
// phase unless one is there, and reports whether it did.
func (s *executor) BarrierLeave(ctx context.Context, t driver.Tx, env *message.Envelope, mark driver.BarrierMark) (bool, error) {
	n, err := s.queries.BarrierInsert(ctx, txOf(t).exec(ctx, false), &dbsqlc.BarrierInsertParams{
		SagaID: env.SagaID, Step: barrierStep(env), Phase: string(env.Kind.Phase()), MessageID: env.MessageID,
		Outcome: string(mark.Outcome), ReplyKind: string(mark.ReplyKind), ReplyPayload: mark.ReplyPayload,
	})
	if err != nil {
		return false, fmt.Errorf("leave %s barrier of saga %s step %q in schema %q: %w", env.Kind.Phase(), env.SagaID, env.Step, s.schema, err)
	}
	return n == 1, nil
}

// barrierRunSeparator separates a step's name from its run in the barrier's
// step column. Step names cannot contain control characters (the saga
// definition refuses them), so the key is unambiguous.
const barrierRunSeparator = "\x1f"

// barrierStep is the step column of the barrier marks of env's step: the
// step's name in a saga's first run (run 0), and name, separator and run in
// a run an operator's restart began. Keeping the run inside the key leaves
// the barrier's primary key (saga, step, phase) as it was, so that
// participants of an earlier version keep working on the same tables.
func barrierStep(env *message.Envelope) string {
	if env.Run <= 0 {
		return env.Step
	}
	return env.Step + barrierRunSeparator + strconv.Itoa(env.Run)
}

// splitBarrierStep is the inverse of barrierStep: the step's name and run.
func splitBarrierStep(key string) (step string, run int) {
	name, r, ok := strings.Cut(key, barrierRunSeparator)
	if !ok {
		return key, 0
	}
	n, err := strconv.Atoi(r)
	if err != nil {
		return key, 0
	}
	return name, n
}
