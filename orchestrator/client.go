package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sagabox/sagabox/internal/engine"
	"github.com/sagabox/sagabox/internal/telemetry"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/store/driver"
	"github.com/sagabox/sagabox/transport"
)

// ErrNotFound is wrapped by the errors of Get, History and the operator
// actions (Retry, Cancel, Terminate, Restart) for a saga that does not
// exist, and of GetRequest for a request that does not exist. It is message.ErrNotFound, so errors.Is works
// with either name.
var ErrNotFound = message.ErrNotFound

// OverdueGrace is how long past its deadline a running or compensating saga
// must be to count in the sagabox.sagas.overdue gauge (a healthy sweeper
// fires a deadline within SweepInterval), and how long a saga's command or
// compensation must have waited unpublished, past the saga's deadline or
// without one, to count in sagabox.sagas.unpublished_overdue.
const OverdueGrace = time.Minute

// startWakeDelays are the follow-up wake-ups of the relay after a Start: the
// caller's transaction commits some time after Start returns, and the relay
// cannot see it before.
var startWakeDelays = []time.Duration{5 * time.Millisecond, 25 * time.Millisecond, 100 * time.Millisecond, 400 * time.Millisecond}

// Client runs saga definitions: it starts sagas in the caller's
// transaction, applies the participants' replies, fires step deadlines,
// performs operator actions, and publishes its outbox. Create it with
// NewClient, start sagas with Start, and call Run in one goroutine.
type Client struct {
	cfg      Config
	db       driver.Executor
	engine   *engine.Engine // nil without a Broker
	tel      *telemetry.Telemetry
	log      *slog.Logger
	registry *saga.Registry

	// run guards Run.
	run engine.RunGuard

	// startWake is signalled by Start; Run's waker goroutine then wakes the
	// relay a few times.
	startWake chan struct{}
	// wokenSinceStart is set by Wake (the caller's, after committing) and
	// cleared by each Start: while it is set, the follow-up wake-ups after
	// a Start are not needed (a claim after the commit finds its
	// commands), and the waker skips them.
	wokenSinceStart atomic.Bool
	// queuedStart is set by a Start that queued its saga: the waker then
	// wakes the admission pass too.
	queuedStart atomic.Bool
	// admitWake wakes the admission pass (admitLoop).
	admitWake chan struct{}
	// mayBeQueued is set while queued sagas may exist (this process queued
	// one, or the last admission pass found some): only then does the end
	// of a saga wake the admission pass at once. Sagas other processes
	// queue are found by its poll.
	mayBeQueued atomic.Bool

	// sweepMu guards sweepNext, the time the sweeper plans to run next.
	// Writers of an earlier deadline move it and signal sweepWake.
	sweepMu   sync.Mutex
	sweepNext time.Time
	sweepWake chan struct{}

	// outage keeps the broker's outages out of step timeouts.
	outage outageClock

	// routes is what routeLoop learnt of the commands' routes.
	routes routeState

	// room remembers, per definition, the last admission count a Start
	// read, so that Starts far below the limit need not count again (see
	// admissionRoom).
	room admissionRooms

	// waiters are the callers of Wait, woken when this Client ends their
	// saga.
	waiters waiters

	// cache keeps running sagas as this Client last wrote them
	// (Config.SagaCache); nil keeps none.
	cache *sagaCache
}

// NewClient validates cfg and returns a Client. It connects to nothing yet:
// Run checks the schema and starts consuming. Start may be called before Run
// (the messages wait in the outbox until a relay publishes them).
func NewClient(cfg Config) (*Client, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	db, err := store.NewExecutor(cfg.Pool, cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("orchestrator: %w", err)
	}
	tel, err := telemetry.New(cfg.TracerProvider, cfg.MeterProvider)
	if err != nil {
		return nil, fmt.Errorf("orchestrator: %w", err)
	}
	reg := saga.NewRegistry()
	if err := reg.Register(cfg.Definitions...); err != nil {
		return nil, fmt.Errorf("orchestrator: invalid config: Definitions: %w", err)
	}
	c := &Client{
		cfg:       cfg,
		db:        db,
		tel:       tel,
		log:       cfg.Logger.With("component", componentName, "service", cfg.Service),
		registry:  reg,
		startWake: make(chan struct{}, 1),
		admitWake: make(chan struct{}, 1),
		outage:    outageClock{grace: OutageRecoveryGrace},
		sweepWake: make(chan struct{}, 1),
		cache:     newSagaCache(cfg.SagaCache),
	}
	if cfg.Broker != nil {
		c.engine, err = engine.New(engine.Config{
			DB: db, Broker: cfg.Broker, Component: componentName,
			Workers: cfg.Workers, Prefetch: cfg.Prefetch, MaxBatch: cfg.MaxBatch, Linger: cfg.BatchLinger,
			StopTimeout: cfg.StopTimeout, LoopConns: loopConns,
			MaxPayloadBytes: engine.DefaultMaxPayloadBytes, Retry: cfg.ReplyRetry, Relay: cfg.Relay,
			Retention: cfg.Retention, KeepsSagas: true, Clock: cfg.Clock,
			Logger: cfg.Logger.With("service", cfg.Service), Telemetry: tel,
		}, processor{c})
		if err != nil {
			return nil, fmt.Errorf("orchestrator: %w", err)
		}
	}
	return c, nil
}

// Register adds saga definitions to the ones the Client runs. Several
// versions of one name may be registered. It fails, adding none, if a name
// and version is already registered. Register before Run and before
// starting sagas of the definition.
func (c *Client) Register(runners ...saga.Runner) error {
	for i, r := range runners {
		if r == nil {
			return fmt.Errorf("orchestrator: register: runner %d is nil", i)
		}
	}
	if err := c.registry.Register(runners...); err != nil {
		return fmt.Errorf("orchestrator: register: %w", err)
	}
	return nil
}

// Wake makes the Client's relay publish its outbox now. Call it after
// committing a transaction in which you started sagas, for the lowest
// latency; without it the relay finds the first commands after a few
// follow-up wake-ups or, at the latest, after Relay.PollInterval. A Wake
// after a Start stands in for those follow-up wake-ups (each an extra
// claim), until the next Start: call it after every such commit, or
// never. It never blocks.
func (c *Client) Wake() {
	c.wokenSinceStart.Store(true)
	c.wakeRelay()
}

// wakeRelay makes the relay publish the outbox now (Wake without counting
// as the caller's wake-up after a Start).
func (c *Client) wakeRelay() {
	if c.engine != nil {
		c.engine.Wake()
	}
}

// now returns the Client's clock, in UTC.
func (c *Client) now() time.Time { return c.cfg.Clock().UTC() }

// Run checks that the schema is migrated, records the shapes of its
// definitions in it (see Definitions), declares the reply queue, then
// applies replies, fires deadlines, publishes the outbox and prunes old rows
// until ctx is cancelled. It then stops taking replies, waits up to
// StopTimeout for the replies and sweeps in flight, stops the relay and
// returns nil. It returns an error at once if the schema is not migrated
// (naming the command to run), if no definition is registered or if the
// queue cannot be declared, and later if the broker gives up on the
// subscription (e.g. the Broker was closed).
func (c *Client) Run(ctx context.Context) error {
	leave, err := c.run.Enter(componentName, func() error {
		switch {
		case c.cfg.Broker == nil:
			return errors.New("Config.Broker is required to Run")
		case len(c.registry.Runners()) == 0:
			return errors.New("no saga definition registered: set Config.Definitions or call Register before Run")
		}
		return nil
	})
	if err != nil {
		return err
	}
	defer leave()

	// A database or broker that is down, or restarting, delays the start;
	// only what waiting cannot cure (a schema not migrated, a queue that
	// exists with other arguments) is returned.
	if err := c.engine.AwaitSchema(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // stopped before it started
		}
		return fmt.Errorf("orchestrator: %w", err)
	}
	c.recordDefinitions(ctx)
	spec := transport.QueueSpec{Name: c.cfg.Service, Replies: true, Events: c.awaitedEvents()}
	err = engine.AwaitReady(ctx, c.log, "declare the reply queue", engine.BrokerTransient, func(ctx context.Context) error {
		return c.cfg.Broker.Declare(ctx, spec)
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("orchestrator: declare reply queue %s: %w", spec.Name, err)
	}
	overdue, err := c.tel.RegisterOverdueGauge(c.db, OverdueGrace, c.now)
	if err != nil {
		return fmt.Errorf("orchestrator: %w", err)
	}
	defer func() { _ = overdue.Unregister() }()
	held, err := c.tel.RegisterUnpublishedGauge(c.db, c.sagaTypes(), OverdueGrace, c.now)
	if err != nil {
		return fmt.Errorf("orchestrator: %w", err)
	}
	defer func() { _ = held.Unregister() }()
	routes, err := c.tel.RegisterRouteGauge(c.cfg.Schema, c.gaugeRoutes)
	if err != nil {
		return fmt.Errorf("orchestrator: %w", err)
	}
	defer func() { _ = routes.Unregister() }()
	queued, err := c.tel.RegisterQueuedGauges(c.db, c.now)
	if err != nil {
		return fmt.Errorf("orchestrator: %w", err)
	}
	defer func() { _ = queued.Unregister() }()
	types := c.sagaTypes()
	sagaGauges, err := c.tel.RegisterSagaGauges(c.db, types)
	if err != nil {
		return fmt.Errorf("orchestrator: %w", err)
	}
	defer func() { _ = sagaGauges.Unregister() }()
	c.tel.ZeroSagaCounters(ctx, types)

	c.log.Info("orchestrator started", "queue", spec.Name, "schema", c.cfg.Schema, "definitions", c.definitionNames(), "workers", c.cfg.Workers)
	// loopConns counts the loops here that hold a connection (the sweeper
	// and the admission): keep it in step with them.
	err = c.engine.Run(ctx, spec, c.sweepLoop, c.admitLoop, func(ctx, _ context.Context) { c.wakeAfterStarts(ctx) }, c.routeLoop)
	if err != nil {
		c.log.Error("orchestrator stopped: subscription failed", "err", err)
		return fmt.Errorf("orchestrator: %w", err)
	}
	c.log.Info("orchestrator stopped")
	return nil
}

// sagaTypes names the saga types of the definitions the Client runs, each
// once.
func (c *Client) sagaTypes() []string {
	var out []string
	for _, r := range c.registry.Runners() {
		if !slices.Contains(out, r.Name()) {
			out = append(out, r.Name())
		}
	}
	return out
}

func (c *Client) definitionNames() []string {
	var out []string
	for _, r := range c.registry.Runners() {
		out = append(out, fmt.Sprintf("%s v%d", r.Name(), r.Version()))
	}
	return out
}

// wakeAfterStarts wakes the relay a few times after each Start, so that the
// first commands of sagas started in callers' transactions go out soon after
// those commit.
func (c *Client) wakeAfterStarts(ctx context.Context) {
	t := time.NewTimer(time.Hour)
	t.Stop()
	defer t.Stop()
	next := len(startWakeDelays)
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.startWake:
			next = 0
			t.Reset(startWakeDelays[0])
		case <-t.C:
			if !c.wokenSinceStart.Load() {
				c.wakeRelay()
			}
			if c.queuedStart.Load() {
				c.wakeAdmission()
			}
			next++
			if next < len(startWakeDelays) {
				t.Reset(startWakeDelays[next] - startWakeDelays[next-1])
			} else {
				c.queuedStart.Store(false)
			}
		}
	}
}
