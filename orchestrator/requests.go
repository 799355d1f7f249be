package orchestrator

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store"
)

// requestBatch is the most operator requests one pass applies.
const requestBatch = 20

// applyRequests applies operator requests recorded by tools that have no
// saga definitions (the sagabox CLI). Each request is claimed with SKIP
// LOCKED, applied with Retry or Abort, and marked with its outcome; a
// request for a definition version this orchestrator does not run is left
// for one that does.
func (c *Client) applyRequests(ctx context.Context) error {
	return c.store.InTx(ctx, func(tx pgx.Tx) error {
		ops, err := c.store.SagaOperationClaimPending(ctx, tx, requestBatch)
		if err != nil {
			return err
		}
		for _, op := range ops {
			kind := saga.EventRetry
			if op.Action == "abort" {
				kind = saga.EventAbort
			}
			_, err := c.operate(ctx, op.SagaID, kind, op.Actor, op.Reason)
			refusal := ""
			switch {
			case err == nil:
			case errors.Is(err, saga.ErrUnknownDefinition):
				c.log.Warn("operator request left for an orchestrator that runs the saga's definition",
					"request_id", op.ID, "saga_id", op.SagaID.String(), "err", err)
				continue
			case errors.Is(err, saga.ErrInvalidTransition), errors.Is(err, store.ErrNotFound):
				refusal = err.Error()
				c.log.Warn("operator request refused", "request_id", op.ID, "saga_id", op.SagaID.String(),
					"action", op.Action, "actor", op.Actor, "err", err)
			default:
				if ctx.Err() != nil {
					return ctx.Err()
				}
				c.log.Warn("operator request not applied; will try again", "request_id", op.ID, "saga_id", op.SagaID.String(), "err", err)
				continue
			}
			if err := c.store.SagaOperationMarkApplied(ctx, tx, op.ID, c.now(), refusal); err != nil {
				return fmt.Errorf("operator request %d: %w", op.ID, err)
			}
		}
		return nil
	})
}
