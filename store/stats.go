package store

import (
	"context"
	"fmt"
	"time"
)

// OutboxStats is the publishing state of an outbox.
type OutboxStats struct {
	// Backlog is the number of unpublished rows.
	Backlog int64
	// OldestAge is the age of the oldest unpublished row; zero when none.
	OldestAge time.Duration
	// Retrying counts unpublished rows that were claimed at least once.
	Retrying int64
}

// OutboxStats returns the backlog of the outbox.
func (s *Store) OutboxStats(ctx context.Context) (OutboxStats, error) {
	db, err := s.pooled()
	if err != nil {
		return OutboxStats{}, err
	}
	r, err := s.queries.OutboxStats(ctx, db)
	if err != nil {
		return OutboxStats{}, fmt.Errorf("outbox stats of schema %q: %w", s.schema, err)
	}
	return OutboxStats{
		Backlog:   r.Backlog,
		OldestAge: time.Duration(r.OldestAgeSeconds * float64(time.Second)),
		Retrying:  r.Retrying,
	}, nil
}

// InboxStats is a summary of an inbox.
type InboxStats struct {
	// Total is the number of processed messages still kept.
	Total int64
	// Duplicates is the number of duplicate arrivals, summed over messages.
	Duplicates int64
	// DuplicatedMessages is the number of messages that arrived more than once.
	DuplicatedMessages int64
	// RecentlyDuplicated is the number of messages whose last duplicate
	// arrived within the window passed to InboxStats.
	RecentlyDuplicated int64
}

// InboxStats summarises the inbox; recent is the window of
// RecentlyDuplicated.
func (s *Store) InboxStats(ctx context.Context, recent time.Duration) (InboxStats, error) {
	db, err := s.pooled()
	if err != nil {
		return InboxStats{}, err
	}
	r, err := s.queries.InboxStats(ctx, db, recent.Seconds())
	if err != nil {
		return InboxStats{}, fmt.Errorf("inbox stats of schema %q: %w", s.schema, err)
	}
	return InboxStats{
		Total: r.Total, Duplicates: r.Duplicates, DuplicatedMessages: r.DuplicatedMessages, RecentlyDuplicated: r.RecentlyDuplicated,
	}, nil
}

// SagaCount is the number of sagas of one type in one status.
type SagaCount struct {
	Type   string
	Status string
	Count  int64
}

// SagaCounts counts sagas by type and status.
func (s *Store) SagaCounts(ctx context.Context) ([]SagaCount, error) {
	db, err := s.pooled()
	if err != nil {
		return nil, err
	}
	rows, err := s.queries.SagaCountByStatus(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("count sagas: %w", err)
	}
	out := make([]SagaCount, len(rows))
	for i, r := range rows {
		out[i] = SagaCount{Type: r.SagaType, Status: r.Status, Count: r.Count}
	}
	return out, nil
}

// SagaCountOverdue counts running or compensating sagas whose deadline is
// before before.
func (s *Store) SagaCountOverdue(ctx context.Context, before time.Time) (int64, error) {
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
