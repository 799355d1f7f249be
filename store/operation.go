package store

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/sagabox/sagabox/store/driver"

	"github.com/jackc/pgx/v5"

	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store/internal/dbsqlc"
)

func operation(r *dbsqlc.SagaboxSagaOperation) driver.Operation {
	op := driver.Operation{
		ID: r.ID, SagaID: r.SagaID, Action: r.Action, Actor: r.Actor, Reason: r.Reason,
		RequestedAt: r.RequestedAt, Error: r.Error, Params: r.Params,
	}
	if r.AppliedAt != nil {
		op.AppliedAt = *r.AppliedAt
	}
	if r.WithdrawnAt != nil {
		op.WithdrawnAt, op.WithdrawnBy = *r.WithdrawnAt, r.WithdrawnBy
	}
	return op
}

// OperationRequest records the operator request op.
func (s *executor) OperationRequest(ctx context.Context, op driver.NewOperation) (driver.Operation, error) {
	db, err := s.pooled()
	if err != nil {
		return driver.Operation{}, err
	}
	r, err := s.queries.SagaOperationInsert(ctx, db, &dbsqlc.SagaOperationInsertParams{
		SagaID: op.SagaID, Action: op.Action, Actor: op.Actor, Reason: op.Reason, Params: op.Params,
	})
	if err != nil {
		return driver.Operation{}, fmt.Errorf("request %s of saga %s: %w", op.Action, op.SagaID, err)
	}
	return operation(r), nil
}

// OperationClaim begins t by locking the oldest pending request for a saga
// of the definitions keys (or for a saga that does not exist), skipping
// requests another orchestrator holds. It returns nil when there is none.
func (s *executor) OperationClaim(ctx context.Context, t driver.Tx, keys []driver.SagaKey) (*driver.Operation, error) {
	p := &dbsqlc.SagaOperationClaimParams{SagaTypes: make([]string, len(keys)), Versions: make([]int32, len(keys))}
	for i, k := range keys {
		p.SagaTypes[i], p.Versions[i] = k.Type, int32(k.Version)
	}
	r, err := s.queries.SagaOperationClaim(ctx, txOf(t).exec(ctx, false), p)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("claim pending operator request: %w", err)
	}
	op := operation(r)
	return &op, nil
}

// OperationMark records in t that request id was handled at at (refusal is
// why it was refused, or empty), with t's next round trip (Commit).
func (s *executor) OperationMark(ctx context.Context, t driver.Tx, id int64, at time.Time, refusal string) error {
	what := fmt.Sprintf("mark operator request %d handled", id)
	if err := s.queries.SagaOperationMarkApplied(ctx, txOf(t).later(what), &dbsqlc.SagaOperationMarkAppliedParams{
		ID: id, AppliedAt: at, Error: storableText(refusal),
	}); err != nil {
		return fmt.Errorf("mark operator request %d handled: %w", id, err)
	}
	return nil
}

// OperationGet returns request id, or an error wrapping message.ErrNotFound.
func (s *executor) OperationGet(ctx context.Context, id int64) (driver.Operation, error) {
	db, err := s.pooled()
	if err != nil {
		return driver.Operation{}, err
	}
	r, err := s.queries.SagaOperationGet(ctx, db, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return driver.Operation{}, fmt.Errorf("operator request %d: %w", id, message.ErrNotFound)
	}
	if err != nil {
		return driver.Operation{}, fmt.Errorf("get operator request %d: %w", id, err)
	}
	return operation(r), nil
}

// OperationListPending lists up to max pending requests, oldest first, after
// request afterID.
func (s *executor) OperationListPending(ctx context.Context, afterID int64, max int) ([]driver.Operation, error) {
	db, err := s.pooled()
	if err != nil {
		return nil, err
	}
	rows, err := s.queries.SagaOperationListPendingAfter(ctx, db, &dbsqlc.SagaOperationListPendingAfterParams{AfterID: afterID, Max: int32(max)})
	if err != nil {
		return nil, fmt.Errorf("list pending operator requests: %w", err)
	}
	out := make([]driver.Operation, len(rows))
	for i, r := range rows {
		out[i] = operation(r)
	}
	return out, nil
}

// OperationWithdraw withdraws pending request id on behalf of actor.
func (s *executor) OperationWithdraw(ctx context.Context, id int64, actor string) (driver.Operation, error) {
	db, err := s.pooled()
	if err != nil {
		return driver.Operation{}, err
	}
	r, err := s.queries.SagaOperationWithdraw(ctx, db, &dbsqlc.SagaOperationWithdrawParams{ID: id, Actor: storableText(actor)})
	if errors.Is(err, pgx.ErrNoRows) {
		op, err := s.OperationGet(ctx, id)
		if err != nil {
			return driver.Operation{}, err
		}
		return op, fmt.Errorf("withdraw operator request %d: %w", id, driver.ErrNotPending)
	}
	if err != nil {
		return driver.Operation{}, fmt.Errorf("withdraw operator request %d: %w", id, err)
	}
	return operation(r), nil
}

// OperationList returns up to limit requests: the pending ones oldest first,
// or with all every one newest first.
func (s *executor) OperationList(ctx context.Context, all bool, limit int) ([]driver.Operation, error) {
	db, err := s.pooled()
	if err != nil {
		return nil, err
	}
	var rows []*dbsqlc.SagaboxSagaOperation
	if all {
		rows, err = s.queries.SagaOperationListRecent(ctx, db, int32(min(limit, math.MaxInt32)))
	} else {
		rows, err = s.queries.SagaOperationListPending(ctx, db, int32(min(limit, math.MaxInt32)))
	}
	if err != nil {
		return nil, fmt.Errorf("list operator requests of schema %q: %w", s.schema, err)
	}
	out := make([]driver.Operation, len(rows))
	for i, r := range rows {
		out[i] = operation(r)
	}
	return out, nil
}

// OperationCountPending counts the pending requests.
func (s *executor) OperationCountPending(ctx context.Context) (int64, error) {
	db, err := s.pooled()
	if err != nil {
		return 0, err
	}
	n, err := s.queries.SagaOperationCountPending(ctx, db)
	if err != nil {
		return 0, fmt.Errorf("count pending operator requests of schema %q: %w", s.schema, err)
	}
	return n, nil
}
