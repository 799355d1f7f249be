package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

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

// componentName is the component attribute of the Client's spans and
// metrics.
const componentName = "orchestrator"

const (
	// databaseRetryDelay is how long a reply that could not be applied
	// because the database is unreachable waits before it is delivered
	// again. Such failures do not count against ReplyRetry.
	databaseRetryDelay = time.Second
)

// replyOutcome is what processing one reply amounted to.
type replyOutcome int

const (
	replyApplied replyOutcome = iota
	replyIgnored
	replyDuplicate
	replyUnknownSaga
)

// deadLetterError makes a reply go to the dead-letter queue; reason is
// recorded with it, class is the metric's reason class (a telemetry.Reason
// constant).
type deadLetterError struct {
	class, reason string
}

func (e *deadLetterError) Error() string { return e.reason }

// handleReply applies one reply in one transaction: inbox dedupe, saga row
// lock, core transition, new state + history + next commands. It acks only
// after the commit.
func (c *Client) handleReply(ctx context.Context, d *transport.Delivery) transport.Outcome {
	ctx, span := c.tel.StartProcess(ctx, &d.Envelope, componentName)
	defer span.End()
	span.SetAttributes(telemetry.AttrSchema.String(c.cfg.Schema))
	log := c.log.With("message_id", d.MessageID.String(), "saga_id", d.SagaID.String(), "saga_type", d.SagaType,
		"type", d.Type, "kind", string(d.Kind), "step", d.Step, "attempt", d.Attempt)

	if !d.Kind.IsReply() {
		reason := fmt.Sprintf("message %s of kind %q reached the reply queue %s: only replies are handled here", d.MessageID, d.Kind, c.cfg.Service)
		return c.deadLetterReply(ctx, d, log, telemetry.ReasonUnexpectedKind, reason)
	}

	var out replyOutcome
	var tr transition
	err := c.store.InTxRetrying(ctx, store.DefaultConflictRetries, func(tx pgx.Tx) error {
		var txErr error
		out, tr, txErr = c.processReply(ctx, tx, d)
		return txErr
	})
	var dl *deadLetterError
	switch {
	case errors.As(err, &dl):
		c.recordUnapplied(ctx, d, dl.reason)
		return c.deadLetterReply(ctx, d, log, dl.class, dl.reason)
	case err != nil:
		telemetry.Fail(span, err)
		span.SetAttributes(telemetry.AttrOutcome.String(telemetry.OutcomeRetry))
		c.tel.Handled(ctx, c.cfg.Schema, componentName, d.Type, telemetry.OutcomeRetry)
		if ctx.Err() != nil {
			log.Warn("reply not applied: stopping; it will be redelivered", "err", err)
			return transport.Retry(0)
		}
		return c.retryReply(ctx, d, log, err)
	}
	inbox := telemetry.InboxNew
	if out == replyDuplicate {
		inbox = telemetry.InboxDuplicate
	}
	span.SetAttributes(telemetry.AttrInbox.String(inbox))
	var outcome string
	switch out {
	case replyDuplicate:
		outcome = telemetry.OutcomeDuplicate
		c.tel.Duplicate(ctx, c.cfg.Schema, d.Type)
		log.Debug("duplicate reply acknowledged without effect")
	case replyUnknownSaga:
		outcome = telemetry.OutcomeUnknownSaga
		log.Warn("reply for a saga that does not exist here acknowledged without effect")
	case replyIgnored:
		outcome = telemetry.OutcomeIgnored
		log.Info("reply ignored", "reason", tr.res.IgnoreReason)
	case replyApplied:
		outcome = telemetry.OutcomeApplied
		span.SetAttributes(telemetry.AttrStatus.String(string(tr.res.Instance.Status)), telemetry.AttrPhase.String(string(tr.res.Instance.Phase)))
		// Latency since the saga's previous transition, normally the one
		// that sent the command this reply answers.
		c.tel.StepDone(ctx, tr.rec.Type, d.Step, string(tr.phase), tr.rec.UpdatedAt.Sub(tr.since))
		c.committed(ctx, tr)
	}
	span.SetAttributes(telemetry.AttrOutcome.String(outcome))
	c.tel.Handled(ctx, c.cfg.Schema, componentName, d.Type, outcome)
	return transport.Ack()
}

// retryReply decides what becomes of a reply that could not be applied:
// delivered again after a backoff, or, once ReplyRetry.MaxAttempts attempts
// failed, dead-lettered and recorded on its saga. Attempts are counted in
// the inbox attempt table, outside the rolled-back transaction; failures to
// reach the database are not counted.
func (c *Client) retryReply(ctx context.Context, d *transport.Delivery, log *slog.Logger, cause error) transport.Outcome {
	if store.IsConnectionError(cause) {
		// The database is down for every reply: hold this one (and the
		// worker) for the delay, then put it back, rather than cycling the
		// whole backlog through the broker's retry queues.
		log.Warn("reply not applied: database unreachable; will retry", "err", cause, "retry_in", databaseRetryDelay)
		lifecycle.Pause(ctx, databaseRetryDelay)
		return transport.Retry(0)
	}
	attempts, err := c.store.InboxAttemptRecord(ctx, &d.Envelope, cause.Error())
	if err != nil {
		log.Warn("reply not applied, and its attempt could not be recorded; will retry", "err", cause, "record_err", err, "retry_in", databaseRetryDelay)
		return transport.Retry(databaseRetryDelay)
	}
	if attempts >= c.cfg.ReplyRetry.MaxAttempts {
		reason := fmt.Sprintf("reply could not be applied after %d attempts: %v", attempts, cause)
		if err := c.store.InboxAttemptMarkDeadLettered(ctx, nil, &d.Envelope, reason); err != nil {
			log.Warn("could not mark the reply's attempts dead-lettered", "err", err)
		}
		c.recordUnapplied(ctx, d, reason)
		return c.deadLetterReply(ctx, d, log, telemetry.ReasonRetriesExhausted, reason)
	}
	delay := c.cfg.ReplyRetry.Backoff(attempts)
	log.Error("reply not applied; will retry", "err", cause, "delivery_attempt", attempts, "retry_in", delay)
	return transport.Retry(delay)
}

// deadLetterReply dead-letters d, logging and counting it once.
func (c *Client) deadLetterReply(ctx context.Context, d *transport.Delivery, log *slog.Logger, class, reason string) transport.Outcome {
	span := trace.SpanFromContext(ctx)
	span.SetAttributes(telemetry.AttrOutcome.String(telemetry.OutcomeDeadLetter), telemetry.AttrReason.String(class))
	span.SetStatus(codes.Error, reason)
	c.tel.DeadLetter(ctx, c.cfg.Schema, componentName, class)
	c.tel.Handled(ctx, c.cfg.Schema, componentName, d.Type, telemetry.OutcomeDeadLetter)
	log.Error("message dead-lettered", "reason", reason, "reason_class", class)
	return transport.DeadLetter(reason)
}

func (c *Client) processReply(ctx context.Context, tx pgx.Tx, d *transport.Delivery) (replyOutcome, transition, error) {
	dup, err := c.store.InboxRecord(ctx, tx, &d.Envelope)
	if err != nil {
		return 0, transition{}, err
	}
	if dup {
		return replyDuplicate, transition{}, nil
	}
	rec, err := c.store.SagaGetForUpdate(ctx, tx, d.SagaID)
	if errors.Is(err, message.ErrNotFound) {
		return replyUnknownSaga, transition{}, nil
	}
	if err != nil {
		return 0, transition{}, err
	}
	runner, err := c.registry.Lookup(rec.Type, rec.Version)
	if err != nil {
		return 0, transition{}, &deadLetterError{class: telemetry.ReasonUnknownDefinition, reason: fmt.Sprintf(
			"reply %s for saga %s cannot be applied: %v; this orchestrator runs %v (deploy an orchestrator that registers %s v%d, then move the message back from the dead-letter queue)",
			d.MessageID, rec.ID, err, c.definitionNames(), rec.Type, rec.Version)}
	}
	s, err := sagaFromRecord(&rec)
	if err != nil {
		return 0, transition{}, &deadLetterError{class: telemetry.ReasonInvalidInstance, reason: err.Error()}
	}
	kind := saga.EventReplySuccess
	if d.Kind == message.KindReplyFailure {
		kind = saga.EventReplyFailure
	}
	now := c.now()
	res, err := runner.Apply(withTx(ctx, tx), s.Instance(), saga.Event{
		Kind: kind, Type: d.Type, Step: d.Step, StepIndex: d.StepIndex, Attempt: d.Attempt,
		Payload: d.Payload, MessageID: d.MessageID, At: now,
	})
	switch {
	case errors.Is(err, saga.ErrInvalidPayload):
		return 0, transition{}, &deadLetterError{class: telemetry.ReasonInvalidPayload, reason: fmt.Sprintf("reply %s for saga %s: %v", d.MessageID, rec.ID, err)}
	case errors.Is(err, saga.ErrInvalidInstance), errors.Is(err, saga.ErrInvalidEvent):
		return 0, transition{}, &deadLetterError{class: telemetry.ReasonInvalidInstance, reason: fmt.Sprintf("reply %s for saga %s: %v", d.MessageID, rec.ID, err)}
	case err != nil:
		return 0, transition{}, err
	}
	tr, err := c.write(ctx, tx, rec, res, now)
	if err != nil {
		return 0, transition{}, err
	}
	tr.phase = s.Phase
	if res.Ignored {
		return replyIgnored, tr, nil
	}
	return replyApplied, tr, nil
}

// recordUnapplied makes a dead-lettered reply visible on its saga: a
// history entry and LastError, in a transaction of its own (the reply's was
// rolled back, so the reply is not in the inbox and can be replayed).
func (c *Client) recordUnapplied(ctx context.Context, d *transport.Delivery, reason string) {
	err := c.store.InTx(ctx, func(tx pgx.Tx) error {
		rec, err := c.store.SagaGetForUpdate(ctx, tx, d.SagaID)
		if err != nil {
			return err
		}
		now := c.now()
		if err := c.store.SagaHistoryInsert(ctx, tx, rec.ID, []store.HistoryRecord{{
			At: now, Event: string(HistoryReplyDeadLettered), Step: d.Step, StepIndex: d.StepIndex, Phase: rec.Phase,
			Attempt: d.Attempt, Detail: reason, MessageID: d.MessageID,
		}}); err != nil {
			return err
		}
		rec.LastError = reason
		return c.store.SagaUpdate(ctx, tx, rec, now)
	})
	if err != nil && !errors.Is(err, message.ErrNotFound) {
		c.log.Warn("could not record the dead-lettered reply on its saga", "message_id", d.MessageID.String(), "saga_id", d.SagaID.String(), "err", err)
	}
}
