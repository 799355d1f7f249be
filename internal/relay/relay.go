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
	// wake hands a wake-up to one idle worker: one claim per wake-up, not a
	// claim by every worker (which, at thousands of commits per second,
	// costs more database time than the publishing itself).
	wake chan struct{}

	// confirmed holds the rows this relay's workers published (and the
	// late sends among them) that no claim has settled yet. Whichever
	// worker claims next settles them all, in its claim: a row never
	// waits behind its key's previous row, published by another worker and
	// not settled yet (a saga's next command after its reply), for that
	// worker's own next claim.
	confirmedMu sync.Mutex
	confirmed   driver.OutboxSettle
	// confirmedAt is when the oldest of confirmed was added; settling
	// holds the rows a claim is settling now (taken from confirmed): both
	// are named to writers as not holding their keys back
	// (driver.OutboxLease.Confirmed).
	confirmedAt time.Time
	settling    []int64

	// handed are rows written under this relay's write-time lease
	// (WriteLease) and committed, waiting for a worker to publish them
	// without a claim: one group per transaction, taken whole, so that the
	// rows of a key one transaction wrote go out in one batch, in order.
	handedMu sync.Mutex
	handed   [][]driver.OutboxRow
	// leasing is true while the workers run: rows leased at write are
	// published. handing is true while a worker publishes handed rows.
	leasing, handing atomic.Bool

	// wakes counts the calls of Wake; claimedUpTo is the count when the
	// latest claim began. A wake-up that no Wake followed since a claim
	// began announced rows that claim sees (they committed before Wake was
	// called, so before the claim's snapshot): it is dropped, not claimed
	// for again (an empty claim, under load a third of them).
	wakes, claimedUpTo atomic.Uint64

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
		wake:          make(chan struct{}, 1),
		settleDelay:   defaultSettleDelay,
	}, nil
}

// Wake makes an idle worker look for rows now (or the next worker to become
// idle, if all are busy). Call it after committing a transaction that wrote
// to the outbox. It never blocks.
func (r *Relay) Wake() {
	r.wakes.Add(1)
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Run publishes until ctx is cancelled, then lets batches in flight finish
// (marking what was confirmed) and returns nil.
func (r *Relay) Run(ctx context.Context) error {
	if r.opts.Mode == ModeLog {
		return r.runLog(ctx)
	}
	var wg sync.WaitGroup
	r.leasing.Store(true)
	for range r.opts.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.work(ctx)
		}()
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

// work is one worker: it claims a batch, publishes it and settles it in
// the statement that claims its next batch, until ctx is cancelled; then it
// settles what it published.
func (r *Relay) work(ctx context.Context) {
	poll := time.NewTimer(0)
	defer poll.Stop()
	var settle driver.OutboxSettle
	defer func() {
		// A batch published but not settled yet is settled on the way out,
		// and rows handed and not published are released, claimable at
		// once, so a clean shutdown leaves nothing leased.
		for _, row := range r.takeHanded(0) {
			settle.Failed = append(settle.Failed, row.ID)
			settle.RetryAfter = 0
		}
		if !settle.Empty() || r.unsettled() {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if _, err := r.claim(sctx, 0, settle); err != nil {
				r.log.Warn("relay could not settle its last batch; its rows are published again after their lease", "err", err)
			}
		}
	}()
	failures := 0
	// rechecks counts the short waits after empty claims that followed a
	// wake-up: a row announced by a wake-up can be missed by the claim it
	// triggers (it waits behind an earlier row of its key that another
	// worker has published but not settled yet, and that worker's own claim
	// skipped it, locked by this one's), so the worker looks again soon, a
	// few times, before it falls back to the poll.
	rechecks, woken := 0, false
	for ctx.Err() == nil {
		// A relay that knows its broker to be unreachable claims one row,
		// a probe whose failure is counted and backs the worker off, not a
		// batch: the rows it would hold under its lease are for relays that
		// can publish (in other processes). The probe's row is released at
		// once (claimable again without delay), so that it is not kept
		// from them either.
		max, probing := r.opts.BatchSize, r.unavailable()
		if probing {
			max = 1
		}
		// Rows handed by their writers go out without a claim, unless the
		// worker has a failed batch to record, or rows confirmed a while
		// ago wait to be settled (the claim settles them, and takes what
		// was written unleased meanwhile). One worker at a time publishes
		// handed rows: those handed meanwhile wait for its confirms and go
		// out together in its next batch, so that batches grow with the
		// load, as claimed ones do.
		var rows []driver.OutboxRow
		var err error
		handing := false
		mayHand := !probing && settle.Empty() && !r.settleDue()
		if mayHand && r.handing.CompareAndSwap(false, true) {
			if rows = r.takeHanded(r.opts.BatchSize); len(rows) > 0 {
				handing = true
			} else {
				r.handing.Store(false)
			}
		}
		// announced: a Wake since the latest claim began announced rows
		// for a claim (a wake-up that only handed rows announced none).
		announced := r.wakes.Load() > r.claimedUpTo.Load()
		if len(rows) == 0 && mayHand && !announced && r.hasHanded() {
			// Another worker is publishing handed rows and takes these
			// next: nothing to claim for.
			var ok bool
			if woken, ok = r.idle(ctx, poll, min(r.settleDelay, r.opts.PollInterval), false); !ok {
				return
			}
			continue
		}
		if len(rows) == 0 {
			rows, err = r.claim(ctx, max, settle)
		}
		if err != nil {
			failures++
			wait := backoff(DefaultMinBackoff, DefaultMaxBackoff, failures)
			r.log.Warn("relay claim failed; backing off", "err", err, "retry_in", wait, "failures", failures)
			// settle is kept: it is recorded by the next claim (until the
			// lease ends, its rows are claimed by nobody).
			if !sleep(ctx, poll, wait) {
				return
			}
			continue
		}
		settle = driver.OutboxSettle{KeepPublished: r.keepPublished}
		if len(rows) == 0 && !probing && r.hasHanded() {
			// A claim that settled what was due, where handed rows wait:
			// their wake-up was this one.
			continue
		}
		if len(rows) == 0 {
			wait := r.opts.PollInterval
			if woken && (announced || rechecks > 0) && rechecks < maxRechecks {
				wait = min(recheckDelay<<rechecks, r.opts.PollInterval)
				rechecks++
			} else {
				rechecks = 0
			}
			var ok bool
			if woken, ok = r.idle(ctx, poll, wait, failures > 0); !ok {
				return
			}
			woken = woken || (rechecks > 0 && wait < r.opts.PollInterval)
			continue
		}
		rechecks = 0
		var pubErr error
		settle, pubErr = r.publish(ctx, rows)
		if handing {
			r.handing.Store(false)
		}
		if errors.Is(pubErr, errCrashed) {
			settle = driver.OutboxSettle{}
			return
		}
		if pubErr != nil {
			// The rows not confirmed are claimable again RetryAfter after
			// they are settled: settle them now and wait that long, so that
			// the next claim finds them (were they settled by that claim,
			// it could not take them, and they would wait for the poll).
			failures++
			wait := settle.RetryAfter
			if probing {
				settle.RetryAfter = 0
				wait = min(backoff(DefaultMinBackoff, DefaultMaxBackoff, failures), r.opts.PollInterval)
			}
			r.log.Warn("relay batch not confirmed; backing off", "err", pubErr, "retry_in", wait, "failures", failures)
			if _, err := r.claim(ctx, 0, settle); err == nil {
				settle = driver.OutboxSettle{KeepPublished: r.keepPublished}
			}
			if !sleep(ctx, poll, wait) {
				return
			}
			continue
		}
		failures = 0
		// Every row was confirmed, or given up on: whichever worker claims
		// next settles the confirmed ones. Rows given up on are recorded
		// now, as a failed batch's are: left leased, they would be
		// published again when their lease ends, and given up on again.
		r.addConfirmed(settle)
		next := driver.OutboxSettle{KeepPublished: r.keepPublished}
		if len(settle.Dead) > 0 {
			next.Dead = settle.Dead
			if _, err := r.claim(ctx, 0, next); err == nil {
				next.Dead = nil
			}
		}
		settle = next
		if len(rows) == r.opts.BatchSize {
			r.Wake() // more rows are likely waiting: bring in another worker
			continue
		}
		if handing && r.hasHanded() {
			continue // handed while this batch was out: the next batch
		}
		// A short batch: the backlog is drained. Its settle waits for the
		// next claim, which the next wake-up brings (soon, under load), so
		// that a claim both settles and claims; when none comes within
		// settleDelay, the worker settles on its own (unless another
		// worker's claim did meanwhile).
		var ok bool
		if woken, ok = r.idle(ctx, poll, min(r.settleDelay, r.opts.PollInterval), false); !ok {
			return
		}
		for !woken && !r.unsettled() {
			// Settled by another worker's claim: nothing to claim for.
			if woken, ok = r.idle(ctx, poll, r.opts.PollInterval, false); !ok {
				return
			}
			if !woken {
				break // the poll
			}
		}
	}
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

// idle waits for a wake-up, or wait; after a failure a wake-up does not cut
// the wait short (the broker or database is still likely down). It reports
// whether a wake-up ended the wait, and false for ok once ctx is done.
func (r *Relay) idle(ctx context.Context, poll *time.Timer, wait time.Duration, failing bool) (woken, ok bool) {
	poll.Reset(wait)
	select {
	case <-ctx.Done():
		return false, false
	case <-r.wake:
		if failing {
			return true, sleep(ctx, poll, 0)
		}
		if r.wakes.Load() <= r.claimedUpTo.Load() && !r.hasHanded() {
			// A claim began after this wake-up's Wake: it saw those rows.
			return r.idleOn(ctx, poll)
		}
		// Since Go 1.23 a timer's channel holds no stale value once Stop
		// returns: nothing to drain.
		poll.Stop()
		return true, true
	case <-poll.C:
		return false, true
	}
}

// idleOn waits on for a wake-up or the running poll timer, as idle does
// without a failure, once a wake-up was dropped.
func (r *Relay) idleOn(ctx context.Context, poll *time.Timer) (woken, ok bool) {
	for {
		select {
		case <-ctx.Done():
			return false, false
		case <-r.wake:
			if r.wakes.Load() <= r.claimedUpTo.Load() && !r.hasHanded() {
				continue
			}
			poll.Stop()
			return true, true
		case <-poll.C:
			return false, true
		}
	}
}

// sleep waits for poll, reset to wait unless wait is 0 (it is running
// already), or for ctx. It reports false once ctx is done.
func sleep(ctx context.Context, poll *time.Timer, wait time.Duration) bool {
	if wait > 0 {
		poll.Reset(wait)
	}
	select {
	case <-ctx.Done():
		return false
	case <-poll.C:
		return true
	}
}

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
		for seen := r.wakes.Load(); ; {
			upTo := r.claimedUpTo.Load()
			if upTo >= seen || r.claimedUpTo.CompareAndSwap(upTo, seen) {
				break
			}
		}
	}
	shared := r.takeConfirmed()
	if len(shared.Published) > 0 {
		settle.Published = append(slices.Clip(settle.Published), shared.Published...)
		settle.Late = append(slices.Clip(settle.Late), shared.Late...)
	}
	rows, err := r.db.OutboxClaim(claimCtx, driver.OutboxClaimOpts{
		Max: max, Lease: r.opts.Lease, ClaimedBy: r.name, Settle: settle,
	})
	r.doneSettling(shared.Published)
	if err != nil {
		r.addConfirmed(shared)
	}
	return rows, err
}

// addConfirmed hands the published rows of settle (and their late sends)
// to the next claim of any worker.
func (r *Relay) addConfirmed(settle driver.OutboxSettle) {
	if len(settle.Published) == 0 {
		return
	}
	r.confirmedMu.Lock()
	if len(r.confirmed.Published) == 0 {
		r.confirmedAt = time.Now()
	}
	r.confirmed.Published = append(r.confirmed.Published, settle.Published...)
	r.confirmed.Late = append(r.confirmed.Late, settle.Late...)
	r.confirmedMu.Unlock()
}

// takeConfirmed takes the rows confirmed and not settled yet; they are
// settling until doneSettling.
func (r *Relay) takeConfirmed() driver.OutboxSettle {
	r.confirmedMu.Lock()
	defer r.confirmedMu.Unlock()
	c := r.confirmed
	r.confirmed = driver.OutboxSettle{}
	r.settling = append(r.settling, c.Published...)
	return c
}

// doneSettling ends the settling of ids, which a claim settled or gave
// back to confirmed.
func (r *Relay) doneSettling(ids []int64) {
	if len(ids) == 0 {
		return
	}
	r.confirmedMu.Lock()
	defer r.confirmedMu.Unlock()
	r.settling = slices.DeleteFunc(r.settling, func(id int64) bool { return slices.Contains(ids, id) })
}

// settleDue reports whether rows confirmed at least settleDelay ago, or a
// batch's worth of them, wait to be settled: under a steady stream of
// handed rows no worker idles long enough to settle them otherwise.
func (r *Relay) settleDue() bool {
	r.confirmedMu.Lock()
	defer r.confirmedMu.Unlock()
	n := len(r.confirmed.Published)
	return n > 0 && (n >= r.opts.BatchSize || time.Since(r.confirmedAt) >= r.settleDelay)
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
	if r.opts.Mode != ModePoll || !r.leasing.Load() || r.unavailable() || r.handing.Load() || r.hasHanded() {
		return nil
	}
	r.confirmedMu.Lock()
	confirmed := make([]int64, 0, len(r.confirmed.Published)+len(r.settling))
	confirmed = append(append(confirmed, r.confirmed.Published...), r.settling...)
	r.confirmedMu.Unlock()
	return &driver.OutboxLease{Lease: r.opts.Lease, ClaimedBy: r.name, Confirmed: confirmed}
}

// Hand gives the relay committed rows written under its lease, for a worker
// to publish without a claim. It never blocks.
func (r *Relay) Hand(rows []driver.OutboxRow) {
	if len(rows) == 0 {
		return
	}
	r.handedMu.Lock()
	r.handed = append(r.handed, rows)
	r.handedMu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// takeHanded takes handed rows, oldest first, in whole groups: up to max
// rows, or one group larger than that (all with 0).
func (r *Relay) takeHanded(max int) []driver.OutboxRow {
	r.handedMu.Lock()
	defer r.handedMu.Unlock()
	var rows []driver.OutboxRow
	n := 0
	for _, g := range r.handed {
		if max > 0 && len(rows) > 0 && len(rows)+len(g) > max {
			break
		}
		rows = append(rows, g...)
		n++
	}
	r.handed = slices.Delete(r.handed, 0, n)
	return rows
}

// hasHanded reports whether handed rows wait for a worker.
func (r *Relay) hasHanded() bool {
	r.handedMu.Lock()
	defer r.handedMu.Unlock()
	return len(r.handed) > 0
}

// unsettled reports whether rows confirmed wait for a claim to settle them.
func (r *Relay) unsettled() bool {
	r.confirmedMu.Lock()
	defer r.confirmedMu.Unlock()
	return len(r.confirmed.Published) > 0
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
	settle := driver.OutboxSettle{KeepPublished: r.keepPublished, Cause: pubErr}
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
		err := r.db.Listen(ctx, func() {
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
