// Package engine is the delivery engine under both of sagabox's clients.
// It owns what they share: consuming a queue and the pipeline each delivery
// takes (its span, the payload limit, processing with conflict retries,
// retries with backoff counted in the database, giving up and
// dead-lettering, waking the relay, acknowledging), the relay that publishes
// the outbox, retention, the outbox gauges and the Run/drain lifecycle.
//
// A client supplies what is its own as a Processor: the orchestrator applies
// a reply to its saga, a participant runs a handler behind the barrier.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/sagabox/sagabox/internal/relay"
	"github.com/sagabox/sagabox/internal/telemetry"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store/driver"
	"github.com/sagabox/sagabox/transport"
)

// ConflictRetries is how many times a delivery's transaction is run again
// at once after a serialization failure or a deadlock (driver.ErrConflict).
const ConflictRetries = 5

// DefaultMaxPayloadBytes is the largest payload a client accepts (1 MiB).
const DefaultMaxPayloadBytes = 1 << 20

// Failure codes (saga.Failure.Code) of the failure replies the engine sends
// on its own.
const (
	// CodeDeadLettered: processing kept failing and the message was given
	// up on after its bounded attempts.
	CodeDeadLettered = saga.CodeDeadLettered
	// CodePayloadTooLarge: the payload is over the client's limit.
	CodePayloadTooLarge = saga.CodePayloadTooLarge
)

// Processor is what a client supplies: how one delivery is applied.
type Processor interface {
	// Process applies d in one transaction of its own and commits it
	// (in two around an outside call). The transaction takes lease, the
	// relay's write-time lease (nil: none), as driver.BeginOpts.Lease, and
	// Result.Committed reports what its commits wrote to the outbox, even
	// with an error. attempt is 1 the first time d is processed and n after
	// n-1 failed attempts. An error that is a *Poison gives d up at once; one
	// marked driver.ErrConflict runs Process again at once (up to
	// ConflictRetries times); any other error is retried with backoff.
	Process(ctx context.Context, d *transport.Delivery, attempt int, lease *driver.OutboxLease) (Result, error)
	// GiveUp records that d is given up on, for p's reason, in a
	// transaction of its own, and answers d if the client answers messages.
	// It reports a duplicate when the inbox already had d.
	GiveUp(ctx context.Context, d *transport.Delivery, p *Poison) (Result, error)
}

// BatchProcessor is a Processor that can also apply several deliveries in
// one transaction (group commit).
type BatchProcessor interface {
	Processor
	// ProcessBatch applies items in one transaction of its own, under
	// lease as Process, and commits it, returning one result per item and
	// what the commit wrote to the outbox. An item it leaves to be
	// processed on its own afterwards (a second reply of one saga) has
	// Result.Defer set; one that failed while the others were applied,
	// Result.Failed. An error means nothing was applied: the engine then
	// processes every item on its own, so that each gets its own retries
	// and give-up.
	ProcessBatch(ctx context.Context, items []Item, lease *driver.OutboxLease) ([]Result, driver.Committed, error)
}

// Item is one delivery of a batch, with the context (the delivery's
// consumer span) its effects are traced in.
type Item struct {
	Ctx      context.Context
	Delivery *transport.Delivery
}

// Result is what processing one delivery did.
type Result struct {
	// Outcome is what processing did: applied, rejected, duplicate,
	// ignored or unknown saga (telemetry labels it).
	Outcome telemetry.Outcome
	// Note says what happened, for the debug log.
	Note string
	// Committed is what the delivery's commits wrote to the outbox: the
	// leased rows are handed to the relay, and the relay is woken for the
	// others.
	Committed driver.Committed
	// SpanAttrs are more attributes for the delivery's span (a saga's
	// status after a reply).
	SpanAttrs []attribute.KeyValue
	// Defer leaves the item of a batch to be processed on its own.
	Defer bool
	// Failed is why the item of a batch failed, its effects undone while
	// the others' committed: the engine counts it as the delivery's first
	// attempt and retries it after the backoff, as it would a delivery
	// processed on its own, rather than process it again at once. A
	// deadlock or a serialization failure (driver.ErrConflict) is processed
	// again at once, uncounted, as it would be alone.
	Failed error
}

// Poison is a failure that no retry can cure: the delivery is given up on at
// once, answered (by GiveUp) and dead-lettered.
type Poison struct {
	// Class is the class of the reason, for metrics.
	Class telemetry.Reason
	// Code is the failure reply's code (saga.Failure.Code).
	Code string
	// Reason says why, for people: the dead letter's reason and the failure
	// reply's.
	Reason string
}

func (p *Poison) Error() string { return p.Reason }

// Config configures an Engine.
type Config struct {
	// DB is the client's schema. Required.
	DB driver.Executor
	// Broker consumes the queue and publishes the outbox. Required.
	Broker transport.Broker
	// Component names the client in logs, spans and metrics.
	Component string
	// Workers and Prefetch tune the subscription.
	Workers, Prefetch int
	// MaxBatch, above 1 with a BatchProcessor, is the most deliveries
	// applied in one transaction; Linger bounds how long a batch waits for
	// more (transport.SubscribeOpts).
	MaxBatch int
	Linger   time.Duration
	// StopTimeout bounds the drain of deliveries in flight at shutdown.
	StopTimeout time.Duration
	// LoopConns is how many of the loops passed to Run hold a connection
	// of the pool while they work (a sweeper, not a timer that only wakes
	// the relay): the pool-size warning counts them (ConnsNeeded).
	LoopConns int
	// MaxPayloadBytes is the largest payload accepted.
	MaxPayloadBytes int
	// Retry says how a delivery whose processing failed is retried, and
	// after how many attempts it is given up on.
	Retry saga.RetryPolicy
	// Relay tunes the relay.
	Relay relay.Options
	// Retention says how long processed rows are kept.
	Retention RetentionConfig
	// KeepsSagas is true for a schema with saga tables (the orchestrator's):
	// retention also prunes finished sagas.
	KeepsSagas bool
	// Clock is the client's clock (finished sagas are pruned by it).
	Clock func() time.Time
	// Logger receives the engine's logs.
	Logger *slog.Logger
	// Telemetry traces and counts deliveries and publishing.
	Telemetry *telemetry.Telemetry
}

// Engine runs one client's deliveries, relay and retention.
type Engine struct {
	cfg   Config
	proc  Processor
	relay *relay.Relay
	log   *slog.Logger

	// infraFailures counts consecutive deliveries that could not reach the
	// database; it paces their retries.
	infraFailures atomic.Int64
}

// New returns an Engine for cfg that applies deliveries with p.
func New(cfg Config, p Processor) (*Engine, error) {
	r, err := relay.New(cfg.DB, cfg.Telemetry.Publisher(cfg.DB.Schema(), cfg.Broker), cfg.Relay,
		relay.Schema{KeepPublished: cfg.Retention.Outbox > 0, Sagas: cfg.KeepsSagas}, cfg.Logger)
	if err != nil {
		return nil, err
	}
	return &Engine{
		cfg:   cfg,
		proc:  p,
		relay: r,
		log:   cfg.Logger.With("component", cfg.Component),
	}, nil
}

// Wake makes the relay look for outbox rows now. It never blocks.
func (e *Engine) Wake() { e.relay.Wake() }

// Loop is a client's own background work (the orchestrator's deadline
// sweeper): it runs until ctx is done, running its transactions on workCtx,
// which outlives ctx by at most the stop timeout.
type Loop func(ctx, workCtx context.Context)

// Run registers the outbox gauges (and the delivery counters at zero), starts the relay, retention and loops,
// and consumes queue until ctx is cancelled. It then stops taking
// deliveries, waits up to the stop timeout for those in flight (and for the
// loops), stops the relay and returns nil; or it returns the subscription's
// error if the broker gives up on it.
func (e *Engine) Run(ctx context.Context, queue transport.QueueSpec, loops ...Loop) error {
	if err := e.relay.Check(ctx); err != nil {
		return err
	}
	gauges, err := e.cfg.Telemetry.RegisterOutboxGauges(e.cfg.DB)
	if err != nil {
		return err
	}
	defer func() { _ = gauges.Unregister() }()
	e.cfg.Telemetry.ZeroDeliveryCounters(ctx, e.cfg.Component, e.cfg.DB.Schema())
	if slot, pub, ok := e.relay.LogSlot(); ok {
		slotGauges, err := e.cfg.Telemetry.RegisterSlotGauges(e.cfg.DB, slot, pub)
		if err != nil {
			return err
		}
		defer func() { _ = slotGauges.Unregister() }()
	}

	// Deliveries and loops run on workCtx, which outlives ctx by at most
	// StopTimeout so that a shutdown lets transactions in flight finish.
	workCtx, releaseWork := DrainContext(ctx, e.cfg.StopTimeout, func() {
		e.log.Warn("stop timeout reached; cancelling work in flight (deliveries will be redelivered)", "stop_timeout", e.cfg.StopTimeout)
	})
	defer releaseWork()

	e.checkPool()

	relayCtx, stopRelay := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRelay()
	var background sync.WaitGroup
	background.Go(func() { _ = e.relay.Run(relayCtx) })

	loopCtx, stopLoops := context.WithCancel(ctx)
	defer stopLoops()
	var wg sync.WaitGroup
	wg.Go(func() { e.retain(loopCtx) })
	for _, loop := range loops {
		wg.Go(func() { loop(loopCtx, workCtx) })
	}

	var h transport.Handler = consumer{e: e, workCtx: workCtx, one: e.cfg.Telemetry.Consume(e.cfg.Component, e.cfg.DB.Schema(), e.handle)}
	if bp, ok := e.proc.(BatchProcessor); ok && e.cfg.MaxBatch > 1 {
		h = batchConsumer{consumer: h.(consumer), bp: bp}
	}
	err = e.cfg.Broker.Subscribe(ctx, queue, h, &transport.SubscribeOpts{
		Concurrency: e.cfg.Workers, Prefetch: e.cfg.Prefetch, MaxBatch: e.cfg.MaxBatch, Linger: e.cfg.Linger,
	})
	stopLoops()
	wg.Wait()
	releaseWork()
	stopRelay()
	background.Wait()
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", queue.Name, err)
	}
	return nil
}

// ConnsNeeded is the most connections of its pool a client's engine holds
// at once: one per worker (a delivery's transaction), one per relay worker
// (a claim), one per background loop (sweeper, operator requests) and one
// for retention, plus the listener's own when the relay listens.
func ConnsNeeded(workers int, relay relay.Options, loops int) int {
	relay = relay.WithDefaults()
	relayConns := relay.Workers
	if relay.Mode == relayModeLog {
		// One connection settles; the replication connection is its own.
		relayConns = 1
	}
	n := workers + relayConns + loops + 1
	if relay.Listen {
		n++
	}
	return n
}

// relayModeLog is relay.ModeLog (the parameter of ConnsNeeded shadows the
// package).
const relayModeLog = relay.ModeLog

// checkPool warns when the pool is smaller than what the engine can hold at
// once: deliveries would queue for connections, a bottleneck that shows as
// nothing but slowness.
func (e *Engine) checkPool() {
	loops := e.cfg.LoopConns
	have := e.cfg.DB.MaxConns()
	need := ConnsNeeded(e.cfg.Workers, e.cfg.Relay, loops)
	if have == 0 || have >= need {
		return
	}
	e.log.Warn(fmt.Sprintf("the connection pool (%d connections) is smaller than the %d this client can use at once; deliveries will wait for connections: raise the pool's MaxConns (pool_max_conns in the URL) to at least %d, plus what the application and the other clients sharing the pool use", have, need, need),
		"pool_max_conns", have, "conns_needed", need, "workers", e.cfg.Workers, "relay_workers", e.cfg.Relay.WithDefaults().Workers, "background", loops+1, "listen", e.cfg.Relay.Listen)
}

// consumer is the engine's transport.Handler: it runs each delivery on the
// engine's work context (which outlives the subscription's by the stop
// timeout), in its consumer span.
type consumer struct {
	e       *Engine
	workCtx context.Context
	one     func(ctx context.Context, d *transport.Delivery) transport.Outcome
}

func (c consumer) HandleDelivery(_ context.Context, d *transport.Delivery) transport.Outcome {
	return c.one(c.workCtx, d)
}

// batchConsumer is consumer as a transport.BatchHandler: it applies a batch
// of deliveries in one transaction (group commit).
type batchConsumer struct {
	consumer
	bp BatchProcessor
}

func (c batchConsumer) HandleBatch(_ context.Context, ds []*transport.Delivery) []transport.Outcome {
	return c.e.handleBatch(c.workCtx, c.bp, ds)
}

// handleBatch is the pipeline of a batch: each delivery has its consumer
// span; those that are new (not redelivered, within the payload limit) are
// applied together, and the others, the ones the processor defers and, when
// the batch's transaction fails, all of them go the way of one delivery.
func (e *Engine) handleBatch(ctx context.Context, bp BatchProcessor, ds []*transport.Delivery) []transport.Outcome {
	outs := make([]transport.Outcome, len(ds))
	ends := make([]func(telemetry.Handled), len(ds))
	ctxs := make([]context.Context, len(ds))
	var items []Item
	var at []int
	for i, d := range ds {
		ctxs[i], ends[i] = e.cfg.Telemetry.Begin(ctx, e.cfg.Component, e.cfg.DB.Schema(), d)
		if d.Redelivered || len(d.Payload) > e.cfg.MaxPayloadBytes {
			var h telemetry.Handled
			outs[i], h = e.handle(ctxs[i], d)
			ends[i](h)
			continue
		}
		items = append(items, Item{Ctx: ctxs[i], Delivery: d})
		at = append(at, i)
	}
	var results []Result
	err := errors.New("no batch")
	if len(items) > 1 {
		err = Retrying(ctx, func() error {
			var committed driver.Committed
			var err error
			results, committed, err = bp.ProcessBatch(ctx, items, e.relay.WriteLease())
			e.handOff(committed)
			return err
		})
	}
	applied := 0
	for _, r := range results {
		if !r.Defer && r.Failed == nil {
			applied++
		}
	}
	for k, i := range at {
		var h telemetry.Handled
		switch {
		case err != nil || results[k].Defer || errors.Is(results[k].Failed, driver.ErrConflict):
			// A deadlock or serialization failure of one item is run
			// again at once and not counted, as Process's are (Retrying).
			if len(items) > 1 && err != nil && k == 0 && ctx.Err() == nil {
				e.log.Debug("batch not applied; applying its deliveries one by one", "deliveries", len(items), "err", err)
			}
			outs[i], h = e.handle(ctxs[i], ds[i])
		case results[k].Failed != nil:
			// Items of a batch are first deliveries: this was attempt 1.
			outs[i], h = e.settle(ctxs[i], ds[i], Result{}, results[k].Failed)
		default:
			e.infraFailures.Store(0)
			outs[i], h = e.done(ctxs[i], ds[i], results[k])
			h.Attrs = append(h.Attrs, telemetry.AttrBatchCount.Int(applied))
		}
		ends[i](h)
	}
	return outs
}

// handle is the pipeline of one delivery. ctx is the engine's work context.
func (e *Engine) handle(ctx context.Context, d *transport.Delivery) (transport.Outcome, telemetry.Handled) {
	if len(d.Payload) > e.cfg.MaxPayloadBytes {
		return e.giveUp(ctx, d, &Poison{Class: telemetry.ReasonPayloadTooLarge, Code: CodePayloadTooLarge, Reason: fmt.Sprintf(
			"payload of %s %q is %d bytes, over the limit of %d bytes (MaxPayloadBytes)", d.Kind, d.Type, len(d.Payload), e.cfg.MaxPayloadBytes)})
	}
	failures := 0
	if d.Redelivered {
		// Only a redelivered message can have failed before: the first
		// delivery costs no lookup.
		a, err := e.cfg.DB.AttemptGet(ctx, d.MessageID)
		switch {
		case err == nil:
			failures = a.Attempts
			if failures >= e.cfg.Retry.MaxAttempts {
				return e.giveUp(ctx, d, &Poison{Class: telemetry.ReasonRetriesExhausted, Code: CodeDeadLettered,
					Reason: fmt.Sprintf("gave up after %d attempts: %s", failures, a.LastError)})
			}
		case !errors.Is(err, message.ErrNotFound):
			return e.infraRetry(ctx, d, err)
		}
	}
	res, err := e.process(ctx, d, failures+1)
	return e.settle(ctx, d, res, err)
}

// settle turns the result of processing d, or its failure err, into d's
// outcome: acknowledged, given up on, or retried (counting an attempt
// unless the database or a shutdown is to blame).
func (e *Engine) settle(ctx context.Context, d *transport.Delivery, res Result, err error) (transport.Outcome, telemetry.Handled) {
	var poison *Poison
	switch {
	case err == nil:
		e.infraFailures.Store(0)
		return e.done(ctx, d, res)
	case errors.As(err, &poison):
		return e.giveUp(ctx, d, poison)
	case ctx.Err() != nil:
		// Shutting down past the stop timeout: not the message's fault.
		e.log.Info("delivery cancelled by shutdown; it will be redelivered", logAttrs(d)...)
		return transport.Retry(0), telemetry.Handled{Outcome: telemetry.OutcomeRetry, Cause: telemetry.CauseShutdown, Err: err}
	case infraFailure(e.cfg.DB.InterpretError(err)):
		// The database is restarting or unreachable, or refuses the role
		// a privilege an operator has to grant: not the message's fault,
		// so it does not count against its attempts.
		return e.infraRetry(ctx, d, err)
	}
	return e.failed(ctx, d, err)
}

// infraFailure reports whether err, marked by the driver, is the
// database's failure rather than the message's: a connection lost or
// refused, or a privilege the role lacks.
func infraFailure(err error) bool {
	return errors.Is(err, driver.ErrConnection) || errors.Is(err, driver.ErrPrivilege)
}

// process runs Process, again at once while it fails with a serialization
// failure or a deadlock, each time under a fresh write-time lease of the
// relay, and hands the relay what each run's commits wrote.
func (e *Engine) process(ctx context.Context, d *transport.Delivery, attempt int) (res Result, err error) {
	err = Retrying(ctx, func() error {
		res, err = e.proc.Process(ctx, d, attempt, e.relay.WriteLease())
		e.handOff(res.Committed)
		return err
	})
	return res, err
}

// handOff gives the relay what committed transactions wrote to the outbox:
// the leased rows, to publish without a claim, and a wake-up for the
// others, which a claim must find.
func (e *Engine) handOff(c driver.Committed) {
	e.relay.Hand(c.Leased)
	if c.Unleased > 0 {
		e.relay.Wake()
	}
}

// Retrying runs fn, a transaction, and again at once, up to ConflictRetries
// more times, while it fails with a serialization failure or a deadlock
// (driver.ErrConflict) and ctx is not done. fn must be safe to run again: its
// transaction was rolled back.
func Retrying(ctx context.Context, fn func() error) error {
	for try := 0; ; try++ {
		err := fn()
		if err == nil || !errors.Is(err, driver.ErrConflict) || try >= ConflictRetries || ctx.Err() != nil {
			return err
		}
	}
}

// done finishes a delivery whose transaction committed.
func (e *Engine) done(ctx context.Context, d *transport.Delivery, res Result) (transport.Outcome, telemetry.Handled) {
	h := telemetry.Handled{Outcome: res.Outcome, Inbox: telemetry.InboxNew, Attrs: res.SpanAttrs}
	if res.Outcome == telemetry.OutcomeDuplicate {
		h.Inbox = telemetry.InboxDuplicate
		e.log.Info("duplicate message ignored", logAttrs(d)...)
		return transport.Ack(), h
	}
	if e.log.Enabled(ctx, slog.LevelDebug) {
		e.log.Debug("message processed", append(logAttrs(d), "outcome", res.Outcome, "note", res.Note)...)
	}
	return transport.Ack(), h
}

// failed handles a processing transaction that failed: the failure is
// counted in a statement of its own and the message retried with backoff,
// or given up on once its attempts are used up.
func (e *Engine) failed(ctx context.Context, d *transport.Delivery, cause error) (transport.Outcome, telemetry.Handled) {
	n, err := e.cfg.DB.AttemptRecord(ctx, &d.Envelope, cause.Error())
	if err != nil {
		e.log.Warn("processing failed and its attempt could not be recorded", append(logAttrs(d), "err", cause, "record_err", err)...)
		return e.infraRetry(ctx, d, nil)
	}
	if n >= e.cfg.Retry.MaxAttempts {
		return e.giveUp(ctx, d, &Poison{Class: telemetry.ReasonRetriesExhausted, Code: CodeDeadLettered,
			Reason: fmt.Sprintf("gave up after %d attempts: %v", n, cause)})
	}
	delay := retryDelay(e.cfg.Retry, n)
	e.log.Warn("processing failed; retrying", append(logAttrs(d), "delivery_attempt", n, "retry_in", delay, "err", cause)...)
	return transport.Retry(delay), telemetry.Handled{Outcome: telemetry.OutcomeRetry, Cause: telemetry.CauseHandler, Err: cause}
}

// giveUp gives d up on: the processor records and answers it, then it is
// dead-lettered. A message that another delivery processed meanwhile (a
// concurrent copy, or a commit reported as failed that went through) is
// acknowledged as the duplicate it is.
func (e *Engine) giveUp(ctx context.Context, d *transport.Delivery, p *Poison) (transport.Outcome, telemetry.Handled) {
	attrs := logAttrs(d)
	res, err := e.proc.GiveUp(ctx, d, p)
	switch {
	case err == nil && res.Outcome == telemetry.OutcomeDuplicate && !e.wasDeadLettered(ctx, d):
		e.log.Info("message given up on was processed by another delivery; acknowledged", attrs...)
		return transport.Ack(), telemetry.Handled{Outcome: telemetry.OutcomeDuplicate, Inbox: telemetry.InboxDuplicate}
	case err == nil:
		e.handOff(res.Committed)
	case errors.Is(err, driver.ErrDataRefused) && ctx.Err() == nil:
		// Postgres refuses the message's own data (text it cannot hold, a
		// step too long for the barrier's key): every retry would fail the
		// same way. It cannot be recorded nor answered, only dead-lettered.
		p = &Poison{Class: p.Class, Code: p.Code, Reason: p.Reason + " (not recorded nor answered: the database refuses the message)"}
		attrs = append(attrs, "err", err)
	default:
		return e.infraRetry(ctx, d, err)
	}
	e.log.Error("message dead-lettered", append(attrs, "reason", p.Reason, "reason_class", p.Class, "code", p.Code)...)
	h := telemetry.Handled{Outcome: telemetry.OutcomeDeadLetter, Reason: p.Class, Err: p}
	if err == nil {
		h.Inbox = telemetry.InboxNew
		if res.Outcome == telemetry.OutcomeDuplicate {
			h.Inbox = telemetry.InboxDuplicate
		}
	}
	return transport.DeadLetter(p.Reason), h
}

// wasDeadLettered reports whether an earlier delivery of d was given up on;
// a failure to read says yes, so that the message is dead-lettered again
// rather than dropped.
func (e *Engine) wasDeadLettered(ctx context.Context, d *transport.Delivery) bool {
	a, err := e.cfg.DB.AttemptGet(ctx, d.MessageID)
	if errors.Is(err, message.ErrNotFound) {
		return false
	}
	return err != nil || !a.DeadLetteredAt.IsZero()
}

// infraRetry retries a delivery that failed for want of the database,
// pacing such retries by the number of consecutive ones.
func (e *Engine) infraRetry(ctx context.Context, d *transport.Delivery, err error) (transport.Outcome, telemetry.Handled) {
	h := telemetry.Handled{Outcome: telemetry.OutcomeRetry, Cause: telemetry.CauseDatabase, Err: err}
	if ctx.Err() != nil {
		return transport.Retry(0), h
	}
	n := e.infraFailures.Add(1)
	delay := retryDelay(e.cfg.Retry, int(min(n, 64)))
	if err != nil {
		e.log.Warn("cannot process message; retrying", append(logAttrs(d), "retry_in", delay, "err", err)...)
	}
	// The database is down for every message: hold this one (and the
	// worker) for the delay, then put it back, rather than cycling the
	// whole backlog through the broker's retry queues.
	Pause(ctx, delay)
	return transport.Retry(0), h
}

// retryDelay is the delay before processing a message again after its
// failures-th failed attempt: the policy's exponential backoff, with jitter
// drawn uniformly from its upper half so that messages that failed together
// do not come back together.
func retryDelay(p saga.RetryPolicy, failures int) time.Duration {
	full := p.Backoff(max(failures, 1))
	half := full / 2
	if half <= 0 {
		return full
	}
	return half + rand.N(full-half+1)
}

func logAttrs(d *transport.Delivery) []any {
	if d.SagaType == "" {
		return []any{"message_id", d.MessageID.String(), "type", d.Type, "kind", string(d.Kind)}
	}
	return []any{"message_id", d.MessageID.String(), "saga_id", d.SagaID.String(), "saga_type", d.SagaType,
		"type", d.Type, "kind", string(d.Kind), "step", d.Step, "attempt", d.Attempt}
}
