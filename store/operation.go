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

// SagaOperation is an operator action requested from outside an
// orchestrator (the CLI), which a running orchestrator applies.
type SagaOperation struct {
	ID     int64
	SagaID uuid.UUID
	// Action is "retry" or "abort".
	Action      string
	Actor       string
	Reason      string
	RequestedAt time.Time
	// AppliedAt is when an orchestrator handled the request; nil while it
	// is pending.
	AppliedAt *time.Time
	// Error is why the orchestrator refused the action; empty when applied.
	Error string
}

func sagaOperation(r *dbsqlc.SagaboxSagaOperation) SagaOperation {
	return SagaOperation{
		ID: r.ID, SagaID: r.SagaID, Action: r.Action, Actor: r.Actor, Reason: r.Reason,
		RequestedAt: r.RequestedAt, AppliedAt: r.AppliedAt, Error: r.Error,
	}
}

// SagaOperationRequest records a request for action on saga id.
func (s *Store) SagaOperationRequest(ctx context.Context, id uuid.UUID, action, actor, reason string) (SagaOperation, error) {
	r, err := s.queries.SagaOperationInsert(ctx, s.db(nil), &dbsqlc.SagaOperationInsertParams{
		SagaID: id, Action: action, Actor: actor, Reason: reason,
	})
	if err != nil {
		return SagaOperation{}, fmt.Errorf("request %s of saga %s: %w", action, id, err)
	}
	return sagaOperation(r), nil
}

// SagaOperationClaimPending locks in tx up to max pending requests, oldest
// first, skipping requests another orchestrator holds. It claims only
// requests for sagas of the definitions in keys, and requests for sagas
// that do not exist.
func (s *Store) SagaOperationClaimPending(ctx context.Context, tx pgx.Tx, max int, keys []SagaKey) ([]SagaOperation, error) {
	p := &dbsqlc.SagaOperationClaimPendingParams{Max: int32(max), SagaTypes: make([]string, len(keys)), Versions: make([]int32, len(keys))}
	for i, k := range keys {
		p.SagaTypes[i], p.Versions[i] = k.Type, int32(k.Version)
	}
	rows, err := s.queries.SagaOperationClaimPending(ctx, s.db(tx), p)
	if err != nil {
		return nil, fmt.Errorf("claim pending operator requests: %w", err)
	}
	out := make([]SagaOperation, len(rows))
	for i, r := range rows {
		out[i] = sagaOperation(r)
	}
	return out, nil
}

// SagaOperationMarkApplied records in tx that request id was handled at at;
// refusal is why it was refused, or empty.
func (s *Store) SagaOperationMarkApplied(ctx context.Context, tx pgx.Tx, id int64, at time.Time, refusal string) error {
	if err := s.queries.SagaOperationMarkApplied(ctx, s.db(tx), &dbsqlc.SagaOperationMarkAppliedParams{
		ID: id, AppliedAt: at, Error: refusal,
	}); err != nil {
		return fmt.Errorf("mark operator request %d handled: %w", id, err)
	}
	return nil
}

// SagaOperationGet returns request id, or an error wrapping message.ErrNotFound.
func (s *Store) SagaOperationGet(ctx context.Context, id int64) (SagaOperation, error) {
	r, err := s.queries.SagaOperationGet(ctx, s.db(nil), id)
	if errors.Is(err, pgx.ErrNoRows) {
		return SagaOperation{}, fmt.Errorf("operator request %d: %w", id, message.ErrNotFound)
	}
	if err != nil {
		return SagaOperation{}, fmt.Errorf("get operator request %d: %w", id, err)
	}
	return sagaOperation(r), nil
}
