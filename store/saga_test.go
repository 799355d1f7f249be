package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store"
)

func newSaga(key string, deadline *time.Time) store.SagaRecord {
	return store.SagaRecord{
		ID: uuid.New(), Type: "checkout", Version: 1, Status: "running", StartKey: key,
		Data: []byte(`{}`), Steps: []byte(`[]`), Phase: "action", Deadline: deadline,
	}
}

func TestSagaInsertStartKeyIsIdempotent(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t)
	ctx := context.Background()
	now := time.Now()
	first := newSaga("order-1", nil)
	var got store.SagaRecord
	var inserted bool
	require.NoError(t, s.InTx(ctx, func(tx pgx.Tx) (err error) {
		got, inserted, err = s.SagaInsert(ctx, tx, first, now)
		return err
	}))
	require.True(t, inserted)
	require.NoError(t, s.InTx(ctx, func(tx pgx.Tx) (err error) {
		got, inserted, err = s.SagaInsert(ctx, tx, newSaga("order-1", nil), now)
		return err
	}))
	require.False(t, inserted)
	require.Equal(t, first.ID, got.ID, "a repeated start key returns the existing saga")
}

func TestSagaUpdateDetectsConflict(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t)
	ctx := context.Background()
	now := time.Now()
	rec := newSaga("", nil)
	require.NoError(t, s.InTx(ctx, func(tx pgx.Tx) error {
		_, _, err := s.SagaInsert(ctx, tx, rec, now)
		return err
	}))
	got, err := s.SagaGet(ctx, nil, rec.ID)
	require.NoError(t, err)
	got.Status = "completed"
	require.NoError(t, s.InTx(ctx, func(tx pgx.Tx) error { return s.SagaUpdate(ctx, tx, got, now) }))
	err = s.InTx(ctx, func(tx pgx.Tx) error { return s.SagaUpdate(ctx, tx, got, now) })
	require.ErrorIs(t, err, store.ErrConflict, "the second write carries a stale revision")

	_, err = s.SagaGet(ctx, nil, uuid.New())
	require.ErrorIs(t, err, message.ErrNotFound)
}

func TestSagaClaimDueSkipsLockedSagas(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t)
	ctx := context.Background()
	now := time.Now()
	past := now.Add(-time.Minute)
	future := now.Add(time.Hour)
	due1, due2, later := newSaga("", &past), newSaga("", &past), newSaga("", &future)
	require.NoError(t, s.InTx(ctx, func(tx pgx.Tx) error {
		for _, r := range []store.SagaRecord{due1, due2, later} {
			if _, _, err := s.SagaInsert(ctx, tx, r, now); err != nil {
				return err
			}
		}
		return nil
	}))

	txA, err := s.Pool().Begin(ctx)
	require.NoError(t, err)
	defer txA.Rollback(ctx)
	a, err := s.SagaClaimDue(ctx, txA, now, 1)
	require.NoError(t, err)
	require.Len(t, a, 1)

	txB, err := s.Pool().Begin(ctx)
	require.NoError(t, err)
	defer txB.Rollback(ctx)
	b, err := s.SagaClaimDue(ctx, txB, now, 10)
	require.NoError(t, err)
	require.Len(t, b, 1, "the saga locked by A is skipped, the future one is not due")
	require.NotEqual(t, a[0].ID, b[0].ID)
}

func TestSagaListStalestFirstWithPaging(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t)
	ctx := context.Background()
	base := time.Now().Add(-time.Hour)
	var ids []uuid.UUID
	for i := range 5 {
		r := newSaga("", nil)
		ids = append(ids, r.ID)
		require.NoError(t, s.InTx(ctx, func(tx pgx.Tx) error {
			_, _, err := s.SagaInsert(ctx, tx, r, base.Add(time.Duration(i)*time.Minute))
			return err
		}))
	}
	page1, err := s.SagaList(ctx, store.SagaFilter{Type: "checkout", Statuses: []string{"running"}, Limit: 3})
	require.NoError(t, err)
	require.Len(t, page1, 3)
	page2, err := s.SagaList(ctx, store.SagaFilter{Type: "checkout", Limit: 3, After: &page1[2]})
	require.NoError(t, err)
	require.Len(t, page2, 2)
	got := []uuid.UUID{}
	for _, r := range append(page1, page2...) {
		got = append(got, r.ID)
	}
	require.Equal(t, ids, got)
	none, err := s.SagaList(ctx, store.SagaFilter{Statuses: []string{"failed"}})
	require.NoError(t, err)
	require.Empty(t, none)
}

func TestSagaOperationRequests(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t)
	ctx := context.Background()
	id := uuid.New()
	op, err := s.SagaOperationRequest(ctx, id, "retry", "alice", "payment fixed")
	require.NoError(t, err)
	require.Nil(t, op.AppliedAt)

	txA, err := s.Pool().Begin(ctx)
	require.NoError(t, err)
	defer txA.Rollback(ctx)
	claimed, err := s.SagaOperationClaimPending(ctx, txA, 10, nil)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	require.Equal(t, "alice", claimed[0].Actor)

	// A second orchestrator skips the request A holds.
	txB, err := s.Pool().Begin(ctx)
	require.NoError(t, err)
	other, err := s.SagaOperationClaimPending(ctx, txB, 10, nil)
	require.NoError(t, err)
	require.Empty(t, other)
	require.NoError(t, txB.Rollback(ctx))

	require.NoError(t, s.SagaOperationMarkApplied(ctx, txA, op.ID, time.Now(), "saga is completed"))
	require.NoError(t, txA.Commit(ctx))
	got, err := s.SagaOperationGet(ctx, op.ID)
	require.NoError(t, err)
	require.NotNil(t, got.AppliedAt)
	require.Equal(t, "saga is completed", got.Error)

	_, err = s.SagaOperationRequest(ctx, id, "delete", "x", "y")
	require.Error(t, err, "only retry and abort are actions")
	_, err = s.SagaOperationGet(ctx, 999999)
	require.ErrorIs(t, err, message.ErrNotFound)
}
