package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/sagabox/sagabox/store/driver"
	"github.com/sagabox/sagabox/store/internal/dbsqlc"
)

// SagaAdmission reads, in tx, what a start of a saga of sagaType needs to
// run at once or be queued (see driver.Admission).
func (s *executor) SagaAdmission(ctx context.Context, tx pgx.Tx, sagaType string, maxRunning int, key string) (driver.Admission, error) {
	r, err := s.queries.SagaAdmission(ctx, s.db(tx), &dbsqlc.SagaAdmissionParams{
		SagaType: sagaType, MaxRunning: int32(max(maxRunning, 0)), ConcurrencyKey: nullable(key),
	})
	if err != nil {
		return driver.Admission{}, fmt.Errorf("read admission of %s in schema %q: %w", sagaType, s.schema, err)
	}
	return driver.Admission{Running: int(r.Running), Queued: r.Queued, KeyTaken: r.KeyTaken}, nil
}

// SagaConcurrencyKeyLock takes, in tx, the lock of the concurrency key key of
// sagaType, waiting for it.
func (s *executor) SagaConcurrencyKeyLock(ctx context.Context, tx pgx.Tx, sagaType, key string) error {
	err := s.queries.SagaLockConcurrencyKey(ctx, s.db(tx), &dbsqlc.SagaLockConcurrencyKeyParams{
		SchemaName: s.schema, SagaType: sagaType, ConcurrencyKey: key,
	})
	if err != nil {
		return fmt.Errorf("lock concurrency key %q of %s in schema %q: %w", key, sagaType, s.schema, err)
	}
	return nil
}

// AdmissionTryLock takes the schema's admission lock in t if it is free.
func (s *executor) AdmissionTryLock(ctx context.Context, t driver.Tx) (bool, error) {
	txOf(t).queue(backgroundTimeouts)
	ok, err := s.queries.SagaTryLockAdmission(ctx, txOf(t).exec(ctx, false), s.schema)
	if err != nil {
		return false, fmt.Errorf("take the admission lock of schema %q: %w", s.schema, err)
	}
	return ok, nil
}

// SagaCountRunning counts, in t, the running and compensating sagas of sagaType,
// up to max.
func (s *executor) SagaCountRunning(ctx context.Context, t driver.Tx, sagaType string, max int) (int, error) {
	r, err := s.queries.SagaAdmission(ctx, txOf(t).exec(ctx, false), &dbsqlc.SagaAdmissionParams{
		SagaType: sagaType, MaxRunning: int32(max), CountWhenQueued: true,
	})
	if err != nil {
		return 0, fmt.Errorf("count running sagas of %s in schema %q: %w", sagaType, s.schema, err)
	}
	return int(r.Running), nil
}

// SagaClaimQueued locks, in start order, up to max queued sagas of
// sagaType that may be admitted now.
func (s *executor) SagaClaimQueued(ctx context.Context, t driver.Tx, sagaType string, versions []int, max int) ([]driver.SagaRecord, error) {
	vs := make([]int32, len(versions))
	for i, v := range versions {
		vs[i] = int32(v)
	}
	rows, err := s.queries.SagaClaimQueued(ctx, txOf(t).exec(ctx, false), &dbsqlc.SagaClaimQueuedParams{
		SagaType: sagaType, Versions: vs, Max: int32(max),
	})
	if err != nil {
		return nil, fmt.Errorf("claim queued sagas of %s in schema %q: %w", sagaType, s.schema, err)
	}
	return sagaRecords(rows), nil
}

// SagaConcurrencyKeysFree locks those of keys that are free to lock and returns
// those of them no saga of sagaType is running or compensating for.
func (s *executor) SagaConcurrencyKeysFree(ctx context.Context, t driver.Tx, sagaType string, keys []string) (map[string]bool, error) {
	if len(keys) == 0 {
		return map[string]bool{}, nil
	}
	locked, err := s.queries.SagaTryLockConcurrencyKeys(ctx, txOf(t).exec(ctx, false), &dbsqlc.SagaTryLockConcurrencyKeysParams{
		SchemaName: s.schema, SagaType: sagaType, ConcurrencyKey: keys,
	})
	if err != nil {
		return nil, fmt.Errorf("lock concurrency keys of %s in schema %q: %w", sagaType, s.schema, err)
	}
	free := make(map[string]bool, len(locked))
	if len(locked) == 0 {
		return free, nil
	}
	running, err := s.queries.SagaKeysRunning(ctx, txOf(t).exec(ctx, false), &dbsqlc.SagaKeysRunningParams{
		SagaType: sagaType, ConcurrencyKey: locked,
	})
	if err != nil {
		return nil, fmt.Errorf("read running concurrency keys of %s in schema %q: %w", sagaType, s.schema, err)
	}
	for _, k := range locked {
		free[k] = true
	}
	for _, k := range running {
		delete(free, k)
	}
	return free, nil
}

// SagaQueued counts the sagas waiting for admission, per type.
func (s *executor) SagaQueued(ctx context.Context) ([]driver.QueuedCount, error) {
	db, err := s.pooled()
	if err != nil {
		return nil, err
	}
	rows, err := s.queries.SagaQueuedCounts(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("count queued sagas in schema %q: %w", s.schema, err)
	}
	out := make([]driver.QueuedCount, len(rows))
	for i, r := range rows {
		out[i] = driver.QueuedCount{Type: r.SagaType, Count: r.Queued, Oldest: r.Oldest}
	}
	return out, nil
}
