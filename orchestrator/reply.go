package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/sagabox/sagabox/internal/engine"
	"github.com/sagabox/sagabox/internal/telemetry"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store/driver"
	"github.com/sagabox/sagabox/transport"
	"go.opentelemetry.io/otel/attribute"
)

// History events the orchestrator records besides the core's.
const (
	// HistoryReplyDeadLettered: a reply could not be applied and was
	// dead-lettered: its saga's definition version is not registered here,
	// or its payload breaks the command's contract. Detail says which.
	HistoryReplyDeadLettered saga.HistoryEvent = "reply-dead-lettered"
	// HistoryDeadlineFailed: the saga's deadline passed but its timer could
	// not be applied: the saga core refused the stored instance (e.g. its
	// steps no longer match the registered definition) or could not build
	// the command to send. The deadline is cleared so that the sweeper does
	// not claim the saga again; Detail says why. An operator retries or
	// aborts the saga once the definition is fixed.
	HistoryDeadlineFailed saga.HistoryEvent = "deadline-failed"
)

// componentName is the component attribute of the Client's logs, spans and
// metrics.
const componentName = "orchestrator"

// processor is the orchestrator's part of the delivery engine: it applies
// a reply to its saga.
type processor struct{ c *Client }

// Process applies one reply in one transaction, as ProcessBatch applies a
// batch of one; an event message goes to processEvent.
func (p processor) Process(ctx context.Context, d *transport.Delivery, _ int, lease *driver.OutboxLease) (engine.Result, error) {
	c := p.c
	if d.Kind == message.KindEvent {
		return c.processEvent(ctx, d, lease)
	}
	if !d.Kind.IsReply() {
		return engine.Result{}, &engine.Poison{Class: telemetry.ReasonUnexpectedKind, Reason: fmt.Sprintf(
			"message %s of kind %q reached the reply queue %s: only replies are handled here", d.MessageID, d.Kind, c.cfg.Service)}
	}
	results, committed, err := c.applyReplies(ctx, []engine.Item{{Ctx: ctx, Delivery: d}}, lease)
	if err != nil {
		return engine.Result{}, err
	}
	res := results[0]
	res.Committed = committed
	return res, nil
}

// ProcessBatch applies a batch of replies in one transaction (group
// commit), as applyReplies does.
func (p processor) ProcessBatch(ctx context.Context, items []engine.Item, lease *driver.OutboxLease) ([]engine.Result, driver.Committed, error) {
	return p.c.applyReplies(ctx, items, lease)
}

// applyReplies applies the replies of items in one transaction, its writes
// under lease: one statement that records them in the inbox and reads
// their sagas goes out with BEGIN (receiveReplies), the saga core decides
// on each (decideReplies), and one statement writes every transition and
// commits. When the Client keeps every saga of the batch (Config.SagaCache)
// none is read and that is one round trip. It applies at most one reply per
// saga (a saga's second reply needs the state the first one leaves) and
// defers the others, and what is not a reply, so that each gets the
// treatment of one delivery. A reply the core cannot decide on a kept copy
// fails the transaction with a conflict: the engine runs it again, and the
// saga, no longer kept, is read.
func (c *Client) applyReplies(ctx context.Context, items []engine.Item, lease *driver.OutboxLease) ([]engine.Result, driver.Committed, error) {
	results := make([]engine.Result, len(items))
	at := pickReplies(items, results)
	if len(at) == 0 {
		return results, driver.Committed{}, nil
	}
	t := c.db.Begin(&driver.BeginOpts{Lease: lease})
	defer t.Rollback(ctx)
	recv, err := c.receiveReplies(ctx, t, items, at)
	var trs []*transition
	if err == nil {
		trs, err = c.decideReplies(ctx, t, items, at, recv, results)
	}
	var committed driver.Committed
	if err == nil {
		committed, err = c.commitTransitions(ctx, t, trs)
	}
	if err != nil {
		// What was kept of the sagas is not known to be stored any more.
		for _, r := range recv {
			if r.kept {
				c.cache.forget(r.saga.ID)
			}
		}
		return nil, driver.Committed{}, err
	}
	for k, i := range at {
		if trs[k] != nil {
			results[i] = c.replyApplied(items[i].Ctx, items[i].Delivery, *trs[k])
		}
	}
	return results, committed, nil
}

// pickReplies returns the positions of the items of a batch to apply
// together, and marks the others deferred in results: what is not a reply,
// and a second reply of one saga or one message id.
func pickReplies(items []engine.Item, results []engine.Result) []int {
	var at []int
	seen := make(map[uuid.UUID]struct{}, 2*len(items))
	for i, it := range items {
		d := it.Delivery
		_, msgSeen := seen[d.MessageID]
		_, sagaSeen := seen[d.SagaID]
		if !d.Kind.IsReply() || msgSeen || sagaSeen {
			results[i].Defer = true
			continue
		}
		seen[d.MessageID], seen[d.SagaID] = struct{}{}, struct{}{}
		at = append(at, i)
	}
	return at
}

// received is what receiveReplies found for one reply.
type received struct {
	// fresh is false for a duplicate, which the inbox counted.
	fresh bool
	// saga is the reply's saga (nil: none here); kept when it is the
	// Client's copy of its last write, unread and unlocked.
	saga *driver.SagaRecord
	kept bool
}

// receiveReplies begins t with the replies items[at]: each is recorded in
// the inbox and its saga read. The Client's kept copies stand in for the
// reads when it keeps every saga of the batch (their inbox records go out
// with the write, which checks each saga's revision); otherwise every saga
// is read and locked, in id order, so that every batch takes its row locks
// at BEGIN in one order.
func (c *Client) receiveReplies(ctx context.Context, t driver.Tx, items []engine.Item, at []int) ([]received, error) {
	envs := make([]*message.Envelope, len(at))
	out := make([]received, len(at))
	kept := 0
	for k, i := range at {
		envs[k] = &items[i].Delivery.Envelope
		if rec, ok := c.kept(envs[k].SagaID); ok {
			out[k] = received{fresh: true, saga: &rec, kept: true}
			kept++
		}
	}
	if kept == len(at) {
		return out, c.db.ReplyReceiveKnown(ctx, t, envs)
	}
	rcpts, err := c.db.ReplyReceive(ctx, t, envs)
	if err != nil {
		return nil, err
	}
	for k, r := range rcpts {
		out[k] = received{fresh: r.Fresh, saga: r.Saga}
	}
	return out, nil
}

// kept returns the saga id as this Client last wrote it, if it keeps it
// and a reply to it may be applied to the copy: its definition, registered
// here, has no local step. A local step runs user code, which the saga's
// row lock orders with the sweeper, operators and event senders: only a
// saga read and locked runs one.
func (c *Client) kept(id uuid.UUID) (driver.SagaRecord, bool) {
	rec, ok := c.cache.get(id)
	if !ok {
		return rec, false
	}
	runner, err := c.registry.Lookup(rec.Type, rec.Version)
	return rec, err == nil && !hasLocalStep(runner)
}

// errStaleCopy fails a transaction that applied a reply to a kept copy of
// its saga the core could not decide on (it ignored or refused the reply,
// or reached a step waiting for an event): the saga may have moved on, so
// the transaction runs again reading it.
var errStaleCopy = fmt.Errorf("orchestrator: a reply is to be applied to its saga as stored: %w", driver.ErrConflict)

// decideReplies runs the saga core on each reply received, in t, and
// returns the transitions to write (nil for a reply that writes nothing: a
// duplicate, one for a saga that does not exist here), noting those in
// results. A kept saga the core could not decide on is no longer kept, and
// the transaction fails with errStaleCopy.
func (c *Client) decideReplies(ctx context.Context, t driver.Tx, items []engine.Item, at []int, recv []received, results []engine.Result) ([]*transition, error) {
	trs := make([]*transition, len(at))
	for k, i := range at {
		d, r := items[i].Delivery, recv[k]
		switch {
		case !r.fresh:
			results[i] = engine.Result{Outcome: telemetry.OutcomeDuplicate}
			continue
		case r.saga == nil:
			c.log.Warn("reply for a saga that does not exist here acknowledged without effect", "message_id", d.MessageID.String(), "saga_id", d.SagaID.String())
			results[i] = engine.Result{Outcome: telemetry.OutcomeUnknownSaga}
			continue
		}
		tr, err := c.applyReply(items[i].Ctx, t, d, *r.saga, r.kept)
		switch {
		case r.kept && (err != nil || tr.res.Ignored):
			c.cache.forget(r.saga.ID)
			return nil, errStaleCopy
		case err != nil:
			return nil, err
		}
		trs[k] = &tr
	}
	return trs, nil
}

// commitTransitions writes the transitions trs (nil entries write nothing)
// in t and commits t, in one round trip.
func (c *Client) commitTransitions(ctx context.Context, t driver.Tx, trs []*transition) (driver.Committed, error) {
	var write []driver.Transition
	var now time.Time
	for _, tr := range trs {
		if tr != nil {
			write = append(write, tr.write)
			now = tr.at
		}
	}
	if len(write) > 0 {
		if err := c.db.SagaWrite(ctx, t, write, now); err != nil {
			return driver.Committed{}, err
		}
	}
	return t.Commit(ctx)
}

// replyApplied does what follows the commit of tr, the transition of the
// reply d (metrics, logs, wake-ups), and returns the delivery's result.
func (c *Client) replyApplied(ctx context.Context, d *transport.Delivery, tr transition) engine.Result {
	if tr.res.Ignored {
		c.log.Info("reply ignored", "message_id", d.MessageID.String(), "saga_id", d.SagaID.String(), "reason", tr.res.IgnoreReason)
		return engine.Result{Outcome: telemetry.OutcomeIgnored, Note: tr.res.IgnoreReason}
	}
	// Latency since the saga's previous transition, normally the one that
	// sent the command this reply answers.
	c.tel.StepDone(ctx, tr.rec.Type, d.Step, string(tr.phase), tr.rec.UpdatedAt.Sub(tr.since))
	c.applied(ctx, tr)
	return engine.Result{Outcome: telemetry.OutcomeApplied, SpanAttrs: []attribute.KeyValue{
		telemetry.AttrStatus.String(string(tr.res.Instance.Status)), telemetry.AttrPhase.String(string(tr.res.Instance.Phase)),
	}}
}

// applyReply runs the saga core on the reply d to the saga rec, locked in t,
// or, with kept, as this Client last wrote it (not locked; kept returned
// it, so its definition has no local step). A kept saga whose transition
// reaches a step waiting for an event is refused with errStaleCopy.
// A reply that no retry can apply (its definition is not registered here,
// its payload breaks the command's contract, the stored saga is corrupt) is
// poison.
func (c *Client) applyReply(ctx context.Context, t driver.Tx, d *transport.Delivery, rec driver.SagaRecord, kept bool) (transition, error) {
	runner, err := c.registry.Lookup(rec.Type, rec.Version)
	if err != nil {
		return transition{}, &engine.Poison{Class: telemetry.ReasonUnknownDefinition, Reason: fmt.Sprintf(
			"reply %s for saga %s cannot be applied: %v; this orchestrator runs %v (deploy an orchestrator that registers %s v%d, then move the message back from the dead-letter queue)",
			d.MessageID, rec.ID, err, c.definitionNames(), rec.Type, rec.Version)}
	}
	s, err := sagaFromRecord(&rec)
	if err != nil {
		return transition{}, &engine.Poison{Class: telemetry.ReasonInvalidInstance, Reason: err.Error()}
	}
	kind := saga.EventReplySuccess
	if d.Kind == message.KindReplyFailure {
		kind = saga.EventReplyFailure
	}
	now := c.now()
	res, err := runner.Apply(c.localScope(ctx, t), s.Instance(), saga.Event{
		Kind: kind, Type: d.Type, Step: d.Step, StepIndex: d.StepIndex, Attempt: d.Attempt, Run: d.Run,
		Payload: d.Payload, MessageID: d.MessageID, At: now,
	})
	switch {
	case errors.Is(err, saga.ErrInvalidPayload):
		return transition{}, &engine.Poison{Class: telemetry.ReasonInvalidPayload, Reason: fmt.Sprintf("reply %s for saga %s: %v", d.MessageID, rec.ID, err)}
	case errors.Is(err, saga.ErrInvalidInstance), errors.Is(err, saga.ErrInvalidEvent):
		return transition{}, &engine.Poison{Class: telemetry.ReasonInvalidInstance, Reason: fmt.Sprintf("reply %s for saga %s: %v", d.MessageID, rec.ID, err)}
	case err != nil:
		return transition{}, err
	}
	if kept && awaited(runner, &res.Instance) != "" {
		// Whether an event is kept for the saga is read from the events,
		// whose senders hold the saga's row lock, not its revision: a
		// sender about to commit one would go unseen.
		return transition{}, errStaleCopy
	}
	tr, err := c.transition(ctx, rec, res, now)
	if err == nil {
		// Events sent before the saga reached the step it now waits at.
		tr, err = c.consumeKept(ctx, t, nil, runner, tr, now)
	}
	tr.phase, tr.at = s.Phase, now
	return tr, err
}

// GiveUp makes a reply given up on visible on its saga, in a transaction of
// its own: a history entry and LastError, and the reply's attempts marked
// dead-lettered. The reply is not recorded in the inbox (its own
// transaction was rolled back), so it can be replayed.
func (p processor) GiveUp(ctx context.Context, d *transport.Delivery, poison *engine.Poison) (engine.Result, error) {
	c := p.c
	if err := c.db.AttemptMarkDeadLettered(ctx, nil, &d.Envelope, poison.Reason); err != nil {
		return engine.Result{}, err
	}
	if d.Kind.IsReply() {
		c.recordOnSaga(ctx, d.SagaID, driver.HistoryRecord{
			Event: string(HistoryReplyDeadLettered), Step: d.Step, StepIndex: d.StepIndex, Attempt: d.Attempt,
			Detail: poison.Reason, MessageID: d.MessageID,
		})
	}
	return engine.Result{Outcome: telemetry.OutcomeDeadLetter}, nil
}

// recordOnSaga appends h to the history of saga id and makes its detail the
// saga's LastError, in a transaction of its own. A saga that does not exist
// is left alone.
func (c *Client) recordOnSaga(ctx context.Context, id uuid.UUID, h driver.HistoryRecord) {
	err := engine.Retrying(ctx, func() error {
		t := c.db.Begin(nil)
		defer t.Rollback(ctx)
		recs, err := c.db.SagaLock(ctx, t, []uuid.UUID{id})
		if err != nil || len(recs) == 0 {
			return err
		}
		rec := recs[0]
		now := c.now()
		h.SagaID, h.At, h.Phase = id, now, rec.Phase
		rec.LastError = h.Detail
		return c.writeAndCommit(ctx, t, []driver.Transition{{Saga: &rec, History: []driver.HistoryRecord{h}}}, now)
	})
	if err != nil {
		c.log.Warn("could not record on its saga that a reply was dead-lettered", "saga_id", id.String(), "message_id", h.MessageID.String(), "err", err)
	}
}

// writeAndCommit writes trs in t and commits t, in one round trip, for a
// transaction of the Client's own (not a delivery's): what it sent is
// published after the wake-up that follows it (Client.committed).
func (c *Client) writeAndCommit(ctx context.Context, t driver.Tx, trs []driver.Transition, now time.Time) error {
	if len(trs) > 0 {
		if err := c.db.SagaWrite(ctx, t, trs, now); err != nil {
			return err
		}
	}
	_, err := t.Commit(ctx)
	return err
}
