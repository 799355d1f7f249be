package store

import (
	"context"
	"fmt"
	"time"

	"github.com/sagabox/sagabox/store/driver"
)

// driver.OutboxStats returns the backlog of the outbox.
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

// driver.InboxStats summarises the inbox; recent is the window of
// RecentlyDuplicated.
func (s *executor) InboxStats(ctx context.Context, recent time.Duration) (driver.InboxStats, error) {
	db, err := s.pooled()
	if err != nil {
		return driver.InboxStats{}, err
	}
	r, err := s.queries.InboxStats(ctx, db, recent.Seconds())
	if err != nil {
		return driver.InboxStats{}, fmt.Errorf("inbox stats of schema %q: %w", s.schema, err)
	}
	return driver.InboxStats{
		Total: r.Total, Duplicates: r.Duplicates, DuplicatedMessages: r.DuplicatedMessages, RecentlyDuplicated: r.RecentlyDuplicated,
	}, nil
}

// SagaCounts counts sagas by type and status.
func (s *executor) SagaCounts(ctx context.Context) ([]driver.SagaCount, error) {
	db, err := s.pooled()
	if err != nil {
		return nil, err
	}
	rows, err := s.queries.SagaCountByStatus(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("count sagas: %w", err)
	}
	out := make([]driver.SagaCount, len(rows))
	for i, r := range rows {
		out[i] = driver.SagaCount{Type: r.SagaType, Status: r.Status, Count: r.Count}
	}
	return out, nil
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
