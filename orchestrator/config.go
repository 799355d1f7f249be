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

	"github.com/sagabox/sagabox/internal/engine"
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
	// DefaultMaxBatch is the most replies one transaction applies when
	// they arrive faster than one at a time (group commit).
	DefaultMaxBatch = 32
	// DefaultSweepInterval is the longest the deadline sweeper waits between
	// two passes. A deadline written by this Client that falls earlier
	// wakes it sooner.
	DefaultSweepInterval = time.Second
	// DefaultSweepBatch is the most sagas one sweeper transaction claims.
	DefaultSweepBatch = 100
	// DefaultSagaCache is how many sagas' state a Client keeps between
	// their transitions (Config.SagaCache).
	DefaultSagaCache = 4096
	// DefaultStopTimeout bounds the drain of replies and sweeps in flight
	// when Run's context is cancelled.
	DefaultStopTimeout = 30 * time.Second
	// DefaultReplyMaxAttempts, DefaultReplyInitialInterval and
	// DefaultReplyMaximumInterval are the defaults of ReplyRetry.
	DefaultReplyMaxAttempts     = 10
	DefaultReplyInitialInterval = time.Second
	DefaultReplyMaximumInterval = 30 * time.Second
)

// Config configures a Client. Required fields are Pool and Service, and
// Broker for Run; every other field has a default.
type Config struct {
	// Pool is the connection pool of the orchestrator's database: saga
	// instances, history, outbox and inbox. Required.
	//
	// Run holds at most ConnsNeeded of its connections at once
	// (Workers + Relay.Workers + 3: the replies being applied, the relay's
	// claims, the sweeper, the admission and operator requests, retention;
	// one more with Relay.Listen), and warns when the pool's MaxConns is
	// smaller: size it for that plus what the application and other
	// clients sharing it use (pgxpool's default, 4 or the number of CPUs,
	// is too small for the defaults).
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
	// Defaults to 2 × Workers, and is raised to 2 × MaxBatch × Workers
	// when batching.
	Prefetch int

	// MaxBatch is the most replies a worker applies in one transaction
	// (group commit): a free worker takes the replies that came while every
	// worker was busy, up to MaxBatch (so batches grow with the load), and
	// once replies come faster than one at a time waits up to BatchLinger
	// for more; it applies them in one transaction of two round trips, at
	// most one reply per saga. Each reply keeps its own
	// span, outcome, retries and dead-lettering: a batch whose transaction
	// fails is applied again one reply at a time. An idle queue's replies
	// are applied one by one, at once. Defaults to DefaultMaxBatch (32); 1
	// applies every reply in a transaction of its own.
	MaxBatch int

	// BatchLinger bounds how long a batch waits for more replies. Defaults
	// to transport.DefaultLinger (2ms).
	BatchLinger time.Duration

	// SagaCache is how many running sagas' state the Client keeps in
	// memory from its own last write of each (the saga cache, like
	// Temporal's sticky workflow cache), least recently used first out. A
	// reply to a saga it keeps is applied in one round trip instead of two:
	// the saga is not read, and the write checks that the saga's revision
	// is still the one kept; if another process (an orchestrator replica,
	// an operator) wrote the saga meanwhile, or the reply is a duplicate,
	// the transaction fails and runs again the ordinary way, reading the
	// saga. Defaults to DefaultSagaCache (4096); negative keeps none.
	SagaCache int

	// SweepInterval is the longest the deadline sweeper waits between two
	// passes; it is also the worst-case lateness of a timeout written by
	// another process. Defaults to DefaultSweepInterval (1s).
	SweepInterval time.Duration

	// SweepBatch is the most due sagas claimed by one sweeper transaction.
	// Defaults to DefaultSweepBatch (100).
	SweepBatch int

	// RouteCheckInterval is how often Run checks again the commands (and
	// compensations) of its definitions that no queue took when it
	// started, until a queue takes each (see the broker's
	// transport.RouteChecker; Run logs each one, and the
	// sagabox.commands.unroutable gauge shows them). Defaults to
	// DefaultRouteCheckInterval (1m); negative checks at start only.
	RouteCheckInterval time.Duration

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

	// Admission is flow control: how many sagas of a definition run at
	// once. Starts beyond the limit are accepted in the caller's
	// transaction as queued sagas and admitted in start order as running
	// ones end. Defaults to the defaults of AdmissionConfig.
	Admission AdmissionConfig

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
	// backlog, overdue sagas, sagas waiting for unpublished messages,
	// commands no queue takes). Defaults to the global provider.
	MeterProvider metric.MeterProvider
}

// DefaultMaxRunning is AdmissionConfig.MaxRunning's default: the most sagas
// of one definition running or compensating at once.
const DefaultMaxRunning = 500

// DefaultAdmissionBatch is AdmissionConfig.Batch's default.
const DefaultAdmissionBatch = 100

// AdmissionConfig limits how many sagas of a definition run at once (flow
// control). A burst of starts beyond what the participants can serve
// within the steps' timeouts would otherwise turn into a storm of
// time-outs and re-sends: each saga's step would wait behind the whole
// burst's commands. With a limit, the burst waits as queued sagas, none
// of whose steps has started, so none times out.
//
// The limit is checked by Start against the sagas committed by then:
// starts committing at the same moment can each find the last free place,
// so the limit may be passed by as many. The admission pass (one
// orchestrator at a time, under an advisory lock) never passes it.
type AdmissionConfig struct {
	// MaxRunning is the most sagas of one definition name (all its
	// versions) running or compensating at once; a failed saga (waiting
	// for an operator) does not count. Defaults to DefaultMaxRunning
	// (500). Negative: no limit. The limit is checked against committed
	// sagas, so concurrent starts can pass it by a little; a start does not
	// count again while the count another start of this process read is
	// less than 100 ms old and the starts since took at most half the room
	// it left below the limit. The admission pass, which starts queued
	// sagas, always counts.
	MaxRunning int
	// PerDefinition sets the limit of the definitions it names, instead of
	// MaxRunning (negative: no limit; zero: MaxRunning).
	PerDefinition map[string]int
	// Batch is the most queued sagas one admission transaction starts.
	// Defaults to DefaultAdmissionBatch (100).
	Batch int
}

// WithDefaults returns a copy of a with every zero field set to its
// default.
func (a AdmissionConfig) WithDefaults() AdmissionConfig {
	if a.MaxRunning == 0 {
		a.MaxRunning = DefaultMaxRunning
	}
	if a.Batch == 0 {
		a.Batch = DefaultAdmissionBatch
	}
	return a
}

// limit returns the limit of running sagas of definition name; negative for
// none.
func (a AdmissionConfig) limit(name string) int {
	if n := a.PerDefinition[name]; n != 0 {
		return n
	}
	return a.MaxRunning
}

// RelayConfig tunes the relay a Client runs to publish its outbox; a
// participant's is the same type.
type RelayConfig = relay.Options

// RelayMode is how the relay finds committed outbox rows
// (RelayConfig.Mode); the participant's is the same type.
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

// RetentionConfig says how long a Client keeps finished sagas (Sagas) and
// processed messaging rows; a participant's is the same type. Its Barrier
// field is the participant's only.
type RetentionConfig = engine.RetentionConfig

// ConnsNeeded is the most connections of Pool that Run holds at once with
// c (its defaults filled in): Workers + Relay.Workers + 3 (the replies being
// applied, the relay's claims, the sweeper, the admission and operator
// requests, retention), one more with Relay.Listen; a log relay counts one
// for all its workers. Run warns when the pool's MaxConns is smaller. Size
// the pool for this plus what the application and other clients sharing it
// use.
func (c Config) ConnsNeeded() int {
	d := c.WithDefaults()
	return engine.ConnsNeeded(d.Workers, d.Relay, loopConns)
}

// loopConns counts the orchestrator's loops that hold a connection while
// they work: the sweeper and the admission (which also takes the operator
// requests). The timer that wakes the relay after starts holds none.
const loopConns = 2

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
		c.MaxBatch = DefaultMaxBatch
	}
	if c.BatchLinger == 0 {
		c.BatchLinger = transport.DefaultLinger
	}
	if c.SagaCache == 0 {
		c.SagaCache = DefaultSagaCache
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = DefaultSweepInterval
	}
	if c.SweepBatch == 0 {
		c.SweepBatch = DefaultSweepBatch
	}
	if c.RouteCheckInterval == 0 {
		c.RouteCheckInterval = DefaultRouteCheckInterval
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
	c.Admission = c.Admission.WithDefaults()
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
	if c.MaxBatch < 1 {
		errs = append(errs, fmt.Errorf("MaxBatch %d is less than 1", c.MaxBatch))
	}
	if c.BatchLinger < 0 {
		errs = append(errs, fmt.Errorf("BatchLinger %s is negative", c.BatchLinger))
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
	if c.Admission.Batch < 1 {
		errs = append(errs, fmt.Errorf("Admission.Batch %d is less than 1", c.Admission.Batch))
	}
	if err := c.Relay.Validate("Relay"); err != nil {
		errs = append(errs, err)
	}
	if err := c.Retention.Validate("Retention"); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("orchestrator: invalid config: %w", errors.Join(errs...))
	}
	return nil
}
