package orchestrator

import (
	"context"
	"errors"
	"fmt"

	"github.com/sagabox/sagabox/internal/engine"
	"github.com/sagabox/sagabox/internal/telemetry"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store/driver"
)

// requestBatch is the most operator requests one pass applies.
const requestBatch = 20

// applyRequests applies operator requests recorded by tools that have no
// saga definitions (the sagabox CLI), up to requestBatch of them. Only
// requests for sagas of the definitions this orchestrator runs are claimed;
// the others are left for an orchestrator that runs them.
func (c *Client) applyRequests(ctx context.Context) error {
	keys := c.sagaKeys()
	for range requestBatch {
		found, err := c.applyRequest(ctx, keys)
		if err != nil || !found {
			return err
		}
	}
	return nil
}

// applyRequest claims the oldest pending request (SKIP LOCKED), applies it
// as Retry, Cancel or Terminate would and marks it with its outcome, all in one
// transaction: the action is applied if and only if its request is marked,
// so a request is never applied twice. It reports whether it found one.
func (c *Client) applyRequest(ctx context.Context, keys []driver.SagaKey) (found bool, err error) {
	var op *driver.Operation
	var kind saga.EventKind
	var applied operatorAction
	var tr transition
	var refusal error
	err = engine.Retrying(ctx, func() error {
		t := c.db.Begin()
		defer t.Rollback(ctx)
		var err error
		if op, err = c.db.ClaimOperation(ctx, t, keys); err != nil || op == nil {
			return err
		}
		var act operatorAction
		act, refusal = operatorActionOf(op)
		kind = act.kind
		sp, err := t.Savepoint(ctx)
		if err != nil {
			return err
		}
		defer sp.Rollback(context.WithoutCancel(ctx))
		opCtx, span := c.startOperation(ctx, op.SagaID, kind, op.Actor)
		defer span.End()
		if refusal == nil {
			refusal = checkActor(op.Actor)
		}
		if refusal == nil {
			tr, refusal = c.operateTx(opCtx, t, op.SagaID, act)
			applied = act
		}
		switch {
		case refusal == nil:
			if err := sp.Commit(ctx); err != nil {
				return err
			}
			if err := c.db.WriteTransitions(ctx, t, writes(tr), tr.at, false); err != nil {
				return err
			}
		case refused(refusal):
			telemetry.Fail(span, refusal)
			if err := sp.Rollback(ctx); err != nil {
				return err
			}
		default:
			// Transient (the database): claimed again next pass.
			telemetry.Fail(span, refusal)
			return refusal
		}
		reason := ""
		if refusal != nil {
			reason = fmt.Sprintf("%s saga %s: %v", kind, op.SagaID, refusal)
		}
		return c.db.MarkOperation(ctx, t, op.ID, c.now(), reason)
	})
	if op == nil {
		return false, err
	}
	if err != nil {
		return true, fmt.Errorf("operator request %d (%s saga %s): %w", op.ID, op.Action, op.SagaID, err)
	}
	if refusal != nil {
		c.log.Warn("operator request refused", "request_id", op.ID, "saga_id", op.SagaID.String(),
			"action", op.Action, "actor", op.Actor, "err", refusal)
		return true, nil
	}
	c.operated(ctx, tr, applied)
	return true, nil
}

// refused reports whether err refuses an operator action for good: the
// action is not allowed, the saga or its definition does not exist, or the
// saga core cannot apply it. Only database errors are worth another try.
func refused(err error) bool {
	for _, target := range []error{
		errNoActor, message.ErrNotFound, saga.ErrInvalidTransition, saga.ErrUnknownDefinition,
		saga.ErrInvalidInstance, saga.ErrInvalidEvent, saga.ErrInvalidPayload,
	} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

// sagaKeys names the definitions the Client runs.
func (c *Client) sagaKeys() []driver.SagaKey {
	runners := c.registry.Runners()
	keys := make([]driver.SagaKey, 0, len(runners))
	for _, r := range runners {
		keys = append(keys, driver.SagaKey{Type: r.Name(), Version: r.Version()})
	}
	return keys
}

// requestKind is the event of an operator request's action: "retry",
// "cancel" ("abort", its former name, from an older CLI) or "terminate".
func requestKind(action string) saga.EventKind {
	switch action {
	case "cancel", "abort":
		return saga.EventCancel
	case "terminate":
		return saga.EventTerminate
	case "retry":
		return saga.EventRetry
	case "restart":
		return saga.EventRestart
	}
	return saga.EventKind(action) // unknown: the saga core refuses it
}
