// Package relay publishes committed outbox rows to the broker.
//
// A relay claims unpublished rows in batches (FOR UPDATE SKIP LOCKED, in one
// autocommit statement that only sets a lease), publishes them with pipelined
// publisher confirms outside of any transaction, then marks exactly the
// confirmed rows published. Rows that failed go back with a retry delay. A
// relay that dies after publishing and before marking leaves its rows leased;
// when the lease ends another relay publishes them again: delivery is
// at-least-once and receivers deduplicate.
//
// A relay wakes at once when Wake is called (after a local commit), when a
// NOTIFY arrives (optional), and otherwise polls.
package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"

	"github.com/sagabox/sagabox/internal/telemetry"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/transport"
)

// Defaults for Config.
const (
	DefaultBatchSize      = 200
	DefaultWorkers        = 2
	DefaultPollInterval   = time.Second
	DefaultLease          = 10 * time.Second
	DefaultPublishTimeout = 5 * time.Second
	DefaultMinBackoff     = 100 * time.Millisecond
	DefaultMaxBackoff     = 10 * time.Second
)

// Config configures a Relay.
type Config struct {
	// Store is the outbox to publish from. Required.
	Store *store.Store
	// Publisher sends the messages. Required.
	Publisher transport.Publisher
	// Name identifies this relay in claimed rows. Defaults to host-pid-random.
	Name string
	// BatchSize is the most rows claimed and published at once. Defaults to
	// DefaultBatchSize.
	BatchSize int
	// Workers is how many batches are in flight at once. Defaults to
	// DefaultWorkers.
	Workers int
	// PollInterval is the longest a relay sleeps before looking for rows that
	// no wake-up announced. Defaults to DefaultPollInterval.
	PollInterval time.Duration
	// Lease is how long claimed rows belong to this relay. It must exceed
	// PublishTimeout. It is also how long the rows of a relay that crashed
	// between claim and publish wait before another relay publishes them,
	// and, since rows of one ordering key go out in order, how long later
	// rows of the same keys wait behind them. Defaults to DefaultLease.
	Lease time.Duration
	// PublishTimeout bounds the wait for broker confirms of one batch.
	// Defaults to DefaultPublishTimeout.
	PublishTimeout time.Duration
	// MinBackoff and MaxBackoff bound the wait after a failed batch (broker or
	// database down). Defaults to DefaultMinBackoff and DefaultMaxBackoff.
	MinBackoff, MaxBackoff time.Duration
	// Listen also wakes the relay on NOTIFY from other processes over a
	// dedicated connection. Defaults to false: writers in this process wake
	// the relay directly, and NOTIFY would serialise their commits.
	Listen bool
	// Logger receives the relay's logs. Defaults to slog.Default().
	Logger *slog.Logger
	// Observer is told about every batch (metrics). Optional.
	Observer Observer
	// Telemetry, when set, traces every publish as a producer span that is a
	// child of the span that wrote the row. Optional.
	Telemetry *telemetry.Telemetry
}

// Observer receives the outcome of each published batch.
type Observer interface {
	// Published is called after a batch was sent: confirmed[i] says whether
	// msgs[i] was confirmed by the broker, err is the publish error (nil when
	// all were), elapsed the time the publish took.
	Published(ctx context.Context, msgs []message.Message, confirmed []bool, err error, elapsed time.Duration)
}

// WithDefaults returns a copy of c with defaults filled in.
func (c Config) WithDefaults() Config {
	if c.Name == "" {
		host, _ := os.Hostname()
		c.Name = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), uuid.NewString()[:8])
	}
	if c.BatchSize <= 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.Workers <= 0 {
		c.Workers = DefaultWorkers
	}
	if c.PollInterval <= 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.Lease <= 0 {
		c.Lease = DefaultLease
	}
	if c.PublishTimeout <= 0 {
		c.PublishTimeout = DefaultPublishTimeout
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = DefaultMinBackoff
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = DefaultMaxBackoff
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.Store == nil:
		return errors.New("relay: Config.Store is required")
	case c.Publisher == nil:
		return errors.New("relay: Config.Publisher is required")
	case c.Lease <= c.PublishTimeout:
		return fmt.Errorf("relay: Config.Lease (%s) must exceed Config.PublishTimeout (%s)", c.Lease, c.PublishTimeout)
	case c.MaxBackoff < c.MinBackoff:
		return fmt.Errorf("relay: Config.MaxBackoff (%s) is below Config.MinBackoff (%s)", c.MaxBackoff, c.MinBackoff)
	}
	return nil
}

// Relay publishes one schema's outbox.
type Relay struct {
	cfg Config
	log *slog.Logger
	// wake hands a wake-up to one idle worker: one claim per wake-up, not a
	// claim by every worker (which, at thousands of commits per second,
	// costs more database time than the publishing itself).
	wake chan struct{}

	// testHookAfterPublish, when set, runs after a batch was confirmed and
	// before it is marked published. Returning true makes the worker stop
	// right there, as a relay killed at that point would.
	testHookAfterPublish func(rows []store.OutboxRow) (crash bool)
}

// New returns a Relay for cfg.
func New(cfg Config) (*Relay, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Relay{
		cfg:  cfg,
		log:  cfg.Logger.With("component", "relay", "schema", cfg.Store.Schema()),
		wake: make(chan struct{}, 1),
	}, nil
}

// Wake makes an idle worker look for rows now (or the next worker to become
// idle, if all are busy). Call it after committing a transaction that wrote
// to the outbox. It never blocks.
func (r *Relay) Wake() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Run publishes until ctx is cancelled, then lets batches in flight finish
// (marking what was confirmed) and returns nil.
func (r *Relay) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for range r.cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.work(ctx)
		}()
	}
	if r.cfg.Listen {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.listen(ctx)
		}()
	}
	r.log.Info("relay started", "workers", r.cfg.Workers, "batch_size", r.cfg.BatchSize, "listen", r.cfg.Listen)
	wg.Wait()
	r.log.Info("relay stopped")
	return nil
}

func (r *Relay) work(ctx context.Context) {
	poll := time.NewTimer(0)
	defer poll.Stop()
	failures := 0
	for {
		n, err := r.publishBatch(ctx)
		if ctx.Err() != nil {
			return
		}
		var wait time.Duration
		switch {
		case errors.Is(err, errCrashed):
			return
		case err != nil:
			failures++
			wait = backoff(r.cfg.MinBackoff, r.cfg.MaxBackoff, failures)
			r.log.Warn("relay batch failed; backing off", "err", err, "retry_in", wait, "failures", failures)
		case n == r.cfg.BatchSize:
			failures = 0
			r.Wake() // more rows are likely waiting: bring in another worker
			continue
		default:
			failures = 0
			wait = r.cfg.PollInterval
		}
		poll.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
			if err != nil {
				// A wake-up does not cut a backoff short: the broker or
				// database is still likely down.
				select {
				case <-ctx.Done():
					return
				case <-poll.C:
				}
			}
		case <-poll.C:
		}
	}
}

var errCrashed = errors.New("relay: simulated crash")

// publishBatch claims, publishes and marks one batch. It returns the number
// of rows claimed.
func (r *Relay) publishBatch(ctx context.Context) (int, error) {
	if ctx.Err() != nil {
		return 0, nil
	}
	// The claim runs to completion even if ctx is cancelled meanwhile: a
	// claim committed but reported as cancelled would leave its rows leased,
	// unpublished, for a whole lease.
	claimCtx, cancelClaim := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	rows, err := r.cfg.Store.OutboxClaim(claimCtx, store.OutboxClaimOpts{
		Max: r.cfg.BatchSize, Lease: r.cfg.Lease, ClaimedBy: r.cfg.Name,
	})
	cancelClaim()
	if err != nil || len(rows) == 0 {
		return 0, err
	}
	msgs := make([]message.Message, len(rows))
	for i, row := range rows {
		msgs[i] = row.Message
	}

	// Rows are claimed: from here on finish the batch even if ctx is
	// cancelled, so a clean shutdown leaves nothing leased.
	pubCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.PublishTimeout)
	defer cancel()
	var spans []trace.Span
	if r.cfg.Telemetry != nil {
		spans = make([]trace.Span, len(msgs))
		for i := range msgs {
			spans[i] = r.cfg.Telemetry.StartPublish(ctx, &msgs[i])
		}
	}
	start := time.Now()
	pubErr := r.cfg.Publisher.Publish(pubCtx, msgs...)
	confirmed := transport.Confirmed(len(msgs), pubErr)
	for i, span := range spans {
		var err error
		if !confirmed[i] {
			err = fmt.Errorf("not confirmed: %w", pubErr)
		}
		telemetry.EndPublish(span, err)
	}
	if r.cfg.Observer != nil {
		r.cfg.Observer.Published(ctx, msgs, confirmed, pubErr, time.Since(start))
	}
	if r.testHookAfterPublish != nil && r.testHookAfterPublish(rows) {
		return 0, errCrashed
	}

	var done, failed []int64
	for i, row := range rows {
		if confirmed[i] {
			done = append(done, row.ID)
			r.log.Debug("published", "message_id", row.Message.MessageID, "saga_id", row.Message.SagaID, "type", row.Message.Type)
		} else {
			failed = append(failed, row.ID)
		}
	}
	markCtx, cancelMark := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancelMark()
	if err := r.cfg.Store.OutboxMarkPublished(markCtx, done); err != nil {
		// The rows stay leased and are published again after the lease:
		// a duplicate, never a loss.
		return len(rows), err
	}
	if len(failed) > 0 {
		retry := backoff(r.cfg.MinBackoff, r.cfg.MaxBackoff, rows[0].PublishAttempts)
		if err := r.cfg.Store.OutboxRelease(markCtx, failed, retry, pubErr); err != nil {
			return len(rows), err
		}
		return len(rows), fmt.Errorf("%d of %d messages not confirmed: %w", len(failed), len(rows), pubErr)
	}
	return len(rows), nil
}

// listen wakes the workers on NOTIFY, reconnecting with backoff. Every
// (re)connect wakes them too, so nothing sent while disconnected waits for
// the poll.
func (r *Relay) listen(ctx context.Context) {
	failures := 0
	for {
		err := r.cfg.Store.Listen(ctx, r.cfg.Store.NotifyChannel(), func() {
			failures = 0
			r.Wake()
		})
		if ctx.Err() != nil {
			return
		}
		failures++
		wait := backoff(r.cfg.MinBackoff, r.cfg.MaxBackoff, failures)
		r.log.Warn("relay listener lost its connection; reconnecting", "err", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// backoff returns an exponential delay with full jitter in [min/2, cap].
func backoff(minD, maxD time.Duration, attempt int) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	d := minD
	for i := 1; i < attempt && d < maxD; i++ {
		d *= 2
	}
	if d > maxD {
		d = maxD
	}
	half := d / 2
	return half + time.Duration(rand.Int64N(int64(half)+1))
}
