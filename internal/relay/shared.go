package relay

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sagabox/sagabox/store/driver"
)

// wakeup is how a relay's workers learn of rows to publish: Wake announces
// rows committed for a claim, Hand (through signal) rows handed by their
// writers. One idle worker takes each wake-up; wake-ups that come while
// none is idle coalesce into one (a channel of capacity one, as River's
// producer debounces its fetches). A wake-up that no Wake followed since
// the latest claim began announced rows that claim saw: it is stale, and
// is dropped rather than claimed for again (an empty claim, a third of them
// under load).
type wakeup struct {
	c chan struct{}
	// wakes counts the calls of Wake; claimedUpTo is the count when the
	// latest claim began.
	wakes, claimedUpTo atomic.Uint64
}

func newWakeup() *wakeup { return &wakeup{c: make(chan struct{}, 1)} }

// announce counts a Wake and signals a worker.
func (w *wakeup) announce() {
	w.wakes.Add(1)
	w.signal()
}

// signal wakes an idle worker without announcing rows for a claim (rows
// handed to the relay). It never blocks.
func (w *wakeup) signal() {
	select {
	case w.c <- struct{}{}:
	default:
	}
}

// claimBegins records that a claim that sees every row announced so far
// begins.
func (w *wakeup) claimBegins() {
	for seen := w.wakes.Load(); ; {
		upTo := w.claimedUpTo.Load()
		if upTo >= seen || w.claimedUpTo.CompareAndSwap(upTo, seen) {
			return
		}
	}
}

// announced reports whether a Wake came since the latest claim began: rows
// no claim has looked for.
func (w *wakeup) announced() bool { return w.wakes.Load() > w.claimedUpTo.Load() }

// handoff holds rows written under the relay's write-time lease and
// committed (Relay.Hand), waiting for a worker to publish them without a
// claim: one group per transaction, taken whole, so that the rows of a key
// one transaction wrote go out in one batch, in order. One worker at a time
// publishes handed rows: those handed meanwhile wait for its confirms and
// go out together in its next batch, so that batches grow with the load, as
// claimed ones do.
type handoff struct {
	mu     sync.Mutex
	groups [][]driver.OutboxRow
	// busy is true while a worker publishes handed rows.
	busy atomic.Bool
}

// add hands rows, one transaction's, to the relay.
func (h *handoff) add(rows []driver.OutboxRow) {
	h.mu.Lock()
	h.groups = append(h.groups, rows)
	h.mu.Unlock()
}

// take takes handed rows, oldest first, in whole groups: up to max rows, or
// one group larger than that (all with 0).
func (h *handoff) take(max int) []driver.OutboxRow {
	h.mu.Lock()
	defer h.mu.Unlock()
	var rows []driver.OutboxRow
	n := 0
	for _, g := range h.groups {
		if max > 0 && len(rows) > 0 && len(rows)+len(g) > max {
			break
		}
		rows = append(rows, g...)
		n++
	}
	h.groups = slices.Delete(h.groups, 0, n)
	return rows
}

// pending reports whether handed rows wait for a worker.
func (h *handoff) pending() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.groups) > 0
}

// takeBatch makes the calling worker the one that publishes handed rows and
// takes up to max of them; it returns none, and stays no such worker, when
// another worker publishes handed rows or none wait. A worker that got rows
// calls done once they are published.
func (h *handoff) takeBatch(max int) []driver.OutboxRow {
	if !h.busy.CompareAndSwap(false, true) {
		return nil
	}
	rows := h.take(max)
	if len(rows) == 0 {
		h.busy.Store(false)
	}
	return rows
}

// done ends the publishing of a batch of handed rows.
func (h *handoff) done() { h.busy.Store(false) }

// confirmations holds the rows the relay's workers published (and the late
// sends among them) that no claim has settled yet. Whichever worker claims
// next settles them all, in its claim: a row never waits behind its key's
// previous row, published by another worker and not settled yet (a saga's
// next command after its reply), for that worker's own next claim.
type confirmations struct {
	mu      sync.Mutex
	settle  driver.OutboxSettle
	since   time.Time // when the oldest of settle was added
	inClaim []int64   // rows a claim is settling now (taken from settle)
}

// add hands the published rows of s (and their late sends) to the next
// claim of any worker.
func (c *confirmations) add(s driver.OutboxSettle) {
	if len(s.Published) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.settle.Published) == 0 {
		c.since = time.Now()
	}
	c.settle.Published = append(c.settle.Published, s.Published...)
	c.settle.Late = append(c.settle.Late, s.Late...)
}

// take takes the rows confirmed and not settled yet, for a claim; they are
// in its claim until done.
func (c *confirmations) take() driver.OutboxSettle {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.settle
	c.settle = driver.OutboxSettle{}
	c.inClaim = append(c.inClaim, s.Published...)
	return s
}

// done ends the claim that settled ids, or gave them back (add).
func (c *confirmations) done(ids []int64) {
	if len(ids) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.inClaim = slices.DeleteFunc(c.inClaim, func(id int64) bool { return slices.Contains(ids, id) })
}

// due reports whether rows confirmed at least delay ago, or max of them,
// wait to be settled: under a steady stream of handed rows no worker idles
// long enough to settle them otherwise.
func (c *confirmations) due(max int, delay time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(c.settle.Published)
	return n > 0 && (n >= max || time.Since(c.since) >= delay)
}

// pending reports whether rows confirmed wait for a claim to settle them.
func (c *confirmations) pending() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.settle.Published) > 0
}

// unsettled returns the rows published and not settled yet, those in a
// claim included: they do not hold a later row of their key back
// (driver.OutboxLease.Confirmed).
func (c *confirmations) unsettled() []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]int64, 0, len(c.settle.Published)+len(c.inClaim))
	return append(append(out, c.settle.Published...), c.inClaim...)
}
