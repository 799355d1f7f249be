package participant

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/sagabox/sagabox/internal/engine"
	"github.com/sagabox/sagabox/internal/relay"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/transport"
)

// Defaults used by Config.WithDefaults.
const (
	// DefaultWorkers is how many deliveries a Client handles at once.
	DefaultWorkers = 4
	// MaxBatchLimit is the largest Config.MaxBatch: the handler of a
	// delivery of a batch that writes runs in a subtransaction (or more, if
	// it begins savepoints of its own), and PostgreSQL keeps the ids of only
	// 64 subtransactions per transaction in shared memory; past that, every
	// snapshot taken in the database while the transaction runs gets
	// slower.
	MaxBatchLimit = 32
	// DefaultMaxPayloadBytes is the largest payload a Client accepts (1
	// MiB): a larger command is answered with a failure reply
	// (saga.CodePayloadTooLarge), so that its saga compensates at once, and
	// dead-lettered.
	DefaultMaxPayloadBytes = engine.DefaultMaxPayloadBytes
	// DefaultStopTimeout bounds the drain of in-flight deliveries when Run's
	// context is cancelled.
	DefaultStopTimeout = 30 * time.Second
	// DefaultHandlerTimeout bounds one run of a handler (Config.HandlerTimeout).
	DefaultHandlerTimeout = time.Minute

	// DefaultInitialInterval is the delay before the first retry of a
	// message whose handler failed transiently.
	DefaultInitialInterval = time.Second
	// DefaultBackoffCoefficient is the growth factor of the retry delay.
	DefaultBackoffCoefficient = 2.0
	// DefaultMaximumInterval caps the retry delay. A message waiting for its
	// retry holds no worker (the broker parks it; the RabbitMQ adapter rounds
	// the delay up to 1s, 5s, 30s or 2m), so the cap only bounds how long a
	// failing message takes to reach the dead-letter queue: with the other
	// defaults, about three minutes.
	DefaultMaximumInterval = 30 * time.Second
	// DefaultMaxAttempts is how many times a message is processed before it
	// is dead-lettered, the first attempt included.
	DefaultMaxAttempts = 10
)

// RelayConfig tunes the relay a Client runs to publish its outbox (replies
// and outgoing events); the orchestrator's is the same type.
type RelayConfig = relay.Options

// RelayMode is how the relay finds committed outbox rows
// (RelayConfig.Mode); the orchestrator's is the same type.
type RelayMode = relay.Mode

// Relay modes (RelayConfig.Mode).
const (
	// RelayModePoll, the default, claims unpublished rows from the outbox
	// table.
	RelayModePoll = relay.ModePoll
	// RelayModeLog reads the outbox's inserts from PostgreSQL's
	// write-ahead log through a logical replication slot (wal_level =
	// logical; create the slot with `sagabox relay setup-log`): no polling,
	// no claim, one reader per slot with standbys. See docs/operations.md.
	RelayModeLog = relay.ModeLog
)

// RetentionConfig says how long a Client keeps processed rows; the
// orchestrator's is the same type (its Sagas field is the orchestrator's
// only).
type RetentionConfig = engine.RetentionConfig

// Config configures a Client. Required fields are Pool, Service and Broker;
// every other field has a default.
type Config struct {
	// Pool is the connection pool of the service's database. The handlers'
	// transactions, the inbox, the barrier and the outbox all use it.
	// Required.
	//
	// Run holds at most ConnsNeeded of its connections at once
	// (Workers + Relay.Workers + 1: the deliveries being handled, the
	// relay's claims, retention; one more with Relay.Listen), and warns
	// when the pool's MaxConns is smaller: size it for that plus what the
	// application and other clients sharing it use (pgxpool's default, 4
	// or the number of CPUs, is too small for the defaults).
	Pool *pgxpool.Pool

	// Schema is the Postgres schema of the sagabox tables (messaging
	// migration line). Defaults to store.DefaultSchema ("sagabox").
	Schema string

	// Service is the name of the service and of its queue: every registered
	// command, compensation and event type is routed to it. Required.
	Service string

	// Broker receives the commands and events and publishes the replies and
	// outgoing events. The Client does not close it. Required.
	Broker transport.Broker

	// Workers is how many deliveries are handled at once, each in its own
	// transaction. Defaults to DefaultWorkers (4).
	Workers int

	// Prefetch is how many unacknowledged deliveries the broker may hand
	// out. Defaults to 2 × Workers, and is raised to 2 × MaxBatch ×
	// Workers when batching.
	Prefetch int

	// MaxBatch, above 1, lets a worker handle up to MaxBatch deliveries
	// that arrive together in one transaction (group commit): a free
	// worker takes the deliveries that came while every worker was busy
	// (so batches grow with the load), once deliveries come faster than
	// one at a time waits up to BatchLinger for more, and handles them in
	// one transaction of two round trips besides the handlers' own
	// statements: one statement records every inbox entry and barrier mark,
	// the handlers run one after the other, each under a savepoint of its
	// own, and one statement writes the replies and commits. A handler that
	// fails is rolled back to its savepoint and its delivery's inbox entry
	// and marks removed, without touching the others, and it is handled
	// again on its own, with its retries. An idle queue's deliveries are
	// handled one by one, at once.
	//
	// Opt in when handlers are short database work: a batch holds the locks
	// its handlers take until it commits, and a handler's writes become
	// visible (and its reply is sent) with the whole batch's. At most
	// MaxBatchLimit (32). Defaults to 1: every delivery in a transaction of
	// its own.
	MaxBatch int

	// BatchLinger bounds how long a batch waits for more deliveries.
	// Defaults to transport.DefaultLinger (2ms).
	BatchLinger time.Duration

	// Retry says how a message whose handler fails transiently (any error
	// but a rejection, or a panic) is retried, and after how many attempts
	// (MaxAttempts, the first included) it is dead-lettered. The delay before
	// attempt n+1 is InitialInterval × BackoffCoefficient^(n-1), capped at
	// MaximumInterval, drawn from its upper half (jitter); the broker may
	// round it up (see transport.Retry). No worker is held meanwhile. Zero
	// fields take the participant's defaults, not saga.RetryPolicy's:
	// DefaultInitialInterval (1s), DefaultBackoffCoefficient (2),
	// DefaultMaximumInterval (30s) and DefaultMaxAttempts (10).
	Retry saga.RetryPolicy

	// HandlerTimeout bounds one run of a handler: its context ends after
	// it, which cancels the statement it is running (pgx closes the
	// connection) and the calls it makes with that context. A run that
	// returns after its timeout has failed, whatever it returned: it is
	// counted against Retry.MaxAttempts and retried after its backoff
	// like any failure, its transaction rolled back, and when it was in a
	// group (MaxBatch) the group's other deliveries are handled again on
	// their own. A handler that ignores its context cannot be stopped: it
	// holds its worker until it returns. For an outside handler
	// (HandleOutsideCommand) it bounds the call and the record, each; the
	// call runs in no transaction, so a result it returns late (a success
	// or a rejection) is recorded, and only an error past the timeout
	// counts as the timeout's failure.
	// Keep it well under RabbitMQ's consumer_timeout (30 minutes by
	// default), past which the broker closes the channel of a delivery
	// still held. Defaults to DefaultHandlerTimeout (1 minute); negative:
	// no timeout.
	HandlerTimeout time.Duration

	// MaxPayloadBytes is the largest payload accepted; a larger one is
	// answered with a failure reply and dead-lettered without running a
	// handler. It is the one payload limit on the receiving side (the broker
	// adapter does not parse bodies). Defaults to DefaultMaxPayloadBytes (1
	// MiB).
	MaxPayloadBytes int

	// StopTimeout bounds how long Run waits, after its context is cancelled,
	// for the deliveries in flight. Past it their transactions are cancelled
	// (rolled back) and the broker redelivers them later. Defaults to
	// DefaultStopTimeout (30s).
	StopTimeout time.Duration

	// Relay tunes the relay that publishes the Client's outbox (replies and
	// outgoing events). Defaults to the defaults of RelayConfig.
	Relay RelayConfig

	// Retention says how long processed messaging rows are kept. Defaults
	// to the defaults of RetentionConfig.
	Retention RetentionConfig

	// Logger receives the Client's logs, with the attribute
	// component=participant. Defaults to slog.Default().
	Logger *slog.Logger

	// TracerProvider creates the tracer of the Client's spans: one consumer
	// span per delivery, a child of the producer span that sent it, and
	// one producer span per message its relay publishes. Handlers receive
	// the consumer span in their context, so the replies and events they
	// write continue the trace. Defaults to the global provider.
	TracerProvider trace.TracerProvider

	// MeterProvider creates the Client's metrics (deliveries handled by
	// outcome, duplicates, dead letters, retries, relay publishing, outbox
	// backlog). Defaults to the global provider.
	MeterProvider metric.MeterProvider
}

// retryDefaults fills the zero fields of a participant's retry policy with
// the participant's defaults. They differ from saga.RetryPolicy's own, which
// are for re-sending a command after a step timeout (one attempt).
func retryDefaults(p saga.RetryPolicy) saga.RetryPolicy {
	if p.InitialInterval == 0 {
		p.InitialInterval = DefaultInitialInterval
	}
	if p.BackoffCoefficient == 0 {
		p.BackoffCoefficient = DefaultBackoffCoefficient
	}
	if p.MaximumInterval == 0 {
		p.MaximumInterval = max(DefaultMaximumInterval, p.InitialInterval)
	}
	if p.MaxAttempts == 0 {
		p.MaxAttempts = DefaultMaxAttempts
	}
	return p
}

// ConnsNeeded is the most connections of Pool that Run holds at once with
// c (its defaults filled in): Workers + Relay.Workers + 1 (the deliveries
// being handled, the relay's claims, retention), one more with
// Relay.Listen; a log relay counts one for all its workers. Run warns when
// the pool's MaxConns is smaller. Size the pool for this plus what the
// application and other clients sharing it use.
func (c Config) ConnsNeeded() int {
	d := c.WithDefaults()
	return engine.ConnsNeeded(d.Workers, d.Relay, 0)
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
	if c.MaxBatch == 0 {
		c.MaxBatch = 1
	}
	if c.BatchLinger == 0 {
		c.BatchLinger = transport.DefaultLinger
	}
	c.Retry = retryDefaults(c.Retry)
	if c.MaxPayloadBytes == 0 {
		c.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
	if c.StopTimeout == 0 {
		c.StopTimeout = DefaultStopTimeout
	}
	if c.HandlerTimeout == 0 {
		c.HandlerTimeout = DefaultHandlerTimeout
	}
	c.Relay = c.Relay.WithDefaults()
	c.Retention = c.Retention.WithDefaults()
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
		errs = append(errs, errors.New("Service is required (the name of the service's queue)"))
	}
	if c.Broker == nil {
		errs = append(errs, errors.New("Broker is required"))
	}
	if err := store.ValidateSchema(c.Schema); err != nil {
		errs = append(errs, fmt.Errorf("Schema: %w", err))
	}
	if c.Workers < 1 {
		errs = append(errs, fmt.Errorf("Workers %d is less than 1", c.Workers))
	}
	if err := c.Retention.Validate("Retention"); err != nil {
		errs = append(errs, err)
	}
	if c.Prefetch < c.Workers {
		errs = append(errs, fmt.Errorf("Prefetch %d is less than Workers %d", c.Prefetch, c.Workers))
	}
	if c.MaxBatch < 1 || c.MaxBatch > MaxBatchLimit {
		errs = append(errs, fmt.Errorf("MaxBatch %d is not between 1 and %d (MaxBatchLimit)", c.MaxBatch, MaxBatchLimit))
	}
	if c.BatchLinger < 0 {
		errs = append(errs, fmt.Errorf("BatchLinger %s is negative", c.BatchLinger))
	}
	if err := c.Retry.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("Retry: %w", err))
	}
	if c.MaxPayloadBytes < 1 {
		errs = append(errs, fmt.Errorf("MaxPayloadBytes %d is less than 1", c.MaxPayloadBytes))
	}
	if c.StopTimeout < 0 {
		errs = append(errs, fmt.Errorf("StopTimeout %s is negative", c.StopTimeout))
	}
	if err := c.Relay.Validate("Relay"); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("participant: invalid config: %w", errors.Join(errs...))
	}
	return nil
}
