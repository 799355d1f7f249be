package participant

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/sagabox/sagabox/internal/lifecycle"
	"github.com/sagabox/sagabox/internal/maintenance"
	"github.com/sagabox/sagabox/internal/relay"
	"github.com/sagabox/sagabox/internal/telemetry"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/transport"
)

// Client consumes one service's queue and runs the registered handlers, each
// delivery in one transaction with its inbox record, barrier mark and reply.
// It also runs the relay that publishes its outbox. Create it with
// NewClient, register handlers with HandleCommand, HandleCompensation and
// HandleEvent, then call Run.
type Client struct {
	cfg   Config
	store *store.Store
	relay *relay.Relay
	tel   *telemetry.Telemetry
	log   *slog.Logger

	mu       sync.Mutex
	handlers map[handlerKey]*handler
	running  bool

	// infraFailures counts consecutive deliveries that could not even record
	// their failure (Postgres unreachable); it paces their retries.
	infraFailures atomic.Int64

	// testHookAfterCommit, when set, runs after a delivery's transaction
	// committed and before the relay is woken and the delivery acked.
	testHookAfterCommit func(d *transport.Delivery)
}

// NewClient validates cfg and returns a Client. It does not connect to
// anything yet: Run checks the schema and starts consuming.
func NewClient(cfg Config) (*Client, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	st, err := store.New(cfg.Pool, cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("participant: %w", err)
	}
	tel, err := telemetry.New(cfg.TracerProvider, cfg.MeterProvider)
	if err != nil {
		return nil, fmt.Errorf("participant: %w", err)
	}
	log := cfg.Logger.With("component", "participant", "service", cfg.Service)
	r, err := relay.New(relay.Config{
		Store:        st,
		Publisher:    cfg.Broker,
		BatchSize:    cfg.Relay.BatchSize,
		Workers:      cfg.Relay.Workers,
		PollInterval: cfg.Relay.PollInterval,
		Listen:       cfg.Relay.Listen,
		Logger:       cfg.Logger.With("service", cfg.Service),
		Observer:     tel.RelayObserver(cfg.Schema),
		Telemetry:    tel,
	})
	if err != nil {
		return nil, fmt.Errorf("participant: %w", err)
	}
	return &Client{
		cfg:      cfg,
		store:    st,
		relay:    r,
		tel:      tel,
		log:      log,
		handlers: make(map[handlerKey]*handler),
	}, nil
}

func (c *Client) register(h *handler) {
	if h.typ == "" {
		panic(fmt.Sprintf("participant: register %s handler: the message type is empty", h.kind))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running {
		panic(fmt.Sprintf("participant: register %s handler for %q: register handlers before Run", h.kind, h.typ))
	}
	key := handlerKey{h.kind, h.typ}
	if _, dup := c.handlers[key]; dup {
		panic(fmt.Sprintf("participant: a %s handler for %q is already registered", h.kind, h.typ))
	}
	c.handlers[key] = h
}

func (c *Client) lookup(kind message.Kind, typ string) *handler {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.handlers[handlerKey{kind, typ}]
}

// QueueSpec returns the queue the Client consumes: Service, with every
// registered command and compensation type and every registered event type
// routed to it.
func (c *Client) QueueSpec() transport.QueueSpec {
	c.mu.Lock()
	defer c.mu.Unlock()
	spec := transport.QueueSpec{Name: c.cfg.Service}
	for k := range c.handlers {
		switch k.kind {
		case message.KindEvent:
			if !slices.Contains(spec.Events, k.typ) {
				spec.Events = append(spec.Events, k.typ)
			}
		default:
			if !slices.Contains(spec.Commands, k.typ) {
				spec.Commands = append(spec.Commands, k.typ)
			}
		}
	}
	slices.Sort(spec.Commands)
	slices.Sort(spec.Events)
	return spec
}

// Publish writes msgs to the Client's outbox in tx, so that they are
// published if and only if tx commits (see message.Message.Prepare for the
// fields it fills in); a message without a trace context gets ctx's. Inside a handler pass the handler's tx: the relay is woken
// when it commits. Outside a handler, call Wake after committing tx, or the
// relay finds the messages at its next poll.
func (c *Client) Publish(ctx context.Context, tx pgx.Tx, msgs ...message.Message) error {
	tp, ts := telemetry.Inject(ctx)
	for i := range msgs {
		if msgs[i].TraceParent == "" {
			msgs[i].TraceParent, msgs[i].TraceState = tp, ts
		}
	}
	if err := c.store.OutboxWrite(ctx, tx, msgs); err != nil {
		return fmt.Errorf("participant: publish: %w", err)
	}
	return nil
}

// Wake makes the Client's relay look for outbox rows now. It never blocks.
func (c *Client) Wake() { c.relay.Wake() }

// Run checks that the schema is migrated, then consumes the service's queue
// and publishes the outbox until ctx is cancelled. It then stops taking
// deliveries, waits up to StopTimeout for those in flight, stops the relay
// and returns nil. It returns an error at once if the schema is not migrated
// (naming the command to run) or no handler is registered, and later if the
// broker gives up on the subscription (e.g. the Broker was closed).
func (c *Client) Run(ctx context.Context) error {
	c.mu.Lock()
	switch {
	case c.running:
		c.mu.Unlock()
		return errors.New("participant: Run called while the client is already running")
	case len(c.handlers) == 0:
		c.mu.Unlock()
		return errors.New("participant: no handlers registered: call HandleCommand, HandleCompensation or HandleEvent before Run")
	}
	c.running = true
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.running = false
		c.mu.Unlock()
	}()

	if err := c.store.CheckSchema(ctx, store.LineMessaging); err != nil {
		return fmt.Errorf("participant: %w", err)
	}
	spec := c.QueueSpec()
	gauges, err := c.tel.RegisterOutboxGauges(c.store)
	if err != nil {
		return fmt.Errorf("participant: %w", err)
	}
	defer func() { _ = gauges.Unregister() }()

	// Deliveries run on workCtx, which outlives ctx by at most StopTimeout so
	// that a shutdown lets transactions in flight finish.
	workCtx, releaseWork := lifecycle.DrainContext(ctx, c.cfg.StopTimeout, func() {
		c.log.Warn("stop timeout reached; cancelling deliveries in flight (they will be redelivered)", "stop_timeout", c.cfg.StopTimeout)
	})
	defer releaseWork()
	var wg sync.WaitGroup

	retention, err := maintenance.NewRetention(maintenance.RetentionConfig{
		Store: c.store, Interval: c.cfg.Retention.Interval, BatchSize: c.cfg.Retention.BatchSize,
		OutboxRetention: c.cfg.Retention.Outbox, InboxRetention: c.cfg.Retention.Inbox,
		BarrierRetention: c.cfg.Retention.Barrier, Logger: c.cfg.Logger,
	})
	if err != nil {
		return fmt.Errorf("participant: %w", err)
	}
	relayCtx, stopRelay := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRelay()
	wg.Go(func() { _ = c.relay.Run(relayCtx) })
	wg.Go(func() { _ = retention.Run(relayCtx) })

	c.log.Info("participant started", "queue", spec.Name, "commands", spec.Commands, "events", spec.Events, "workers", c.cfg.Workers)
	err = c.cfg.Broker.Subscribe(ctx, spec, transport.HandlerFunc(func(_ context.Context, d *transport.Delivery) transport.Outcome {
		return c.handle(workCtx, d)
	}), &transport.SubscribeOpts{Concurrency: c.cfg.Workers, Prefetch: c.cfg.Prefetch})
	releaseWork()
	stopRelay()
	wg.Wait()
	if err != nil {
		c.log.Error("participant stopped: subscription failed", "err", err)
		return fmt.Errorf("participant: subscribe %s: %w", spec.Name, err)
	}
	c.log.Info("participant stopped")
	return nil
}
