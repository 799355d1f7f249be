package store

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store/driver"
)

// OutboxStats implements driver.Executor.
func (s *executor) OutboxStats(ctx context.Context) (driver.OutboxStats, error) {
	db, err := s.pooled()
	if err != nil {
		return driver.OutboxStats{}, err
	}
	r, err := s.queries.OutboxStats(ctx, db)
	if err != nil {
		return driver.OutboxStats{}, fmt.Errorf("outbox stats of schema %q: %w", s.schema, err)
	}
	return driver.OutboxStats{
		Backlog:   r.Backlog,
		OldestAge: time.Duration(r.OldestAgeSeconds * float64(time.Second)),
		Retrying:  r.Retrying,
		Dead:      r.Dead,
	}, nil
}

// SagaCountOverdue counts running or compensating sagas whose deadline is
// before before.
func (s *executor) SagaCountOverdue(ctx context.Context, before time.Time) (int64, error) {
	db, err := s.pooled()
	if err != nil {
		return 0, err
	}
	n, err := s.queries.SagaCountOverdue(ctx, db, before)
	if err != nil {
		return 0, fmt.Errorf("count overdue sagas: %w", err)
	}
	return n, nil
}

// SagaCountOpen counts the running, compensating and failed sagas of
// sagaTypes, by type and status.
func (s *executor) SagaCountOpen(ctx context.Context, sagaTypes []string) ([]driver.SagaCount, error) {
	db, err := s.pooled()
	if err != nil {
		return nil, err
	}
	rows, err := s.queries.SagaCountOpen(ctx, db, nonNil(sagaTypes))
	if err != nil {
		return nil, fmt.Errorf("count open sagas: %w", err)
	}
	out := make([]driver.SagaCount, len(rows))
	for i, r := range rows {
		out[i] = driver.SagaCount{Type: r.SagaType, Status: r.Status, Count: r.Count}
	}
	return out, nil
}

// SagaCountUnpublishedOverdue implements driver.Executor.
func (s *executor) SagaCountUnpublishedOverdue(ctx context.Context, before time.Time) ([]driver.SagaCount, error) {
	db, err := s.pooled()
	if err != nil {
		return nil, err
	}
	rows, err := s.queries.SagaCountUnpublishedOverdue(ctx, db, before)
	if err != nil {
		return nil, fmt.Errorf("count sagas waiting for unpublished messages in schema %q: %w", s.schema, err)
	}
	out := make([]driver.SagaCount, len(rows))
	for i, r := range rows {
		out[i] = driver.SagaCount{Type: r.SagaType, Count: r.Count}
	}
	return out, nil
}

// OutboxUnpublishedByType implements driver.Executor.
func (s *executor) OutboxUnpublishedByType(ctx context.Context, max int) ([]driver.OutboxTypeBacklog, error) {
	db, err := s.pooled()
	if err != nil {
		return nil, err
	}
	rows, err := s.queries.OutboxUnpublishedByType(ctx, db, int32(min(max, math.MaxInt32)))
	if err != nil {
		return nil, fmt.Errorf("unpublished commands by type in schema %q: %w", s.schema, err)
	}
	out := make([]driver.OutboxTypeBacklog, len(rows))
	for i, r := range rows {
		out[i] = driver.OutboxTypeBacklog{
			Type: r.Type, Kind: message.Kind(r.Kind), Count: r.Count, Oldest: r.Oldest, Attempts: int(r.Attempts), LastError: r.LastError,
		}
	}
	return out, nil
}
