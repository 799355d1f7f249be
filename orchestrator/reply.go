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

// processor is the orchestrator's part of the delivery engine: it applies a
// reply to its saga.
type processor struct{ c *Client }

// Process applies one reply in one transaction. A reply to a saga the
// Client kept from its own last write (Config.SagaCache) takes one round
// trip: the inbox record, the new state (checked against the revision
// kept), its history and the next commands go out with BEGIN and COMMIT,
// and the saga core decides before. Any other takes two: the inbox record
// and the saga's row lock go out with BEGIN, the write with COMMIT, and the
// core decides in between.
func (p processor) Process(ctx context.Context, d *transport.Delivery, _ int) (engine.Result, error) {
	c := p.c
	if d.Kind == message.KindEvent {
		return c.processEvent(ctx, d)
	}
	if !d.Kind.IsReply() {
		return engine.Result{}, &engine.Poison{Class: telemetry.ReasonUnexpectedKind, Reason: fmt.Sprintf(
			"message %s of kind %q reached the reply queue %s: only replies are handled here", d.MessageID, d.Kind, c.cfg.Service)}
	}
	if rec, ok := c.kept(d.SagaID); ok {
		if res, done, err := p.processKnown(ctx, d, rec); done {
			return res, err
		}
	}
	t := c.db.Begin()
	defer t.Rollback(ctx)
	rcpts, err := c.db.ReceiveReplies(ctx, t, []*message.Envelope{&d.Envelope})
	if err != nil {
		return engine.Result{}, err
	}
	switch r := rcpts[0]; {
	case !r.Fresh:
		return engine.Result{Outcome: telemetry.OutcomeDuplicate}, t.Commit(ctx)
	case r.Saga == nil:
		c.log.Warn("reply for a saga that does not exist here acknowledged without effect", "message_id", d.MessageID.String(), "saga_id", d.SagaID.String())
		return engine.Result{Outcome: telemetry.OutcomeUnknownSaga}, t.Commit(ctx)
	}
	tr, err := c.applyReply(ctx, t, d, *rcpts[0].Saga, false)
	if err != nil {
		return engine.Result{}, err
	}
	if err := c.db.WriteTransitions(ctx, t, writes(tr), tr.at, true); err != nil {
		return engine.Result{}, err
	}
	return c.replyApplied(ctx, d, tr), nil
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

// processKnown applies the reply d to rec, its saga as this Client last
// wrote it, in one round trip. A saga written meanwhile by someone else, or
// a duplicate reply, fails the transaction with a retryable error (the
// engine runs Process again, which then reads the saga). When the core
// ignores or refuses the reply, which it may do because rec is out of date,
// processKnown writes nothing and reports done false: the reply is to be
// applied the ordinary way. Either way the saga is no longer kept.
func (p processor) processKnown(ctx context.Context, d *transport.Delivery, rec driver.SagaRecord) (res engine.Result, done bool, err error) {
	c := p.c
	t := c.db.Begin()
	defer t.Rollback(ctx)
	if err := c.db.ReceiveKnownReplies(ctx, t, []*message.Envelope{&d.Envelope}); err != nil {
		c.cache.forget(d.SagaID)
		return engine.Result{}, true, err
	}
	tr, err := c.applyReply(ctx, t, d, rec, true)
	if err != nil || tr.res.Ignored {
		c.cache.forget(d.SagaID)
		return engine.Result{}, false, nil
	}
	if err := c.db.WriteTransitions(ctx, t, writes(tr), tr.at, true); err != nil {
		c.cache.forget(d.SagaID)
		return engine.Result{}, true, err
	}
	return c.replyApplied(ctx, d, tr), true, nil
}

// ProcessBatch applies a batch of replies in one transaction, as Process
// applies one (group commit): one statement that records them all in the
// inbox and locks their sagas goes out with BEGIN, the core decides on
// each, and one statement writes every transition and commits. When the
// Client kept every saga of the batch, none is read and that is one round
// trip (a batch with any saga not kept reads them all, so that every batch
// takes its row locks in id order at BEGIN). It applies at most one reply per saga (a saga's second
// reply in the batch needs the state the first one leaves), deferring the
// others, and defers what is not a reply, so that each gets the treatment
// of one delivery. Should the core ignore or refuse a reply to a kept saga,
// the batch is applied again reading every saga.
func (p processor) ProcessBatch(ctx context.Context, items []engine.Item) ([]engine.Result, error) {
	results, again, err := p.processBatch(ctx, items, true)
	if again {
		results, _, err = p.processBatch(ctx, items, false)
	}
	return results, err
}

// processBatch is ProcessBatch, using the sagas kept if useKept. It reports
// again, having written nothing, when a reply to a kept saga is to be
// applied reading its saga.
func (p processor) processBatch(ctx context.Context, items []engine.Item, useKept bool) (results []engine.Result, again bool, err error) {
	c := p.c
	results = make([]engine.Result, len(items))
	var envs, knownEnvs []*message.Envelope
	var at, knownAt []int
	var known []driver.SagaRecord
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
		if rec, ok := c.kept(d.SagaID); ok && useKept {
			knownEnvs, knownAt, known = append(knownEnvs, &d.Envelope), append(knownAt, i), append(known, rec)
			continue
		}
		envs = append(envs, &d.Envelope)
		at = append(at, i)
	}
	if len(envs) > 0 && len(knownEnvs) > 0 {
		// A mixed batch reads every saga: its locks are then all taken at
		// BEGIN, in id order, as every other batch takes them (the kept
		// sagas' would only be taken by the write, against that order).
		envs, at = append(envs, knownEnvs...), append(at, knownAt...)
		knownEnvs, knownAt, known = nil, nil, nil
	}
	if len(envs)+len(knownEnvs) == 0 {
		return results, false, nil
	}
	forgetKnown := func() {
		for _, rec := range known {
			c.cache.forget(rec.ID)
		}
	}
	t := c.db.Begin()
	defer t.Rollback(ctx)
	if len(knownEnvs) > 0 {
		// Sent ahead of the write.
		if err := c.db.ReceiveKnownReplies(ctx, t, knownEnvs); err != nil {
			forgetKnown()
			return nil, false, err
		}
	}
	var rcpts []driver.Receipt
	if len(envs) > 0 {
		if rcpts, err = c.db.ReceiveReplies(ctx, t, envs); err != nil {
			forgetKnown()
			return nil, false, err
		}
	}
	var trs []transition
	var applied []int
	var write []driver.Transition
	var now time.Time
	apply := func(i int, rec driver.SagaRecord, kept bool) error {
		tr, err := c.applyReply(items[i].Ctx, t, items[i].Delivery, rec, kept)
		if err != nil {
			return err
		}
		trs, applied = append(trs, tr), append(applied, i)
		write = append(write, tr.write)
		now = tr.at
		return nil
	}
	for k, i := range knownAt {
		if err := apply(i, known[k], true); err != nil || trs[len(trs)-1].res.Ignored {
			c.cache.forget(known[k].ID)
			return nil, true, nil
		}
	}
	for k, r := range rcpts {
		i := at[k]
		d := items[i].Delivery
		switch {
		case !r.Fresh:
			results[i] = engine.Result{Outcome: telemetry.OutcomeDuplicate}
			continue
		case r.Saga == nil:
			c.log.Warn("reply for a saga that does not exist here acknowledged without effect", "message_id", d.MessageID.String(), "saga_id", d.SagaID.String())
			results[i] = engine.Result{Outcome: telemetry.OutcomeUnknownSaga}
			continue
		}
		if err := apply(i, *r.Saga, false); err != nil {
			forgetKnown()
			return nil, false, err
		}
	}
	if len(write) == 0 {
		err = t.Commit(ctx)
	} else {
		err = c.db.WriteTransitions(ctx, t, write, now, true)
	}
	if err != nil {
		forgetKnown()
		return nil, false, err
	}
	for k, i := range applied {
		results[i] = c.replyApplied(items[i].Ctx, items[i].Delivery, trs[k])
	}
	return results, false, nil
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
	return engine.Result{Outcome: telemetry.OutcomeApplied, Wrote: len(tr.res.Emit) > 0, SpanAttrs: []attribute.KeyValue{
		telemetry.AttrStatus.String(string(tr.res.Instance.Status)), telemetry.AttrPhase.String(string(tr.res.Instance.Phase)),
	}}
}

// errReadTheSaga is applyReply's refusal to apply a reply to a kept copy
// of its saga (kept): the reply is to be applied to the saga read and
// locked.
var errReadTheSaga = errors.New("orchestrator: the reply is applied to its saga as stored")

// applyReply runs the saga core on the reply d to the saga rec, locked in t,
// or, with kept, as this Client last wrote it (not locked; kept returned
// it, so its definition has no local step). A kept saga whose transition
// reaches a step waiting for an event is refused with errReadTheSaga.
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
		return transition{}, errReadTheSaga
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
	if err := c.db.MarkDeadLettered(ctx, nil, &d.Envelope, poison.Reason); err != nil {
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
		t := c.db.Begin()
		defer t.Rollback(ctx)
		recs, err := c.db.LockSagas(ctx, t, []uuid.UUID{id})
		if err != nil || len(recs) == 0 {
			return err
		}
		rec := recs[0]
		now := c.now()
		h.SagaID, h.At, h.Phase = id, now, rec.Phase
		rec.LastError = h.Detail
		return c.db.WriteTransitions(ctx, t, []driver.Transition{{Saga: &rec, History: []driver.HistoryRecord{h}}}, now, true)
	})
	if err != nil {
		c.log.Warn("could not record on its saga that a reply was dead-lettered", "saga_id", id.String(), "message_id", h.MessageID.String(), "err", err)
	}
}
