// Package maintenance runs the background upkeep that keeps sagabox's tables
// small: it deletes published outbox rows, old inbox rows, attempt rows and
// barrier marks after their retention periods, in small batches.
package maintenance

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/sagabox/sagabox/store"
)

// Defaults for RetentionConfig.
const (
	DefaultRetentionInterval = time.Minute
	DefaultRetentionBatch    = 1000
	DefaultOutboxRetention   = 24 * time.Hour
	DefaultInboxRetention    = 7 * 24 * time.Hour
	DefaultBarrierRetention  = 30 * 24 * time.Hour
)

// RetentionConfig configures a Retention.
type RetentionConfig struct {
	// Store is the schema to prune. Required.
	Store *store.Store
	// Interval is the pause between two pruning passes. Defaults to
	// DefaultRetentionInterval.
	Interval time.Duration
	// BatchSize is the most rows one statement deletes. Defaults to
	// DefaultRetentionBatch.
	BatchSize int
	// OutboxRetention is how long published outbox rows are kept. Defaults to
	// DefaultOutboxRetention.
	OutboxRetention time.Duration
	// InboxRetention is how long inbox and attempt rows are kept. It must
	// outlive any redelivery of a message: once its row is gone a late
	// duplicate would be applied again. Defaults to DefaultInboxRetention.
	InboxRetention time.Duration
	// BarrierRetention is how long compensation barrier marks are kept. It
	// must outlive every saga, failed ones waiting for an operator included:
	// a compensation that finds no mark of its action treats it as never run.
	// Defaults to DefaultBarrierRetention.
	BarrierRetention time.Duration
	// Logger receives the logs. Defaults to slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns a copy of c with defaults filled in.
func (c RetentionConfig) WithDefaults() RetentionConfig {
	if c.Interval <= 0 {
		c.Interval = DefaultRetentionInterval
	}
	if c.BatchSize <= 0 {
		c.BatchSize = DefaultRetentionBatch
	}
	if c.OutboxRetention <= 0 {
		c.OutboxRetention = DefaultOutboxRetention
	}
	if c.InboxRetention <= 0 {
		c.InboxRetention = DefaultInboxRetention
	}
	if c.BarrierRetention <= 0 {
		c.BarrierRetention = DefaultBarrierRetention
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Retention prunes one schema periodically.
type Retention struct {
	cfg RetentionConfig
	log *slog.Logger
}

// NewRetention returns a Retention for cfg.
func NewRetention(cfg RetentionConfig) (*Retention, error) {
	cfg = cfg.WithDefaults()
	if cfg.Store == nil {
		return nil, errors.New("maintenance: RetentionConfig.Store is required")
	}
	return &Retention{cfg: cfg, log: cfg.Logger.With("component", "retention", "schema", cfg.Store.Schema())}, nil
}

// Run prunes every Interval until ctx is cancelled, then returns nil.
func (r *Retention) Run(ctx context.Context) error {
	t := time.NewTimer(r.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if _, err := r.Prune(ctx, time.Now()); err != nil && ctx.Err() == nil {
			r.log.Warn("retention pass failed; will try again", "err", err)
		}
		t.Reset(r.cfg.Interval)
	}
}

// Prune runs one pass as of now and returns how many rows it deleted per
// table.
func (r *Retention) Prune(ctx context.Context, now time.Time) (map[store.RetentionTable]int64, error) {
	deleted := map[store.RetentionTable]int64{}
	tables := []struct {
		table  store.RetentionTable
		before time.Time
	}{
		{store.RetentionOutbox, now.Add(-r.cfg.OutboxRetention)},
		{store.RetentionInbox, now.Add(-r.cfg.InboxRetention)},
		{store.RetentionInboxAttempt, now.Add(-r.cfg.InboxRetention)},
		{store.RetentionBarrier, now.Add(-r.cfg.BarrierRetention)},
	}
	for _, tb := range tables {
		for {
			n, err := r.cfg.Store.DeleteBefore(ctx, tb.table, tb.before, r.cfg.BatchSize)
			if err != nil {
				return deleted, err
			}
			deleted[tb.table] += n
			if n < int64(r.cfg.BatchSize) || ctx.Err() != nil {
				break
			}
		}
	}
	if total := deleted[store.RetentionOutbox] + deleted[store.RetentionInbox] + deleted[store.RetentionInboxAttempt] + deleted[store.RetentionBarrier]; total > 0 {
		r.log.Info("retention pass deleted rows", "outbox", deleted[store.RetentionOutbox], "inbox", deleted[store.RetentionInbox],
			"inbox_attempt", deleted[store.RetentionInboxAttempt], "barrier", deleted[store.RetentionBarrier])
	}
	return deleted, nil
}
