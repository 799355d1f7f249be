package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store/internal/dbsqlc"
)

// BarrierOutcome is what happened to one phase of a saga step at a
// participant, as its barrier mark records it.
type BarrierOutcome string

// The barrier outcomes.
const (
	// BarrierApplied: the handler ran and its effect committed.
	BarrierApplied BarrierOutcome = "applied"
	// BarrierRejected: the action was rejected (or given up on); it had no
	// effect.
	BarrierRejected BarrierOutcome = "rejected"
	// BarrierSkipped: a compensation with nothing to undo (the action never
	// ran or was rejected), answered with success.
	BarrierSkipped BarrierOutcome = "skipped"
	// BarrierBlocked: an action mark left by a compensation that came first;
	// the action, should it arrive, is not applied.
	BarrierBlocked BarrierOutcome = "blocked"
)

// Delivery is what BeginDelivery found for one message at a participant.
type Delivery struct {
	// Duplicate is true when the inbox had the message: it counted itself
	// and nothing else may change.
	Duplicate bool
	// Marked is true when this message left the barrier mark of its saga
	// step and phase: the handler runs (for a compensation, if Action says
	// so). Otherwise Prior is the mark an earlier message left, and its
	// reply is this message's too.
	Marked bool
	Prior  BarrierMark
	// Action is, for a compensation that left its mark, the outcome of the
	// step's action here: BarrierBlocked when the action never arrived (the
	// compensation left the action's mark itself, so that a late action is
	// not applied).
	Action BarrierOutcome
	// Tx is the transaction the handler runs in: a savepoint of the
	// delivery's, begun in the same round trip. Its Commit and Rollback end
	// the savepoint, never the delivery.
	Tx pgx.Tx
}

// BarrierMark is the record of one phase of one saga step at a participant,
// with the reply every later message of that phase gets.
type BarrierMark struct {
	Outcome BarrierOutcome
	// ReplyKind and ReplyPayload are the reply sent for the phase.
	ReplyKind    message.Kind
	ReplyPayload []byte
}

// handlerSavepoint is the savepoint a handler runs under.
const handlerSavepoint = "sagabox_handler"

// BeginDelivery begins t, the delivery of env at a participant, in one
// round trip with BEGIN: it records env in the inbox and, for a saga step's
// command or compensation seen for the first time, leaves the step's
// barrier mark (a compensation also leaves the action's mark, blocked, with
// the failure reply blockedReply, when the action never arrived). It ends
// with the savepoint the handler runs in. A concurrent delivery of the same
// message, or of the same step's action and compensation, waits for the
// other's transaction to end.
func (s *Store) BeginDelivery(ctx context.Context, t *Tx, env *message.Envelope, blockedReply []byte) (*Delivery, error) {
	db := t.execThen("savepoint " + handlerSavepoint)
	d := &Delivery{}
	var err error
	switch env.Kind {
	case message.KindCommand:
		var r *dbsqlc.DeliveryBeginActionRow
		r, err = s.queries.DeliveryBeginAction(ctx, db, &dbsqlc.DeliveryBeginActionParams{
			MessageID: env.MessageID, Type: env.Type, SagaID: env.SagaID, Step: env.Step,
		})
		if err == nil {
			d.Duplicate, d.Marked = !r.Fresh, r.Marked
			d.Prior = BarrierMark{Outcome: BarrierOutcome(r.Outcome), ReplyKind: message.Kind(r.ReplyKind), ReplyPayload: r.ReplyPayload}
		}
	case message.KindCompensation:
		var r *dbsqlc.DeliveryBeginCompensationRow
		r, err = s.queries.DeliveryBeginCompensation(ctx, db, &dbsqlc.DeliveryBeginCompensationParams{
			MessageID: env.MessageID, Type: env.Type, SagaID: env.SagaID, Step: env.Step, BlockedReply: blockedReply,
		})
		if err == nil {
			d.Duplicate, d.Marked = !r.Fresh, r.Marked
			d.Prior = BarrierMark{Outcome: BarrierOutcome(r.Outcome), ReplyKind: message.Kind(r.ReplyKind), ReplyPayload: r.ReplyPayload}
			d.Action = BarrierOutcome(r.ActionOutcome)
			if r.ActionBlocked {
				d.Action = BarrierBlocked
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
	if d.Marked {
		d.Prior = BarrierMark{}
	}
	d.Tx = &handlerTx{Tx: t.tx, t: t}
	return d, nil
}

func inboxParams(env *message.Envelope) *dbsqlc.InboxRecordParams {
	return &dbsqlc.InboxRecordParams{MessageID: env.MessageID, Kind: string(env.Kind), Type: env.Type, SagaID: env.SagaID, Step: env.Step}
}

// DeliveryEnd is how a delivery ends.
type DeliveryEnd struct {
	// Discard rolls the handler's writes back (a rejection).
	Discard bool
	// Mark, when set, is the outcome and reply of the barrier mark this
	// delivery left.
	Mark *BarrierMark
	// Reply, when set, is written to the outbox (it is prepared in place).
	Reply *message.Message
}

// FinishDelivery ends d, the delivery begun in t (nil: one given up on,
// recorded with RecordInbox), as end says, and commits t, in one round trip.
func (s *Store) FinishDelivery(ctx context.Context, t *Tx, env *message.Envelope, d *Delivery, end DeliveryEnd) error {
	if d != nil {
		h := d.Tx.(*handlerTx)
		if end.Discard {
			if h.released {
				return errors.New("finish delivery: the handler released its savepoint (Commit) before rejecting, so its writes cannot be discarded")
			}
			if !h.closed {
				t.queue("rollback to savepoint " + handlerSavepoint)
			}
		}
		h.closed = true
	}
	if end.Mark == nil && end.Reply == nil {
		return t.Commit(ctx)
	}
	p := &dbsqlc.DeliveryFinishParams{
		SagaID: env.SagaID, Step: env.Step, Phase: string(env.Kind.Phase()),
		MessageID: []uuid.UUID{}, OrderingKey: []string{}, Kind: []string{}, Type: []string{}, RoutingKey: []string{},
		ReplySagaID: []uuid.UUID{}, SagaType: []string{}, ReplyStep: []string{}, StepIndex: []int32{}, Attempt: []int32{},
		ReplyTo: []string{}, CorrelationID: []string{}, Traceparent: []string{}, Tracestate: []string{},
		Headers: [][]byte{}, Payload: [][]byte{}, CreatedAt: []time.Time{},
	}
	if m := end.Mark; m != nil {
		p.SetMark, p.Outcome, p.ReplyKind, p.ReplyPayload = true, string(m.Outcome), string(m.ReplyKind), m.ReplyPayload
	}
	if end.Reply != nil {
		o, err := outboxColumns([]message.Message{*end.Reply}, time.Now().UTC())
		if err != nil {
			return fmt.Errorf("finish delivery of message %s: reply: %w", env.MessageID, err)
		}
		end.Reply.MessageID = o.messageID[0]
		p.MessageID, p.OrderingKey, p.Kind, p.Type, p.RoutingKey = o.messageID, o.orderingKey, o.kind, o.typ, o.routingKey
		p.ReplySagaID, p.SagaType, p.ReplyStep, p.StepIndex, p.Attempt = o.sagaID, o.sagaType, o.step, o.stepIndex, o.attempt
		p.ReplyTo, p.CorrelationID, p.Traceparent, p.Tracestate = o.replyTo, o.correlationID, o.traceparent, o.tracestate
		p.Headers, p.Payload, p.CreatedAt = o.headers, o.payload, o.createdAt
	}
	if err := s.queries.DeliveryFinish(ctx, t.exec(ctx, true), p); err != nil {
		return fmt.Errorf("finish delivery of message %s in schema %q: %w", env.MessageID, s.schema, err)
	}
	return nil
}

// RecordInbox records env in the inbox in t (the first statement of a
// delivery given up on) and reports whether it is new there; a duplicate
// counts itself.
func (s *Store) RecordInbox(ctx context.Context, t *Tx, env *message.Envelope) (bool, error) {
	fresh, err := s.queries.InboxRecord(ctx, t.exec(ctx, false), inboxParams(env))
	if err != nil {
		return false, fmt.Errorf("record message %s in inbox of schema %q: %w", env.MessageID, s.schema, err)
	}
	return fresh, nil
}

// Barrier returns, read in t, the mark of env's saga step in phase, or an
// error wrapping message.ErrNotFound.
func (s *Store) Barrier(ctx context.Context, t *Tx, env *message.Envelope, phase message.Phase) (BarrierMark, error) {
	r, err := s.queries.BarrierGet(ctx, t.exec(ctx, false), &dbsqlc.BarrierGetParams{SagaID: env.SagaID, Step: env.Step, Phase: string(phase)})
	if errors.Is(err, pgx.ErrNoRows) {
		return BarrierMark{}, fmt.Errorf("%s barrier of saga %s step %q: %w", phase, env.SagaID, env.Step, message.ErrNotFound)
	}
	if err != nil {
		return BarrierMark{}, fmt.Errorf("get %s barrier of saga %s step %q in schema %q: %w", phase, env.SagaID, env.Step, s.schema, err)
	}
	return BarrierMark{Outcome: BarrierOutcome(r.Outcome), ReplyKind: message.Kind(r.ReplyKind), ReplyPayload: r.ReplyPayload}, nil
}

// LeaveBarrier leaves, in t, the final mark of env's saga step in env's
// phase unless one is there, and reports whether it did.
func (s *Store) LeaveBarrier(ctx context.Context, t *Tx, env *message.Envelope, mark BarrierMark) (bool, error) {
	n, err := s.queries.BarrierInsert(ctx, t.exec(ctx, false), &dbsqlc.BarrierInsertParams{
		SagaID: env.SagaID, Step: env.Step, Phase: string(env.Kind.Phase()), MessageID: env.MessageID,
		Outcome: string(mark.Outcome), ReplyKind: string(mark.ReplyKind), ReplyPayload: mark.ReplyPayload,
	})
	if err != nil {
		return false, fmt.Errorf("leave %s barrier of saga %s step %q in schema %q: %w", env.Kind.Phase(), env.SagaID, env.Step, s.schema, err)
	}
	return n == 1, nil
}
