package participant

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/sagabox/sagabox/internal/engine"
	"github.com/sagabox/sagabox/internal/telemetry"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/store/driver"
	"github.com/sagabox/sagabox/transport"
)

// Client consumes one service's queue and runs the registered handlers, each
// delivery in one transaction with its inbox record, barrier mark and reply.
// It also runs the relay that publishes its outbox. Create it with
// NewClient, register handlers with HandleCommand, HandleCompensation and
// HandleEvent, then call Run.
type Client struct {
	cfg    Config
	db     driver.Executor
	engine *engine.Engine
	tel    *telemetry.Telemetry
	log    *slog.Logger

	// run guards Run, and handlers, which are registered before it.
	run      engine.RunGuard
	handlers map[handlerKey]*handler

	// testHookAfterCommit, when set, runs after the transaction of a
	// delivery handled (not given up on) committed, and before the relay is
	// woken and the delivery acked.
	testHookAfterCommit func(d *transport.Delivery)
	// testHookAfterCall, when set, runs after an outside handler's call
	// returned and before its outcome is recorded; an error it returns ends
	// the delivery there, as a crash would.
	testHookAfterCall func(d *transport.Delivery) error
}

// NewClient validates cfg and returns a Client. It does not connect to
// anything yet: Run checks the schema and starts consuming.
func NewClient(cfg Config) (*Client, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	db, err := store.NewExecutor(cfg.Pool, cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("participant: %w", err)
	}
	tel, err := telemetry.New(cfg.TracerProvider, cfg.MeterProvider)
	if err != nil {
		return nil, fmt.Errorf("participant: %w", err)
	}
	c := &Client{
		cfg:      cfg,
		db:       db,
		tel:      tel,
		log:      cfg.Logger.With("component", componentName, "service", cfg.Service),
		handlers: make(map[handlerKey]*handler),
	}
	c.engine, err = engine.New(engine.Config{
		DB: db, Broker: cfg.Broker, Component: componentName,
		Workers: cfg.Workers, Prefetch: cfg.Prefetch, MaxBatch: cfg.MaxBatch, Linger: cfg.BatchLinger,
		StopTimeout:     cfg.StopTimeout,
		MaxPayloadBytes: cfg.MaxPayloadBytes, Retry: cfg.Retry, Relay: cfg.Relay, Retention: cfg.Retention,
		Logger: cfg.Logger.With("service", cfg.Service), Telemetry: tel,
	}, processor{c})
	if err != nil {
		return nil, fmt.Errorf("participant: %w", err)
	}
	return c, nil
}

func (c *Client) register(h *handler) {
	if h.typ == "" {
		panic(fmt.Sprintf("participant: register %s handler: the message type is empty", h.kind))
	}
	c.run.With(func(running bool) {
		if running {
			panic(fmt.Sprintf("participant: register %s handler for %q: register handlers before Run", h.kind, h.typ))
		}
		key := handlerKey{h.kind, h.typ}
		if _, dup := c.handlers[key]; dup {
			panic(fmt.Sprintf("participant: a %s handler for %q is already registered", h.kind, h.typ))
		}
		c.handlers[key] = h
	})
}

// lookup returns the handler of kind and typ, nil if none. It is called
// while Run runs, when the handlers cannot change (engine.RunGuard).
func (c *Client) lookup(kind message.Kind, typ string) *handler {
	return c.handlers[handlerKey{kind, typ}]
}

// QueueSpec returns the queue the Client consumes: Service, with every
// registered command and compensation type and every registered event type
// routed to it.
func (c *Client) QueueSpec() transport.QueueSpec {
	spec := transport.QueueSpec{Name: c.cfg.Service}
	c.run.With(func(bool) { spec.Commands, spec.Events = c.routes() })
	slices.Sort(spec.Commands)
	slices.Sort(spec.Events)
	return spec
}

// routes returns the command and event types of the registered handlers,
// each once.
func (c *Client) routes() (commands, events []string) {
	for k := range c.handlers {
		switch k.kind {
		case message.KindEvent:
			if !slices.Contains(events, k.typ) {
				events = append(events, k.typ)
			}
		default:
			if !slices.Contains(commands, k.typ) {
				commands = append(commands, k.typ)
			}
		}
	}
	return commands, events
}

// Publish writes msgs to the Client's outbox in tx, so that they are
// published if and only if tx commits (see message.Message.Prepare for the
// fields it fills in); a message without a trace context gets ctx's. Inside
// a handler pass the handler's tx: the relay is woken when it commits.
// Outside a handler, call Wake after committing tx (or set Relay.Notify for
// a relay in another process), or the relay finds the messages at its next
// poll.
func (c *Client) Publish(ctx context.Context, tx pgx.Tx, msgs ...message.Message) error {
	tp, ts := telemetry.Inject(ctx)
	for i := range msgs {
		if msgs[i].TraceParent == "" {
			msgs[i].TraceParent, msgs[i].TraceState = tp, ts
		}
	}
	if err := c.db.OutboxWrite(ctx, tx, msgs); err != nil {
		return fmt.Errorf("participant: publish: %w", err)
	}
	if c.cfg.Relay.Notify {
		if err := c.db.OutboxNotify(ctx, tx); err != nil {
			return fmt.Errorf("participant: publish: %w", err)
		}
	}
	return nil
}

// Wake makes the Client's relay look for outbox rows now. It never blocks.
func (c *Client) Wake() { c.engine.Wake() }

// Run checks that the schema is migrated, then consumes the service's queue
// and publishes the outbox until ctx is cancelled. It then stops taking
// deliveries, waits up to StopTimeout for those in flight, stops the relay
// and returns nil. It returns an error at once if the schema is not migrated
// (naming the command to run) or no handler is registered, and later if the
// broker gives up on the subscription (e.g. the Broker was closed).
func (c *Client) Run(ctx context.Context) error {
	leave, err := c.run.Enter(componentName, func() error {
		if len(c.handlers) == 0 {
			return errors.New("no handlers registered: call HandleCommand, HandleCompensation or HandleEvent before Run")
		}
		return nil
	})
	if err != nil {
		return err
	}
	defer leave()

	// A database that is down, or restarting, delays the start; a schema
	// not migrated is returned.
	if err := c.engine.AwaitSchema(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // stopped before it started
		}
		return fmt.Errorf("participant: %w", err)
	}
	spec := c.QueueSpec()
	c.log.Info("participant started", "queue", spec.Name, "commands", spec.Commands, "events", spec.Events, "workers", c.cfg.Workers)
	if err := c.engine.Run(ctx, spec); err != nil {
		c.log.Error("participant stopped: subscription failed", "err", err)
		return fmt.Errorf("participant: %w", err)
	}
	c.log.Info("participant stopped")
	return nil
}
