package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/sagabox/sagabox/internal/engine"
	"github.com/sagabox/sagabox/internal/telemetry"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store/driver"
	"github.com/sagabox/sagabox/transport"
)

// noteDeadline tells the sweeper about a deadline just written; it wakes the
// sweeper if the deadline is earlier than its next planned pass.
func (c *Client) noteDeadline(d time.Time) {
	c.sweepMu.Lock()
	defer c.sweepMu.Unlock()
	if !c.sweepNext.IsZero() && !d.Before(c.sweepNext) {
		return
	}
	c.sweepNext = d
	select {
	case c.sweepWake <- struct{}{}:
	default:
	}
}

// untilNext returns how long the sweeper waits before its next pass: until
// the earliest deadline it was told about, at most SweepInterval.
func (c *Client) untilNext() time.Duration {
	c.sweepMu.Lock()
	defer c.sweepMu.Unlock()
	wait := c.cfg.SweepInterval
	if !c.sweepNext.IsZero() {
		wait = min(wait, max(0, c.sweepNext.Sub(c.now())))
	}
	return wait
}

// sweepLoop fires due deadlines every SweepInterval, or sooner when a nearer
// deadline is written, until ctx is cancelled. Its transactions run on
// workCtx so that a pass in flight finishes on shutdown.
func (c *Client) sweepLoop(ctx, workCtx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	failures := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.sweepWake:
			t.Reset(c.untilNext())
			continue
		case <-t.C:
		}
		c.sweepMu.Lock()
		c.sweepNext = c.now().Add(c.cfg.SweepInterval)
		c.sweepMu.Unlock()
		for ctx.Err() == nil {
			n, failed, err := c.sweepPass(workCtx)
			if err != nil {
				failures++
				if ctx.Err() == nil {
					c.log.Warn("deadline sweep failed; will try again", "err", err, "failures", failures)
				}
				break
			}
			failures = 0
			// A full batch may have more behind it, unless some of it
			// failed: those sagas are claimed again first, so wait.
			if n < c.cfg.SweepBatch || failed > 0 {
				break
			}
		}
		if err := c.applyRequests(workCtx); err != nil && ctx.Err() == nil {
			c.log.Warn("applying operator requests failed; will try again", "err", err)
		}
		t.Reset(c.untilNext())
	}
}

// sweep claims up to SweepBatch sagas whose deadline has passed (skipping
// sagas locked by other orchestrators or replies) and applies a timer event
// to each, in one transaction, so each deadline fires once. It returns how
// many sagas it claimed.
func (c *Client) sweep(ctx context.Context) (int, error) {
	n, _, err := c.sweepPass(ctx)
	return n, err
}

// sweepPass is sweep; it also returns how many of the claimed sagas failed
// for a reason that may pass (a local step's database work): each is left
// out of the pass's writes and claimed again next pass. A timer that the
// saga core refuses is no such failure: it is recorded on the saga (see
// deadlineFailed) and the saga is not claimed again. The claim goes out
// with BEGIN and every transition with COMMIT: two round trips a pass.
func (c *Client) sweepPass(ctx context.Context) (claimed, failed int, err error) {
	keys := c.sagaKeys()
	var trs []transition
	err = engine.Retrying(ctx, func() error {
		trs, failed = trs[:0], 0
		now := c.now()
		due, paused := c.dueBefore(now)
		if paused {
			return nil
		}
		t := c.db.Begin(nil)
		defer t.Rollback(ctx)
		recs, err := c.db.SagaClaimDue(ctx, t, due, c.cfg.SweepBatch, keys)
		if err != nil {
			return err
		}
		claimed = len(recs)
		unpublished, err := c.unpublishedOf(ctx, t, recs)
		if err != nil {
			return err
		}
		for _, rec := range recs {
			tr, err := c.fire(ctx, t, rec, now, unpublished[rec.ID])
			var refused *timerRefusedError
			switch {
			case err == nil:
				trs = append(trs, tr)
			case ctx.Err() != nil:
				return err
			case errors.As(err, &refused):
				trs = append(trs, c.deadlineFailed(rec, now, refused.err))
			default:
				failed++
				c.log.Error("deadline not applied; will try again", "saga_id", rec.ID.String(), "saga_type", rec.Type, "err", err)
			}
		}
		return c.writeAndCommit(ctx, t, writes(trs...), now)
	})
	if err != nil {
		return 0, 0, err
	}
	for _, tr := range trs {
		if tr.deadlineFailed {
			continue
		}
		if len(tr.res.History) > 0 {
			c.tel.DeadlineFired(ctx, tr.rec.Type)
			c.countResends(ctx, tr, telemetry.CauseTimeout)
		}
	}
	c.committed(ctx, trs...)
	return claimed, failed, nil
}

// unpublishedOf returns the commands and compensations still unpublished
// of the claimed sagas recs whose definition has a schedule-to-start
// timeout (saga.WithScheduleToStartTimeout), by saga: their timers need to
// know. Other sagas are claimed only when none of theirs is unpublished
// (see driver.Executor.SagaClaimDue), so they cost nothing.
func (c *Client) unpublishedOf(ctx context.Context, t driver.Tx, recs []driver.SagaRecord) (map[uuid.UUID][]driver.UnpublishedMessage, error) {
	var ids []uuid.UUID
	for _, rec := range recs {
		if runner, err := c.registry.Lookup(rec.Type, rec.Version); err == nil && hasScheduleToStart(runner) {
			ids = append(ids, rec.ID)
		}
	}
	if len(ids) == 0 {
		return nil, nil
	}
	msgs, err := c.db.SagaUnpublished(ctx, t, ids)
	if err != nil {
		return nil, err
	}
	out := make(map[uuid.UUID][]driver.UnpublishedMessage, len(ids))
	for _, m := range msgs {
		out[m.SagaID] = append(out[m.SagaID], m)
	}
	return out, nil
}

// hasScheduleToStart reports whether a step of runner has a
// schedule-to-start timeout.
func hasScheduleToStart(runner saga.Runner) bool {
	for _, st := range runner.Steps() {
		if st.ScheduleToStartTimeout > 0 {
			return true
		}
	}
	return false
}

// refsOf names the unpublished messages msgs as the saga core does.
func refsOf(msgs []driver.UnpublishedMessage) []saga.MessageRef {
	out := make([]saga.MessageRef, 0, len(msgs))
	for _, m := range msgs {
		out = append(out, saga.MessageRef{StepIndex: m.StepIndex, Phase: saga.Phase(m.Kind.Phase()), Attempt: m.Attempt})
	}
	return out
}

// withdrawn returns the message ids of the messages of msgs that the core
// gave up on (refs).
func withdrawn(msgs []driver.UnpublishedMessage, refs []saga.MessageRef) []uuid.UUID {
	var ids []uuid.UUID
	for _, m := range msgs {
		if slices.Contains(refs, saga.MessageRef{StepIndex: m.StepIndex, Phase: saga.Phase(m.Kind.Phase()), Attempt: m.Attempt}) {
			ids = append(ids, m.MessageID)
		}
	}
	return ids
}

// timerRefusedError is an error of the saga core applying a timer: the
// stored instance does not fit the definition, or a command cannot be
// built. The core is deterministic, so another pass would fail alike.
type timerRefusedError struct{ err error }

func (e *timerRefusedError) Error() string { return e.err.Error() }
func (e *timerRefusedError) Unwrap() error { return e.err }

// deadlineFailed returns the transition that records, on the claimed saga
// rec, why its timer was not applied (history and LastError), and clears its
// deadline so that it is not claimed again: the saga stays as it is,
// visibly, for an operator.
func (c *Client) deadlineFailed(rec driver.SagaRecord, now time.Time, cause error) transition {
	reason := fmt.Sprintf("deadline %s not applied: %v", rec.Deadline.UTC().Format(time.RFC3339Nano), cause)
	c.log.Error("deadline cannot be applied; recorded on the saga and cleared", "saga_id", rec.ID.String(), "saga_type", rec.Type, "err", cause)
	next := rec
	next.LastError, next.Deadline = reason, time.Time{}
	return transition{rec: next, deadlineFailed: true, res: saga.Result{Ignored: true}, write: driver.Transition{
		Saga: &next,
		History: []driver.HistoryRecord{{
			SagaID: rec.ID, At: now, Event: string(HistoryDeadlineFailed), StepIndex: rec.CurrentStep, Phase: rec.Phase,
			Attempt: rec.Attempts, Detail: reason,
		}},
	}}
}

// countResends counts the commands of tr sent again (attempt > 1).
func (c *Client) countResends(ctx context.Context, tr transition, cause telemetry.Cause) {
	for _, o := range tr.res.Emit {
		if o.Attempt > 1 {
			c.tel.Retry(ctx, componentName, o.Type, cause)
		}
	}
}

// fire applies the timer of one claimed saga, in a span of its own, a
// child of the span that started the saga: the commands it sends
// (re-sends, compensations) stay in the saga's trace. A definition with
// local steps runs under a savepoint of t, so that a failing saga leaves
// none of its steps' writes behind.
func (c *Client) fire(ctx context.Context, t driver.Tx, rec driver.SagaRecord, now time.Time, unpublished []driver.UnpublishedMessage) (_ transition, err error) {
	ctx, span := c.sagaSpan(ctx, "saga deadline", rec)
	defer endSpan(span, &err)
	runner, err := c.registry.Lookup(rec.Type, rec.Version)
	if err != nil {
		return transition{}, err // not claimed: ClaimDueSagas filters on known definitions
	}
	s, err := sagaFromRecord(&rec)
	if err != nil {
		return transition{}, &timerRefusedError{err}
	}
	scope, sp, err := c.coreScope(ctx, t, runner)
	if err != nil {
		return transition{}, err
	}
	if sp != nil {
		defer sp.Rollback(context.WithoutCancel(ctx))
	}
	res, err := runner.Apply(scope, s.Instance(), saga.Event{Kind: saga.EventTimer, At: now, Unpublished: refsOf(unpublished)})
	if err != nil {
		return transition{}, &timerRefusedError{err}
	}
	if res.Ignored {
		// The row's deadline has passed but the core sees nothing due: the
		// row's deadline is out of step with the step states. Rewrite it
		// from them so the saga is not claimed in a loop.
		res.Instance.Deadline = saga.EarliestDeadline(res.Instance.Steps)
		if !res.Instance.Deadline.After(now) {
			c.log.Error("saga has a past deadline that its steps do not explain; clearing it", "saga_id", rec.ID.String(), "reason", res.IgnoreReason)
			res.Instance.Deadline = time.Time{}
		}
		res.Ignored = false
	}
	tr, err := c.transition(ctx, rec, res, now)
	if err != nil {
		return transition{}, err
	}
	tr.phase, tr.at = s.Phase, now
	if len(res.Withdraw) > 0 {
		tr.write.Withdraw = withdrawn(unpublished, res.Withdraw)
		for _, r := range res.Withdraw {
			c.log.Warn("a step's command was not published within its schedule-to-start timeout: withdrawn from the outbox, the saga compensates",
				"saga_id", rec.ID.String(), "saga_type", rec.Type, "step", s.Steps[r.StepIndex].Name, "attempt", r.Attempt, "last_error", res.Instance.LastError)
		}
	}
	if sp != nil {
		if err := sp.Commit(ctx); err != nil {
			return transition{}, err
		}
	}
	return tr, nil
}

// dueBefore returns the time deadlines are due before at now: now, or
// earlier after the broker was away (outageClock); paused while the broker
// is unreachable, when no deadline fires.
func (c *Client) dueBefore(now time.Time) (time.Time, bool) {
	a, ok := c.cfg.Broker.(transport.Availability)
	if !ok {
		return now, false
	}
	due, paused := c.outage.at(now, a.Unavailable())
	if paused {
		c.log.Debug("deadlines paused: the broker is unreachable")
	}
	return due, paused
}

// sagaSpan starts the span of background work on the saga rec (a fired
// deadline, an admission): a child of the span that started the saga, so
// that the commands it sends stay in the saga's trace.
func (c *Client) sagaSpan(ctx context.Context, name string, rec driver.SagaRecord) (context.Context, trace.Span) {
	ctx = telemetry.ExtractParent(ctx, rec.TraceParent, rec.TraceState)
	return c.tel.Tracer().Start(ctx, name+" "+rec.Type, trace.WithAttributes(
		telemetry.AttrSagaType.String(rec.Type), telemetry.AttrSagaID.String(rec.ID.String()), telemetry.AttrSchema.String(c.cfg.Schema)))
}

// endSpan ends span, failed with *err if that is not nil: defer it with
// the address of the function's named error result.
func endSpan(span trace.Span, err *error) {
	if *err != nil {
		telemetry.Fail(span, *err)
	}
	span.End()
}

// coreScope returns the context in which the saga core runs runner's
// local steps in t: for a definition with local steps, under a savepoint
// of t (returned, for the caller to release or roll back), so that a saga
// that fails leaves none of its steps' writes behind.
func (c *Client) coreScope(ctx context.Context, t driver.Tx, runner saga.Runner) (context.Context, pgx.Tx, error) {
	if !hasLocalStep(runner) {
		return c.localScope(ctx, t), nil, nil
	}
	sp, err := t.Savepoint(ctx)
	if err != nil {
		return nil, nil, err
	}
	return withTx(ctx, sp), sp, nil
}
