package relay

import (
	"context"
	"errors"
	"time"

	"github.com/sagabox/sagabox/store/driver"
)

// worker is one of a polling relay's workers. Each turn (step) it takes
// its next batch (rows handed by their writers, or a claim), publishes it
// and settles it, or idles until there is work; while the broker is known
// to be down it probes with one row instead. The rows it confirmed are
// settled by the next claim of any worker (confirmations); what the broker
// did not take (failed rows, rows given up on) it records itself.
type worker struct {
	r     *Relay
	timer *time.Timer
	// outcome is what this worker's last batch left to record: its failed
	// rows (claimable again after a delay) and the rows it gave up on. It
	// goes out with the worker's next claim.
	outcome driver.OutboxSettle
	// failures counts consecutive failed claims and batches: it paces the
	// backoff.
	failures int
	// rechecks counts the short waits after empty claims that followed a
	// wake-up, woken says the last wait ended with one, and announced that
	// the last claim looked for rows a Wake announced (see idleUntilWork).
	rechecks  int
	woken     bool
	announced bool
}

func newWorker(r *Relay) *worker {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &worker{r: r, timer: t}
}

// run runs turns until ctx is cancelled, then settles what the worker
// published and releases the handed rows it did not publish.
func (w *worker) run(ctx context.Context) {
	defer w.timer.Stop()
	defer w.stop(ctx)
	for ctx.Err() == nil && w.step(ctx) {
	}
}

// step runs one turn of the worker, and reports false when ctx ended or
// the worker crashed (a test hook).
func (w *worker) step(ctx context.Context) bool {
	if w.r.unavailable() {
		return w.probe(ctx)
	}
	rows, handed, err := w.nextBatch(ctx)
	switch {
	case errors.Is(err, errHandedElsewhere):
		return w.idle(ctx, min(w.r.settleDelay, w.r.opts.PollInterval), false)
	case err != nil:
		return w.backOff(ctx, "relay claim failed; backing off", err)
	case len(rows) == 0 && w.r.handed.pending():
		return true // the claim settled what was due; handed rows wait
	case len(rows) == 0:
		return w.idleUntilWork(ctx)
	}
	w.rechecks = 0
	outcome, err := w.r.publish(ctx, rows)
	if handed {
		w.r.handed.done()
	}
	switch {
	case errors.Is(err, errCrashed):
		w.outcome = driver.OutboxSettle{}
		return false
	case err != nil:
		return w.retryLater(ctx, outcome, err, outcome.RetryAfter)
	}
	w.settle(ctx, outcome)
	return w.afterBatch(ctx, len(rows), handed)
}

// errHandedElsewhere is nextBatch's answer when another worker publishes
// handed rows and this one has nothing to claim for: those rows are that
// worker's next batch.
var errHandedElsewhere = errors.New("relay: handed rows are another worker's")

// nextBatch returns the worker's next batch: rows handed by their writers,
// unless the worker has an outcome to record or confirmed rows are due to
// be settled (a claim does both, and takes what was written unleased
// meanwhile), or a claim's rows, settling what is due.
func (w *worker) nextBatch(ctx context.Context) (rows []driver.OutboxRow, handed bool, err error) {
	r := w.r
	mayHand := w.outcome.Empty() && !r.confirmed.due(r.opts.BatchSize, r.settleDelay)
	if mayHand {
		if rows = r.handed.takeBatch(r.opts.BatchSize); len(rows) > 0 {
			return rows, true, nil
		}
	}
	w.announced = r.wake.announced()
	if mayHand && !w.announced && r.handed.pending() {
		return nil, false, errHandedElsewhere
	}
	rows, err = w.claim(ctx, r.opts.BatchSize)
	return rows, false, err
}

// claim settles the worker's outcome (and the relay's confirmations) and
// claims up to max rows, in one statement. On success the outcome is
// recorded; on failure it is kept for the next claim (until the lease
// ends, its rows are claimed by nobody).
func (w *worker) claim(ctx context.Context, max int) ([]driver.OutboxRow, error) {
	rows, err := w.r.claim(ctx, max, w.outcome)
	if err == nil {
		w.outcome = driver.OutboxSettle{}
	}
	return rows, err
}

// settle records a confirmed batch: its published rows go to the next
// claim of any worker; the rows given up on are recorded at once (left
// leased, they would be published again when their lease ends, and given
// up on again), or with the worker's next claim when that fails.
func (w *worker) settle(ctx context.Context, outcome driver.OutboxSettle) {
	w.failures = 0
	w.r.confirmed.add(outcome)
	if len(outcome.Dead) == 0 {
		return
	}
	w.outcome = driver.OutboxSettle{Dead: outcome.Dead}
	_, _ = w.claim(ctx, 0)
}

// afterBatch decides what follows a confirmed batch of n rows: a full batch
// brings in another worker (more rows are likely waiting) and claims
// again; rows handed meanwhile are the next batch; a short batch means the
// backlog is drained, and its settle waits for the next claim, which the
// next wake-up brings (soon, under load), so that one statement both
// settles and claims; when none comes within settleDelay, the worker
// settles on its own (unless another worker's claim did meanwhile).
func (w *worker) afterBatch(ctx context.Context, n int, handed bool) bool {
	r := w.r
	if n == r.opts.BatchSize {
		r.Wake()
		return true
	}
	if handed && r.handed.pending() {
		return true
	}
	if !w.idle(ctx, min(r.settleDelay, r.opts.PollInterval), false) {
		return false
	}
	for !w.woken && !r.confirmed.pending() {
		// Settled by another worker's claim: nothing to claim for.
		if !w.idle(ctx, r.opts.PollInterval, false) {
			return false
		}
		if !w.woken {
			break // the poll
		}
	}
	return true
}

// retryLater records a batch the broker did not (wholly) confirm: its
// unconfirmed rows are claimable again after wait, so they are settled now
// and the worker waits that long (were they settled by its next claim, that
// claim could not take them, and they would wait for the poll).
func (w *worker) retryLater(ctx context.Context, outcome driver.OutboxSettle, err error, wait time.Duration) bool {
	w.failures++
	w.r.log.Warn("relay batch not confirmed; backing off", "err", err, "retry_in", wait, "failures", w.failures)
	w.outcome = outcome
	_, _ = w.claim(ctx, 0)
	return w.sleep(ctx, wait)
}

// probe is the worker's turn while the publisher knows its broker to be
// unreachable: it claims one row, a probe whose failure is counted and
// backs the worker off, not a batch: the rows it would hold under its
// lease are for relays that can publish (in other processes). The probe's
// row is released at once (claimable again without delay), so that it is
// not kept from them either.
func (w *worker) probe(ctx context.Context) bool {
	w.announced = w.r.wake.announced()
	rows, err := w.claim(ctx, 1)
	switch {
	case err != nil:
		return w.backOff(ctx, "relay claim failed; backing off", err)
	case len(rows) == 0:
		return w.idleUntilWork(ctx)
	}
	w.rechecks = 0
	outcome, err := w.r.publish(ctx, rows)
	switch {
	case errors.Is(err, errCrashed):
		w.outcome = driver.OutboxSettle{}
		return false
	case err != nil:
		outcome.RetryAfter = 0
		return w.retryLater(ctx, outcome, err, min(backoff(DefaultMinBackoff, DefaultMaxBackoff, w.failures+1), w.r.opts.PollInterval))
	}
	w.settle(ctx, outcome)
	return w.afterBatch(ctx, len(rows), false)
}

// idleUntilWork waits after an empty claim. A row announced by a wake-up
// can be missed by the claim it triggers (it waits behind an earlier row of
// its key that another worker has published but not settled yet, and that
// worker's own claim skipped it, locked by this one's), so after a wake-up
// the worker looks again soon, a few times (recheckDelay doubled each
// time), before it falls back to the poll.
func (w *worker) idleUntilWork(ctx context.Context) bool {
	r := w.r
	wait := r.opts.PollInterval
	if w.woken && (w.announced || w.rechecks > 0) && w.rechecks < maxRechecks {
		wait = min(recheckDelay<<w.rechecks, r.opts.PollInterval)
		w.rechecks++
	} else {
		w.rechecks = 0
	}
	if !w.idle(ctx, wait, w.failures > 0) {
		return false
	}
	w.woken = w.woken || (w.rechecks > 0 && wait < r.opts.PollInterval)
	return true
}

// backOff counts a failed claim and waits its backoff. The worker's
// outcome is kept: the next claim records it.
func (w *worker) backOff(ctx context.Context, msg string, err error) bool {
	w.failures++
	wait := backoff(DefaultMinBackoff, DefaultMaxBackoff, w.failures)
	w.r.log.Warn(msg, "err", err, "retry_in", wait, "failures", w.failures)
	return w.sleep(ctx, wait)
}

// idle waits for a wake-up, or wait; when failing a wake-up does not cut
// the wait short (the broker or database is still likely down). A stale
// wake-up (see wakeup) is dropped and the wait goes on. It sets w.woken to
// whether a wake-up ended the wait, and reports false once ctx is done.
func (w *worker) idle(ctx context.Context, wait time.Duration, failing bool) bool {
	r := w.r
	w.timer.Reset(wait)
	for {
		select {
		case <-ctx.Done():
			return false
		case <-r.wake.c:
			if failing {
				w.woken = true
				return w.sleep(ctx, 0)
			}
			if !r.wake.announced() && !r.handed.pending() {
				continue // a claim began after this wake-up's Wake: it saw those rows
			}
			// Since Go 1.23 a timer's channel holds no stale value once
			// Stop returns: nothing to drain.
			w.timer.Stop()
			w.woken = true
			return true
		case <-w.timer.C:
			w.woken = false
			return true
		}
	}
}

// sleep waits for the worker's timer, reset to wait unless wait is 0 (it
// is running already), or for ctx. It reports false once ctx is done.
func (w *worker) sleep(ctx context.Context, wait time.Duration) bool {
	if wait > 0 {
		w.timer.Reset(wait)
	}
	select {
	case <-ctx.Done():
		return false
	case <-w.timer.C:
		return true
	}
}

// stop settles, on the way out, what the worker published and did not
// settle yet, and releases the handed rows no worker published (claimable
// at once), so that a clean shutdown leaves nothing leased.
func (w *worker) stop(ctx context.Context) {
	r := w.r
	for _, row := range r.handed.take(0) {
		w.outcome.Failed = append(w.outcome.Failed, row.ID)
		w.outcome.RetryAfter = 0
	}
	if w.outcome.Empty() && !r.confirmed.pending() {
		return
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if _, err := r.claim(sctx, 0, w.outcome); err != nil {
		r.log.Warn("relay could not settle its last batch; its rows are published again after their lease", "err", err)
	}
}
