package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sagabox/sagabox/store/driver"
)

// Defaults of RetentionConfig.
const (
	DefaultRetentionInterval = time.Minute
	DefaultRetentionBatch    = 1000
	DefaultOutboxRetention   = 0
	DefaultInboxRetention    = 7 * 24 * time.Hour
	DefaultBarrierRetention  = 30 * 24 * time.Hour
	DefaultSagaRetention     = 30 * 24 * time.Hour
)

// RetentionConfig says how long a client keeps processed rows; both clients
// take it as their Config.Retention. Deletion runs in small batches.
type RetentionConfig struct {
	// Interval is the pause between two pruning passes. Defaults to
	// DefaultRetentionInterval (1m).
	Interval time.Duration
	// BatchSize is the most rows one statement deletes. Defaults to
	// DefaultRetentionBatch (1000).
	BatchSize int
	// Outbox is how long published outbox rows are kept, marked published,
	// for inspection (sagabox_outbox_v); retention deletes them after it.
	// Defaults to DefaultOutboxRetention (0): the relay deletes a row as
	// soon as the broker has confirmed it, which writes least.
	Outbox time.Duration
	// Inbox is how long inbox rows (and attempt rows) of processed messages
	// are kept. A duplicate that arrives later would be seen as new, so it
	// must exceed any redelivery delay. Defaults to DefaultInboxRetention
	// (7 days).
	Inbox time.Duration
	// Barrier is how long a participant keeps compensation barrier marks.
	// It must exceed the life of every saga, failed sagas waiting for an
	// operator included: a compensation that finds no mark of its action
	// treats the action as never run. Defaults to DefaultBarrierRetention
	// (30 days).
	Barrier time.Duration
	// Sagas is how long an orchestrator keeps completed and compensated
	// sagas, with their history, after they finished (by its Clock). Failed
	// sagas wait for an operator and are never deleted. Defaults to
	// DefaultSagaRetention (30 days).
	Sagas time.Duration
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c RetentionConfig) WithDefaults() RetentionConfig {
	if c.Interval == 0 {
		c.Interval = DefaultRetentionInterval
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultRetentionBatch
	}
	if c.Inbox == 0 {
		c.Inbox = DefaultInboxRetention
	}
	if c.Barrier == 0 {
		c.Barrier = DefaultBarrierRetention
	}
	if c.Sagas == 0 {
		c.Sagas = DefaultSagaRetention
	}
	return c
}

// Validate checks a config that went through WithDefaults; its errors name
// the field at fault, as name.Field (name is where the config sits, e.g.
// "Retention").
func (c RetentionConfig) Validate(name string) error {
	var errs []error
	f := func(format string, args ...any) { errs = append(errs, fmt.Errorf(name+"."+format, args...)) }
	if c.Interval < 0 {
		f("Interval %s is negative", c.Interval)
	}
	if c.BatchSize < 1 {
		f("BatchSize %d is less than 1", c.BatchSize)
	}
	for _, d := range []struct {
		name string
		d    time.Duration
	}{{"Outbox", c.Outbox}, {"Inbox", c.Inbox}, {"Barrier", c.Barrier}, {"Sagas", c.Sagas}} {
		if d.d < 0 {
			f("%s %s is negative", d.name, d.d)
		}
	}
	if c.Barrier < c.Inbox {
		f("Barrier %s is shorter than %s.Inbox %s: a barrier mark must outlive the messages it guards", c.Barrier, name, c.Inbox)
	}
	return errors.Join(errs...)
}

// retain prunes every Retention.Interval until ctx is cancelled.
func (e *Engine) retain(ctx context.Context) {
	t := time.NewTimer(e.cfg.Retention.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := e.Prune(ctx); err != nil && ctx.Err() == nil {
			e.log.Warn("retention pass failed; will try again", "err", err)
		}
		t.Reset(e.cfg.Retention.Interval)
	}
}

// Prune runs one retention pass: processed messaging rows by wall-clock
// time and, for a schema that keeps sagas, finished sagas by the client's
// clock.
func (e *Engine) Prune(ctx context.Context) (driver.Pruned, error) {
	now, c := time.Now(), e.cfg.Retention
	r := driver.Retention{Inbox: now.Add(-c.Inbox), Barrier: now.Add(-c.Barrier), Batch: c.BatchSize}
	if c.Outbox > 0 {
		r.Outbox = now.Add(-c.Outbox)
	}
	if e.cfg.KeepsSagas {
		r.Sagas = e.cfg.Clock().Add(-c.Sagas)
	}
	p, err := e.cfg.DB.RetentionPrune(ctx, r)
	if p.Total() > 0 {
		e.log.Info("retention pass deleted rows", "outbox", p.Outbox, "inbox", p.Inbox, "inbox_attempt", p.InboxAttempts,
			"barrier", p.Barrier, "sagas", p.Sagas)
	}
	return p, err
}
