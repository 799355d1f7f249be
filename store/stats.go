package store

import (
	"context"
	"fmt"
	"time"

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
