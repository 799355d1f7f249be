package orchestrator

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/sagabox/sagabox/internal/maintenance"
	"github.com/sagabox/sagabox/internal/relay"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/transport"
)

// Defaults used by Config.WithDefaults.
const (
	// DefaultWorkers is how many replies the Client applies at once (each
	// to a different saga: one saga's replies are applied one at a time).
	DefaultWorkers = 4
	// DefaultSweepInterval is the longest the deadline sweeper waits between
	// two passes. A deadline written by this Client that falls earlier
	// wakes it sooner.
	DefaultSweepInterval = time.Second
	// DefaultSweepBatch is the most sagas one sweeper transaction claims.
	DefaultSweepBatch = 100
	// DefaultStopTimeout bounds the drain of replies and sweeps in flight
	// when Run's context is cancelled.
	DefaultStopTimeout = 30 * time.Second
	// DefaultReplyMaxAttempts, DefaultReplyInitialInterval and
	// DefaultReplyMaximumInterval are the defaults of ReplyRetry.
	DefaultReplyMaxAttempts     = 10
	DefaultReplyInitialInterval = time.Second
	DefaultReplyMaximumInterval = 30 * time.Second
	// DefaultSagaRetention is how long completed and compensated sagas (and
	// their history) are kept.
	DefaultSagaRetention = 30 * 24 * time.Hour

	// DefaultRelayBatchSize, DefaultRelayWorkers and DefaultRelayPollInterval
	// are the defaults of RelayConfig.
	DefaultRelayBatchSize    = relay.DefaultBatchSize
	DefaultRelayWorkers      = relay.DefaultWorkers
	DefaultRelayPollInterval = relay.DefaultPollInterval
	// DefaultRelayLease and DefaultRelayPublishTimeout are the defaults of
	// RelayConfig.Lease and RelayConfig.PublishTimeout.
	DefaultRelayLease          = relay.DefaultLease
	DefaultRelayPublishTimeout = relay.DefaultPublishTimeout

	// DefaultRetentionInterval, DefaultRetentionBatch,
	// DefaultOutboxRetention and DefaultInboxRetention are the defaults of
	// RetentionConfig.
	DefaultRetentionInterval = maintenance.DefaultRetentionInterval
	DefaultRetentionBatch    = maintenance.DefaultRetentionBatch
	DefaultOutboxRetention   = maintenance.DefaultOutboxRetention
	DefaultInboxRetention    = maintenance.DefaultInboxRetention
)

// Config configures a Client. Required fields are Pool and Service, and
// Broker for Run; every other field has a default.
type Config struct {
	// Pool is the connection pool of the orchestrator's database: saga
	// instances, history, outbox and inbox. Required.
	Pool *pgxpool.Pool

	// Schema is the Postgres schema of the sagabox tables (messaging and saga
	// migration lines). Defaults to store.DefaultSchema ("sagabox").
	Schema string

	// Service is the name of the orchestrator's reply queue: every command
	// and compensation it sends carries ReplyTo = Service, and Run consumes
	// the replies routed there. Several orchestrator processes of one
	// service share it (and the Schema). Required.
	Service string

	// Broker publishes the commands and consumes the replies. The Client
	// does not close it. Required by Run; a Client without one (a CLI, an
	// admin tool) can still start sagas, read them and perform operator
	// actions, whose messages the running orchestrators publish.
	Broker transport.Broker

	// Definitions are the saga definitions the Client runs (see also
	// Client.Register). Several versions of one name may be registered at
	// once, so that sagas started under an old version finish under it.
	// Defaults to none.
	Definitions []saga.Runner

	// Workers is how many replies are applied at once, each in its own
	// transaction. Defaults to DefaultWorkers (4).
	Workers int

	// Prefetch is how many unacknowledged replies the broker may hand out.
	// Defaults to 2 × Workers.
	Prefetch int

	// SweepInterval is the longest the deadline sweeper waits between two
	// passes; it is also the worst-case lateness of a timeout written by
	// another process. Defaults to DefaultSweepInterval (1s).
	SweepInterval time.Duration

	// SweepBatch is the most due sagas claimed by one sweeper transaction.
	// Defaults to DefaultSweepBatch (100).
	SweepBatch int

	// Clock returns the current time. Every decision of the Client (step
	// deadlines, timers, history and row timestamps) reads it, so that tests
	// can drive time. Defaults to time.Now.
	Clock func() time.Time

	// ReplyRetry bounds the retries of a reply that cannot be applied for a
	// reason other than an unreachable database (e.g. a local step that keeps
	// failing): it is delivered again after the policy's backoff, and after
	// MaxAttempts attempts it is dead-lettered and recorded on its saga
	// (history entry reply-dead-lettered, LastError). A reply that fails
	// because the database is unreachable is retried until it is back,
	// without counting. Defaults to DefaultReplyMaxAttempts (10) attempts,
	// DefaultReplyInitialInterval (1s) doubling up to
	// DefaultReplyMaximumInterval (30s).
	ReplyRetry saga.RetryPolicy

	// StopTimeout bounds how long Run waits, after its context is cancelled,
	// for the replies and sweeps in flight. Past it their transactions are
	// cancelled (rolled back) and the broker redelivers the replies later.
	// Defaults to DefaultStopTimeout (30s).
	StopTimeout time.Duration

	// Relay tunes the relay that publishes the orchestrator's outbox.
	// Defaults to the defaults of RelayConfig.
	Relay RelayConfig

	// Retention says how long finished sagas and processed messaging rows
	// are kept. Defaults to the defaults of RetentionConfig.
	Retention RetentionConfig

	// Logger receives the Client's logs, with the attribute
	// component=orchestrator. Defaults to slog.Default().
	Logger *slog.Logger

	// TracerProvider creates the tracer of the Client's spans: a span per
	// Start (in the caller's context), per operator action and per fired
	// deadline; a consumer span per reply, a child of the participant's
	// producer span; a producer span per message its relay publishes. The
	// commands written in one of these spans continue its trace, so one
	// saga is one trace across services. Defaults to the global provider.
	TracerProvider trace.TracerProvider

	// MeterProvider creates the Client's metrics (sagas started and
	// finished, step and saga durations, deadlines fired, retries,
	// replies handled, duplicates, dead letters, relay publishing, outbox
	// backlog, overdue sagas). Defaults to the global provider.
	MeterProvider metric.MeterProvider
}

// RelayConfig tunes the relay a Client runs to publish its outbox.
type RelayConfig struct {
	// BatchSize is the most outbox rows published at once. Defaults to
	// DefaultRelayBatchSize (200).
	BatchSize int
	// Workers is how many batches are in flight at once. Defaults to
	// DefaultRelayWorkers (2).
	Workers int
	// PollInterval is the longest the relay waits before looking for rows
	// nobody announced. Rows written while applying replies, timers and
	// operator actions are published at once; sagas started in a caller's
	// transaction are published after a few follow-up wake-ups, or at once
	// if the caller calls Client.Wake after committing. Defaults to
	// DefaultRelayPollInterval (1s).
	PollInterval time.Duration
	// Listen also wakes the relay on NOTIFY from other processes that write
	// to the same outbox. Defaults to false.
	Listen bool
	// Lease is how long rows claimed by a relay belong to it: after a crash
	// of its process, another relay publishes them once the lease ends. It
	// must exceed PublishTimeout. Defaults to DefaultRelayLease (10s).
	Lease time.Duration
	// PublishTimeout bounds the wait for the broker's confirms of one batch.
	// Defaults to DefaultRelayPublishTimeout (5s).
	PublishTimeout time.Duration
}

// RetentionConfig says how long finished data is kept. Deletion runs in
// small batches.
type RetentionConfig struct {
	// Interval is the pause between two pruning passes. Defaults to
	// DefaultRetentionInterval (1m).
	Interval time.Duration
	// BatchSize is the most rows one statement deletes. Defaults to
	// DefaultRetentionBatch (1000).
	BatchSize int
	// Sagas is how long completed and compensated sagas, with their
	// history, are kept after they finished (by Clock). Failed sagas wait
	// for an operator and are never deleted. Defaults to
	// DefaultSagaRetention (30 days).
	Sagas time.Duration
	// Outbox is how long published outbox rows are kept. Defaults to
	// DefaultOutboxRetention (24h).
	Outbox time.Duration
	// Inbox is how long inbox rows of processed replies are kept; a
	// duplicate arriving later would be seen as new (and ignored by the
	// saga as stale). Defaults to DefaultInboxRetention (7 days).
	Inbox time.Duration
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Schema == "" {
		c.Schema = store.DefaultSchema
	}
	if c.Workers == 0 {
		c.Workers = DefaultWorkers
	}
	if c.Prefetch == 0 {
		c.Prefetch = 2 * c.Workers
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = DefaultSweepInterval
	}
	if c.SweepBatch == 0 {
		c.SweepBatch = DefaultSweepBatch
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.StopTimeout == 0 {
		c.StopTimeout = DefaultStopTimeout
	}
	if c.ReplyRetry.MaxAttempts == 0 {
		c.ReplyRetry.MaxAttempts = DefaultReplyMaxAttempts
	}
	if c.ReplyRetry.InitialInterval == 0 {
		c.ReplyRetry.InitialInterval = DefaultReplyInitialInterval
	}
	if c.ReplyRetry.MaximumInterval == 0 {
		c.ReplyRetry.MaximumInterval = max(DefaultReplyMaximumInterval, c.ReplyRetry.InitialInterval)
	}
	if c.Relay.BatchSize == 0 {
		c.Relay.BatchSize = DefaultRelayBatchSize
	}
	if c.Relay.Workers == 0 {
		c.Relay.Workers = DefaultRelayWorkers
	}
	if c.Relay.PollInterval == 0 {
		c.Relay.PollInterval = DefaultRelayPollInterval
	}
	if c.Relay.Lease == 0 {
		c.Relay.Lease = DefaultRelayLease
	}
	if c.Relay.PublishTimeout == 0 {
		c.Relay.PublishTimeout = DefaultRelayPublishTimeout
	}
	if c.Retention.Interval == 0 {
		c.Retention.Interval = DefaultRetentionInterval
	}
	if c.Retention.BatchSize == 0 {
		c.Retention.BatchSize = DefaultRetentionBatch
	}
	if c.Retention.Sagas == 0 {
		c.Retention.Sagas = DefaultSagaRetention
	}
	if c.Retention.Outbox == 0 {
		c.Retention.Outbox = DefaultOutboxRetention
	}
	if c.Retention.Inbox == 0 {
		c.Retention.Inbox = DefaultInboxRetention
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// validate checks a config that went through WithDefaults. Its errors name
// the field at fault.
func (c Config) validate() error {
	var errs []error
	if c.Pool == nil {
		errs = append(errs, errors.New("Pool is required"))
	}
	if strings.TrimSpace(c.Service) == "" {
		errs = append(errs, errors.New("Service is required (the name of the orchestrator's reply queue)"))
	}
	if err := store.ValidateSchema(c.Schema); err != nil {
		errs = append(errs, fmt.Errorf("Schema: %w", err))
	}
	for i, r := range c.Definitions {
		if r == nil {
			errs = append(errs, fmt.Errorf("Definitions[%d] is nil", i))
		}
	}
	if c.Workers < 1 {
		errs = append(errs, fmt.Errorf("Workers %d is less than 1", c.Workers))
	}
	if c.Prefetch < c.Workers {
		errs = append(errs, fmt.Errorf("Prefetch %d is less than Workers %d", c.Prefetch, c.Workers))
	}
	if c.SweepInterval < 0 {
		errs = append(errs, fmt.Errorf("SweepInterval %s is negative", c.SweepInterval))
	}
	if c.SweepBatch < 1 {
		errs = append(errs, fmt.Errorf("SweepBatch %d is less than 1", c.SweepBatch))
	}
	if c.StopTimeout < 0 {
		errs = append(errs, fmt.Errorf("StopTimeout %s is negative", c.StopTimeout))
	}
	if err := c.ReplyRetry.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("ReplyRetry: %w", err))
	}
	if c.Relay.BatchSize < 1 {
		errs = append(errs, fmt.Errorf("Relay.BatchSize %d is less than 1", c.Relay.BatchSize))
	}
	if c.Relay.Workers < 1 {
		errs = append(errs, fmt.Errorf("Relay.Workers %d is less than 1", c.Relay.Workers))
	}
	if c.Relay.PollInterval < 0 {
		errs = append(errs, fmt.Errorf("Relay.PollInterval %s is negative", c.Relay.PollInterval))
	}
	if c.Relay.PublishTimeout < 0 {
		errs = append(errs, fmt.Errorf("Relay.PublishTimeout %s is negative", c.Relay.PublishTimeout))
	}
	if c.Relay.Lease <= c.Relay.PublishTimeout {
		errs = append(errs, fmt.Errorf("Relay.Lease %s must exceed Relay.PublishTimeout %s", c.Relay.Lease, c.Relay.PublishTimeout))
	}
	if c.Retention.Interval < 0 {
		errs = append(errs, fmt.Errorf("Retention.Interval %s is negative", c.Retention.Interval))
	}
	if c.Retention.BatchSize < 1 {
		errs = append(errs, fmt.Errorf("Retention.BatchSize %d is less than 1", c.Retention.BatchSize))
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"Retention.Sagas", c.Retention.Sagas}, {"Retention.Outbox", c.Retention.Outbox}, {"Retention.Inbox", c.Retention.Inbox}} {
		if f.d < 0 {
			errs = append(errs, fmt.Errorf("%s %s is negative", f.name, f.d))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("orchestrator: invalid config: %w", errors.Join(errs...))
	}
	return nil
}
