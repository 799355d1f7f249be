// Package relay publishes committed outbox rows to the broker.
//
// Each worker of a relay claims unpublished rows in batches (FOR UPDATE SKIP
// LOCKED, one statement in a transaction of its own, which sets a lease),
// publishes them with pipelined publisher confirms outside of any
// transaction, and the confirmed rows are settled (deleted, or marked
// published) in the statement of the relay's next claim, whichever worker
// makes it: one committing statement per batch, and a key's next row is
// never held back behind its previous row, confirmed, until the worker that
// published it claims again. Rows that failed go back with a retry delay. A relay
// that dies after publishing and before settling leaves its rows leased; when
// the lease ends another relay publishes them again: delivery is
// at-least-once and receivers deduplicate. A key's rows are claimed in order
// (its first unpublished row first), so several relays never reorder one key,
// and a claim's cost is bounded by the batch, whatever the backlog.
//
// Rows the client's own deliveries write can skip the claim: written under
// the relay's write-time lease (WriteLease, driver.BeginOpts.Lease), they
// are claimed by the statement that inserts them, returned by the commit,
// and handed to the relay (Hand), and one worker at a time publishes them. A row whose key
// has an earlier unpublished row is written unleased, for a claim.
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
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store/driver"
	"github.com/sagabox/sagabox/transport"
)

// Defaults of Options.
const (
	DefaultBatchSize      = 200
	DefaultWorkers        = 2
	DefaultPollInterval   = time.Second
	DefaultLease          = 10 * time.Second
	DefaultPublishTimeout = 5 * time.Second
	// DefaultUnroutableAttempts is the default of
	// Options.UnroutableAttempts.
	DefaultUnroutableAttempts = 10
	// DefaultMinBackoff and DefaultMaxBackoff bound the wait after a failed
	// batch (broker or database down).
	DefaultMinBackoff = 100 * time.Millisecond
	DefaultMaxBackoff = 10 * time.Second
)

// Options tunes the relay a client runs to publish its outbox. Both clients
// take it as their Config.Relay.
type Options struct {
	// BatchSize is the most outbox rows published at once. Defaults to
	// DefaultBatchSize (200).
	BatchSize int
	// Workers is how many batches are in flight at once. Defaults to
	// DefaultWorkers (2).
	Workers int
	// PollInterval is the longest the relay waits before looking for rows
	// no wake-up announced: rows the client writes itself are published at
	// once. Defaults to DefaultPollInterval (1s).
	PollInterval time.Duration
	// Listen also wakes the relay on NOTIFY from other processes that write
	// to the same outbox (see Notify), over a connection of its own.
	// Defaults to false.
	Listen bool
	// Notify makes the messages this client writes in its callers'
	// transactions (orchestrator.Start, participant.Client.Publish) wake
	// the relays of other processes that Listen, with a NOTIFY in the same
	// transaction: for a process that writes but runs no relay of its own
	// (a web process that starts sagas). NOTIFY serialises the commits of
	// the transactions that send it. Defaults to false.
	Notify bool
	// Lease is how long rows claimed by a relay belong to it: after a crash
	// of its process, another relay publishes them once the lease ends, and,
	// since rows of one ordering key go out in order, later rows of the same
	// keys wait behind them. It must exceed PublishTimeout. Defaults to
	// DefaultLease (10s).
	Lease time.Duration
	// PublishTimeout bounds the wait for the broker's confirms of one batch.
	// Defaults to DefaultPublishTimeout (5s).
	PublishTimeout time.Duration
	// UnroutableAttempts is how many times a reply or an event that the
	// broker returns as unroutable (no queue is bound for it) is published
	// before it is given up on: set aside, dead, with the reason, visible in
	// the sagabox_outbox_dead_v view, `sagabox outbox dead` and the
	// sagabox.outbox.dead gauge, until an operator retries or deletes it.
	// Commands and compensations are retried for ever: their saga waits for
	// the participant's queue to exist. Defaults to
	// DefaultUnroutableAttempts (10, about 40 s of backoff).
	UnroutableAttempts int
	// Mode is how the relay finds committed rows: ModePoll (the default)
	// claims them from the outbox table; ModeLog reads their inserts from
	// PostgreSQL's write-ahead log through a logical replication slot (see
	// log.go and docs/operations.md). Workers, PollInterval, Listen and
	// Lease apply to ModePoll only.
	Mode Mode
	// Slot and Publication name the replication slot and the publication of
	// ModeLog. Default to LogNames of the schema.
	Slot, Publication string
}

// Mode is how a relay finds committed outbox rows.
type Mode string

// Modes of a relay.
const (
	// ModePoll claims unpublished rows from the outbox table.
	ModePoll Mode = "poll"
	// ModeLog streams the outbox's inserts from the write-ahead log
	// (logical replication, pgoutput), in commit order.
	ModeLog Mode = "log"
)

// WithDefaults returns a copy of o with every zero field set to its default.
func (o Options) WithDefaults() Options {
	if o.BatchSize == 0 {
		o.BatchSize = DefaultBatchSize
	}
	if o.Workers == 0 {
		o.Workers = DefaultWorkers
	}
	if o.PollInterval == 0 {
		o.PollInterval = DefaultPollInterval
	}
	if o.Lease == 0 {
		o.Lease = DefaultLease
	}
	if o.PublishTimeout == 0 {
		o.PublishTimeout = DefaultPublishTimeout
	}
	if o.UnroutableAttempts == 0 {
		o.UnroutableAttempts = DefaultUnroutableAttempts
	}
	if o.Mode == "" {
		o.Mode = ModePoll
	}
	return o
}

// Validate checks options that went through WithDefaults; its errors name
// the field at fault, as name.Field (name is where the options sit, e.g.
// "Relay").
func (o Options) Validate(name string) error {
	var errs []error
	f := func(format string, args ...any) { errs = append(errs, fmt.Errorf(name+"."+format, args...)) }
	if o.BatchSize < 1 {
		f("BatchSize %d is less than 1", o.BatchSize)
	}
	if o.Workers < 1 {
		f("Workers %d is less than 1", o.Workers)
	}
	if o.PollInterval < 0 {
		f("PollInterval %s is negative", o.PollInterval)
	}
	if o.PublishTimeout < 0 {
		f("PublishTimeout %s is negative", o.PublishTimeout)
	}
	if o.UnroutableAttempts < 1 {
		f("UnroutableAttempts %d is less than 1", o.UnroutableAttempts)
	}
	if o.Mode != ModePoll && o.Mode != ModeLog {
		f("Mode %q is neither %q nor %q", o.Mode, ModePoll, ModeLog)
	}
	if o.Lease <= o.PublishTimeout {
		f("Lease %s must exceed PublishTimeout %s", o.Lease, o.PublishTimeout)
	}
	return errors.Join(errs...)
}

// Relay publishes one schema's outbox.
type Relay struct {
	opts Options
	db   driver.Executor
	pub  transport.Publisher
	name string
	log  *slog.Logger
	// keepPublished marks published rows instead of deleting them; sagas
	// shifts the deadlines of steps whose commands were published late.
	keepPublished, sagas bool
	// wake announces rows to the workers; one idle worker takes each
	// wake-up: one claim per wake-up, not a claim by every worker (which, at
	// thousands of commits per second, costs more database time than the
	// publishing itself).
	wake *wakeup
	// confirmed are the rows the workers published and no claim settled
	// yet; handed the rows written under the relay's write-time lease
	// (WriteLease) and committed, for a worker to publish without a claim.
	confirmed confirmations
	handed    handoff
	// leasing is true while the workers run: rows leased at write are
	// published.
	leasing atomic.Bool

	// testHookAfterPublish, when set, runs after a batch was confirmed and
	// before it is marked published. Returning true makes the worker stop
	// right there, as a relay killed at that point would.
	testHookAfterPublish func(rows []driver.OutboxRow) (crash bool)
	// settleDelay is defaultSettleDelay; tests that count statements make
	// it long, so that no published batch is settled by the timer (the
	// rechecks after an empty claim keep recheckDelay).
	settleDelay time.Duration
}

// Schema says what the relay's schema keeps besides its outbox.
type Schema struct {
	// KeepPublished marks published rows (for retention to delete later)
	// instead of deleting them once confirmed.
	KeepPublished bool
	// Sagas: the schema holds sagas (an orchestrator's). A command or
	// compensation published more than LateSend after it was written
	// pushes its step's deadline back by that delay, in the statement that
	// settles it (driver.OutboxSettle.Late).
	Sagas bool
}

// LateSend is how long after it was written a saga message must be
// published for its step's deadline to be pushed back (Schema.Sagas):
// below it, the time the relay takes is part of the normal hop.
const LateSend = time.Second

// New returns a Relay that publishes db's outbox with pub. Telemetry, if
// any, is pub's: wrap it (telemetry.Telemetry.Publisher).
func New(db driver.Executor, pub transport.Publisher, opts Options, schema Schema, log *slog.Logger) (*Relay, error) {
	opts = opts.WithDefaults()
	if err := opts.Validate("Options"); err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	if db == nil || pub == nil {
		return nil, errors.New("relay: a store and a publisher are required")
	}
	if log == nil {
		log = slog.Default()
	}
	if opts.Slot == "" || opts.Publication == "" {
		slot, pub := LogNames(db.Schema())
		if opts.Slot == "" {
			opts.Slot = slot
		}
		if opts.Publication == "" {
			opts.Publication = pub
		}
	}
	host, _ := os.Hostname()
	return &Relay{
		opts:          opts,
		db:            db,
		pub:           pub,
		keepPublished: schema.KeepPublished,
		sagas:         schema.Sagas,
		name:          fmt.Sprintf("%s-%d-%s", host, os.Getpid(), uuid.NewString()[:8]),
		log:           log.With("component", "relay", "schema", db.Schema()),
		wake:          newWakeup(),
		settleDelay:   defaultSettleDelay,
	}, nil
}

// Wake makes an idle worker look for rows now (or the next worker to become
// idle, if all are busy). Call it after committing a transaction that wrote
// to the outbox. It never blocks.
func (r *Relay) Wake() { r.wake.announce() }

// Run publishes until ctx is cancelled, then lets batches in flight finish
// (marking what was confirmed) and returns nil.
func (r *Relay) Run(ctx context.Context) error {
	if r.opts.Mode == ModeLog {
		return r.runLog(ctx)
	}
	var wg sync.WaitGroup
	r.leasing.Store(true)
	for range r.opts.Workers {
		wg.Go(func() { newWorker(r).run(ctx) })
	}
	if r.opts.Listen {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.listen(ctx)
		}()
	}
	r.log.Info("relay started", "workers", r.opts.Workers, "batch_size", r.opts.BatchSize, "listen", r.opts.Listen)
	<-ctx.Done()
	r.leasing.Store(false)
	wg.Wait()
	r.log.Info("relay stopped")
	return nil
}

// unavailable reports whether the publisher knows its broker to be
// unreachable (transport.Availability).
func (r *Relay) unavailable() bool {
	a, ok := r.pub.(transport.Availability)
	return ok && !a.Unavailable().IsZero()
}

// maxRechecks bounds the short waits after empty claims that followed a
// wake-up (recheckDelay doubled each time: 50, 100, 200, 400 ms) before the
// worker waits for the poll.
const maxRechecks = 4

// recheckDelay is the first of those waits: about the time another
// worker's published batch waits to be settled (defaultSettleDelay).
const recheckDelay = defaultSettleDelay

// defaultSettleDelay is the longest a published batch waits to be settled
// by the claim that follows it.
const defaultSettleDelay = 50 * time.Millisecond

var errCrashed = errors.New("relay: simulated crash")

// claim settles settle and claims up to max rows, in one statement. The
// statement runs to completion even if ctx is cancelled meanwhile: a claim
// committed but reported as cancelled would leave its rows leased,
// unpublished, for a whole lease.
//
// It also settles the rows the relay's workers have confirmed and not
// settled yet (see Relay.confirmed); when the statement fails, they are
// kept for the next claim.
func (r *Relay) claim(ctx context.Context, max int, settle driver.OutboxSettle) ([]driver.OutboxRow, error) {
	claimCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if max >= r.opts.BatchSize {
		// A full claim (not a probe, not a settle alone) sees every row
		// announced so far; a batch it fills up wakes the relay again.
		r.wake.claimBegins()
	}
	shared := r.confirmed.take()
	if len(shared.Published) > 0 {
		settle.Published = append(slices.Clip(settle.Published), shared.Published...)
		settle.Late = append(slices.Clip(settle.Late), shared.Late...)
	}
	settle.KeepPublished = r.keepPublished
	rows, err := r.db.OutboxClaim(claimCtx, driver.OutboxClaimOpts{
		Max: max, Lease: r.opts.Lease, ClaimedBy: r.name, Settle: settle,
	})
	r.confirmed.done(shared.Published)
	if err != nil {
		r.confirmed.add(shared)
	}
	return rows, err
}

// WriteLease returns the write-time lease for the outbox rows of a
// transaction about to run (driver.BeginOpts.Lease): the rows it leases,
// which its Commit returns, are to be handed to this relay (Hand). It
// returns nil when rows are to be claimed instead: the relay reads the write-ahead log, is not running, or knows
// its broker to be unreachable; and while handed rows are being published
// or wait to be: under load, rows written meanwhile are claimed together,
// in batches, which the one worker publishing handed rows would send one
// or two at a time (measured at saturation: 5-10 % fewer sagas per second
// with every row leased).
func (r *Relay) WriteLease() *driver.OutboxLease {
	if r.opts.Mode != ModePoll || !r.leasing.Load() || r.unavailable() || r.handed.busy.Load() || r.handed.pending() {
		return nil
	}
	return &driver.OutboxLease{Lease: r.opts.Lease, ClaimedBy: r.name, Confirmed: r.confirmed.unsettled()}
}

// Hand gives the relay committed rows written under its lease
// (driver.Committed.Leased), for a worker to publish without a claim. It
// never blocks.
func (r *Relay) Hand(rows []driver.OutboxRow) {
	if len(rows) == 0 {
		return
	}
	r.handed.add(rows)
	r.wake.signal()
}

// publish publishes claimed rows and returns how to settle them: the
// confirmed ones are published, the others are claimable again after a
// backoff. It returns the publish error when some were not confirmed.
func (r *Relay) publish(ctx context.Context, rows []driver.OutboxRow) (driver.OutboxSettle, error) {
	msgs := make([]message.Message, len(rows))
	for i, row := range rows {
		msgs[i] = row.Message
	}
	// Rows are claimed: from here on finish the batch even if ctx is
	// cancelled, so a clean shutdown leaves nothing leased.
	pubCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.opts.PublishTimeout)
	defer cancel()
	pubErr := r.pub.Publish(pubCtx, msgs...)
	confirmed := transport.Confirmed(len(msgs), pubErr)
	if r.testHookAfterPublish != nil && r.testHookAfterPublish(rows) {
		return driver.OutboxSettle{}, errCrashed
	}
	settle := driver.OutboxSettle{Cause: pubErr}
	var perr *transport.PublishError
	errors.As(pubErr, &perr)
	now := time.Now()
	for i, row := range rows {
		switch {
		case confirmed[i]:
			settle.Published = append(settle.Published, row.ID)
			if m := row.Message; r.sagas && m.Kind.Phase() != "" && now.Sub(m.CreatedAt) > LateSend {
				settle.Late = append(settle.Late, driver.LateSend{
					SagaID: m.SagaID, StepIndex: m.StepIndex, Phase: m.Kind.Phase(), Attempt: m.Attempt, Delay: now.Sub(m.CreatedAt),
				})
			}
		case r.givesUp(row, messageErr(pubErr, perr, i)):
			reason := fmt.Sprintf("unroutable after %d attempts: %v", row.PublishAttempts, messageErr(pubErr, perr, i))
			r.log.Warn("relay gave up on a message no queue takes; it is kept as dead (sagabox_outbox_dead_v, `sagabox outbox dead`)",
				"message_id", row.Message.MessageID, "kind", row.Message.Kind, "type", row.Message.Type, "routing_key", row.Message.RoutingKey,
				"saga_id", row.Message.SagaID, "attempts", row.PublishAttempts)
			settle.Dead = append(settle.Dead, driver.DeadRow{ID: row.ID, Reason: reason})
		default:
			settle.Failed = append(settle.Failed, row.ID)
		}
	}
	if r.log.Enabled(ctx, slog.LevelDebug) {
		for i, row := range rows {
			if confirmed[i] {
				r.log.Debug("published", "message_id", row.Message.MessageID, "saga_id", row.Message.SagaID, "type", row.Message.Type)
			}
		}
	}
	if len(settle.Failed) > 0 {
		settle.RetryAfter = backoff(DefaultMinBackoff, DefaultMaxBackoff, rows[0].PublishAttempts)
		return settle, fmt.Errorf("%d of %d messages not confirmed: %w", len(settle.Failed), len(rows), pubErr)
	}
	return settle, nil
}

// messageErr returns the error of message i of a batch whose publish
// returned err (perr, when it is a *transport.PublishError).
func messageErr(err error, perr *transport.PublishError, i int) error {
	if perr != nil {
		if e, ok := perr.Failed[i]; ok {
			return e
		}
	}
	return err
}

// givesUp reports whether row, not confirmed because of err, is given up
// on: a reply or an event that no queue takes, published
// UnroutableAttempts times.
func (r *Relay) givesUp(row driver.OutboxRow, err error) bool {
	if !errors.Is(err, transport.ErrUnroutable) || row.PublishAttempts < r.opts.UnroutableAttempts {
		return false
	}
	return row.Message.Kind.IsReply() || row.Message.Kind == message.KindEvent
}

// listen wakes the workers on NOTIFY, reconnecting with backoff. Every
// (re)connect wakes them too, so nothing sent while disconnected waits for
// the poll.
func (r *Relay) listen(ctx context.Context) {
	failures := 0
	for {
		err := r.db.OutboxListen(ctx, func() {
			failures = 0
			r.Wake()
		})
		if ctx.Err() != nil {
			return
		}
		failures++
		wait := backoff(DefaultMinBackoff, DefaultMaxBackoff, failures)
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
