package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store/driver"
	"github.com/sagabox/sagabox/store/internal/dbsqlc"
)

// DeliveryBeginMany begins t with the deliveries envs of a group applied in
// one transaction (group commit) at a participant, in one statement sent
// with BEGIN: what DeliveryBegin does for each of them. envs must not
// repeat a message id nor a saga step (the caller leaves such a delivery
// out of the group). Each Delivery's Tx is its handler's: a savepoint of t
// begun with the handler's first statement, which DeliveryEndHandler ends.
func (s *executor) DeliveryBeginMany(ctx context.Context, t driver.Tx, envs []*message.Envelope, blockedReplies [][]byte) ([]*driver.Delivery, error) {
	n := len(envs)
	p := &dbsqlc.DeliveryBeginManyParams{
		Ord: make([]int32, n), MessageID: make([]uuid.UUID, n), Kind: make([]string, n), Type: make([]string, n),
		SagaID: make([]uuid.UUID, n), Step: make([]string, n), BlockedReply: make([][]byte, n),
	}
	for i, env := range envs {
		switch env.Kind {
		case message.KindCommand, message.KindCompensation:
			p.Step[i] = barrierStep(env)
		case message.KindEvent:
			p.Step[i] = env.Step
		default:
			return nil, fmt.Errorf("begin deliveries: message %s is a %s, not a command, compensation or event", env.MessageID, env.Kind)
		}
		p.Ord[i], p.MessageID[i], p.Kind[i], p.Type[i], p.SagaID[i] = int32(i), env.MessageID, string(env.Kind), env.Type, env.SagaID
		p.BlockedReply[i] = blockedReplies[i]
	}
	rows, err := s.queries.DeliveryBeginMany(ctx, txOf(t).exec(ctx, false), p)
	if err != nil {
		return nil, fmt.Errorf("begin %d deliveries in schema %q: %w", n, s.schema, err)
	}
	if len(rows) != n {
		return nil, fmt.Errorf("begin %d deliveries in schema %q: %d rows came back", n, s.schema, len(rows))
	}
	dels := make([]*driver.Delivery, n)
	for i, r := range rows {
		d := &driver.Delivery{
			Duplicate: !r.Fresh && !r.Resumed, Marked: r.Marked, Resumed: r.Resumed, Attempt: int(r.InboxAttempt),
			Prior: driver.BarrierMark{Outcome: driver.BarrierOutcome(r.Outcome), ReplyKind: message.Kind(r.ReplyKind), ReplyPayload: r.ReplyPayload},
		}
		if envs[i].Kind == message.KindCompensation {
			d.Action = driver.BarrierOutcome(r.ActionOutcome)
			if r.ActionBlocked {
				d.Action = driver.BarrierBlocked
			}
		}
		if d.Marked || d.Resumed {
			d.Prior = driver.BarrierMark{}
		}
		d.Tx = &handlerTx{Tx: txOf(t).tx, t: txOf(t), lazy: true}
		dels[i] = d
	}
	return dels, nil
}

// DeliveryEndHandler ends the handler's savepoint of d, a delivery of a group
// begun with DeliveryBeginMany, before the next delivery's handler runs: it is
// released, or rolled back when end discards the handler's writes (Discard,
// Undo), with t's next statement. It fails when the handler's writes must be
// discarded but the handler released its savepoint itself: they cannot be
// told apart from the group's any more, so the group must not commit.
func (s *executor) DeliveryEndHandler(_ context.Context, d *driver.Delivery, end driver.DeliveryEnd) error {
	h := d.Tx.(*handlerTx)
	discard := end.Discard || end.Undo
	if discard && h.released {
		return errors.New("end delivery: the handler released its savepoint (Commit) and then failed or rejected, so its writes cannot be discarded")
	}
	if !h.lazy && !h.closed {
		if discard {
			h.t.queue("rollback to savepoint "+handlerSavepoint, "release savepoint "+handlerSavepoint)
		} else {
			h.t.queue("release savepoint " + handlerSavepoint)
		}
	}
	h.closed = true
	return nil
}

// DeliveryFinishMany ends the deliveries dels of envs, a group begun with
// DeliveryBeginMany whose handlers DeliveryEndHandler ended, as ends say, in one
// statement sent with t's next round trip (Commit). A delivery whose end is
// Undo leaves nothing: its inbox entry and the marks it left are removed.
// The replies take t's write-time lease.
func (s *executor) DeliveryFinishMany(ctx context.Context, t driver.Tx, envs []*message.Envelope, dels []*driver.Delivery, ends []driver.DeliveryEnd) error {
	p := &dbsqlc.DeliveryFinishManyParams{
		MarkSagaID: []uuid.UUID{}, MarkStep: []string{}, MarkPhase: []string{}, MarkOutcome: []string{},
		MarkReplyKind: []string{}, MarkReplyPayload: [][]byte{},
		UndoMessageID: []uuid.UUID{}, UndoSagaID: []uuid.UUID{}, UndoStep: []string{},
	}
	var replies []message.Message
	var replyOf []int
	for i, end := range ends {
		env := envs[i]
		if !dels[i].Tx.(*handlerTx).closed {
			return fmt.Errorf("finish deliveries: the handler of message %s was not ended (EndDelivery)", env.MessageID)
		}
		switch {
		case end.Undo:
			p.UndoMessageID = append(p.UndoMessageID, env.MessageID)
			p.UndoSagaID = append(p.UndoSagaID, env.SagaID)
			p.UndoStep = append(p.UndoStep, barrierStep(env))
			continue
		case end.Settle:
			return fmt.Errorf("finish deliveries: message %s: a group does not settle started inbox entries", env.MessageID)
		}
		if m := end.Mark; m != nil {
			p.MarkSagaID = append(p.MarkSagaID, env.SagaID)
			p.MarkStep = append(p.MarkStep, barrierStep(env))
			p.MarkPhase = append(p.MarkPhase, string(env.Kind.Phase()))
			p.MarkOutcome = append(p.MarkOutcome, string(m.Outcome))
			p.MarkReplyKind = append(p.MarkReplyKind, string(m.ReplyKind))
			p.MarkReplyPayload = append(p.MarkReplyPayload, m.ReplyPayload)
		}
		if end.Reply != nil {
			replies = append(replies, *end.Reply)
			replyOf = append(replyOf, i)
		}
	}
	o, err := outboxColumns(replies, time.Now().UTC())
	if err != nil {
		return fmt.Errorf("finish %d deliveries: reply: %w", len(ends), err)
	}
	for k, i := range replyOf {
		ends[i].Reply.MessageID = o.messageID[k]
	}
	p.MessageID, p.OrderingKey, p.Kind, p.Type, p.RoutingKey = o.messageID, o.orderingKey, o.kind, o.typ, o.routingKey
	p.ReplySagaID, p.SagaType, p.ReplyStep, p.StepIndex, p.Attempt = o.sagaID, o.sagaType, o.step, o.stepIndex, o.attempt
	p.ReplyTo, p.CorrelationID, p.Traceparent, p.Tracestate = o.replyTo, o.correlationID, o.traceparent, o.tracestate
	p.Headers, p.Payload, p.CreatedAt = o.headers, o.payload, o.createdAt
	tx := txOf(t)
	p.LeaseSeconds, p.ClaimedBy, p.Confirmed = leaseArgs(tx.lease)
	// Under writePlan, as a transition write: the marks and the undone
	// inbox entries are found by primary key among array parameters, and
	// a generic plan built while the tables were small would scan them.
	tx.queue(writePlan)
	row, err := s.queries.DeliveryFinishMany(ctx, tx.later(fmt.Sprintf("finish %d deliveries in schema %q", len(ends), s.schema)), p)
	if err != nil {
		return fmt.Errorf("finish %d deliveries in schema %q: %w", len(ends), s.schema, err)
	}
	tx.pending = append(tx.pending, &pendingStmt{sql: writePlanEnd, restore: true})
	tx.onCommit(func() { tx.noteLeased(replies, row.LeasedIds, row.LeasedMessageIds) })
	return nil
}
