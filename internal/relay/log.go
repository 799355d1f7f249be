package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/sagabox/sagabox/store/driver"
)

// Log mode (Options.Mode = ModeLog): instead of claiming rows, the relay
// reads the outbox's inserts from PostgreSQL's write-ahead log through a
// logical replication slot (pgoutput over a replication connection of its
// own), in commit order, and publishes them with the same publisher and
// confirms as the polling relay. Once a batch is confirmed it settles it in
// one statement (the confirmed rows are deleted, or marked published for
// retention; those given up on are set aside as dead), then moves the
// slot's confirmed position past it. Nothing is confirmed past a message the
// broker did not confirm: a relay that dies anywhere leaves the slot at its
// last confirmed position, and the next reader streams again from there
// (duplicates, never loss). A transaction's rows go out in order, and
// transactions in commit order, so one key's rows keep their order.
//
// A slot has one reader at a time: the server refuses a second one while the
// first holds it. A relay refused stands by, trying again every
// PollInterval, and takes over once the reader's connection is gone (its
// process died, or stopped).

// LogNames returns the replication slot and the publication of schema's
// outbox in log mode: both "sagabox_<schema>" (driver.LogNames).
func LogNames(schema string) (slot, publication string) { return driver.LogNames(schema) }

// LogSlot returns the replication slot and publication of a relay in log
// mode, and false for ok in polling mode.
func (r *Relay) LogSlot() (slot, publication string, ok bool) {
	return r.opts.Slot, r.opts.Publication, r.opts.Mode == ModeLog
}

// Check verifies, for a relay in log mode, that the server can stream the
// outbox: wal_level is logical, and the slot and publication exist. Its
// error says what to change. A database it cannot reach is not an error
// here: the relay waits for it.
func (r *Relay) Check(ctx context.Context) error {
	if r.opts.Mode != ModeLog {
		return nil
	}
	st, err := r.db.OutboxLogStatus(ctx, r.opts.Slot, r.opts.Publication)
	if err != nil {
		r.log.Warn("relay could not check its replication slot; it retries", "err", err)
		return nil
	}
	switch {
	case st.WALLevel != "logical":
		return fmt.Errorf("relay: Relay.Mode is %q but the server has wal_level = %s: set wal_level = logical (ALTER SYSTEM SET wal_level = logical, or in postgresql.conf) and restart PostgreSQL, or use Relay.Mode = %q", ModeLog, st.WALLevel, ModePoll)
	case !st.PublicationExists:
		return fmt.Errorf("relay: Relay.Mode is %q but the publication %q does not exist: run `sagabox relay setup-log --schema %s`", ModeLog, r.opts.Publication, r.db.Schema())
	}
	// A publication without its slot (a promoted standby, a slot dropped by
	// an operator): the relay creates the slot again (runLog).
	return nil
}

// runLog runs the relay in log mode until ctx is cancelled.
func (r *Relay) runLog(ctx context.Context) error {
	r.log.Info("relay started", "mode", ModeLog, "slot", r.opts.Slot, "publication", r.opts.Publication, "batch_size", r.opts.BatchSize)
	failures, standby := 0, false
	for ctx.Err() == nil {
		err := r.streamLog(ctx)
		if ctx.Err() != nil || errors.Is(err, errCrashed) {
			break
		}
		var wait time.Duration
		switch {
		case errors.Is(err, driver.ErrLogSlotMissing):
			// Failover (a promoted standby has no slot) or an operator
			// dropped it: create it again; the rows written before it are
			// owed from the table (catchUp).
			created, serr := r.db.OutboxLogSetup(ctx, r.opts.Slot, r.opts.Publication)
			if serr == nil {
				r.log.Warn("relay created its replication slot again (gone: a failover, or dropped by an operator); the rows written before it are published from the table",
					"slot", r.opts.Slot, "created", created)
				continue
			}
			failures++
			wait = backoff(DefaultMinBackoff, DefaultMaxBackoff, failures)
			r.log.Warn("relay's replication slot is gone and could not be created again; retrying", "slot", r.opts.Slot, "err", serr, "retry_in", wait)
		case errors.Is(err, driver.ErrLogSlotBusy):
			wait = r.opts.PollInterval
			if !standby {
				r.log.Info("relay standing by: another reader holds the replication slot", "slot", r.opts.Slot, "err", err)
				standby = true
			}
		default:
			standby = false
			failures++
			wait = backoff(DefaultMinBackoff, DefaultMaxBackoff, failures)
			r.log.Warn("relay lost its replication stream; reconnecting", "err", err, "retry_in", wait, "failures", failures)
		}
		if !sleepFor(ctx, wait) {
			break
		}
	}
	r.log.Info("relay stopped")
	return nil
}

// sleepFor waits d or until ctx is done; it reports false once ctx is done.
func sleepFor(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// streamLog holds the slot: it reads batches and publishes them, and
// settles what the broker confirmed and confirms the slot's position past
// it, until ctx is done (nil: what was published is settled and confirmed)
// or the stream, the broker or the database fails (nothing more is
// confirmed: the next reader streams it again). Settling waits for a full
// batch of rows, an idle stream or settleDelay, so that a trickle of small
// batches costs one statement per batch of rows, not per read.
func (r *Relay) streamLog(ctx context.Context) error {
	if err := r.catchUp(ctx); err != nil {
		return err
	}
	lg, err := r.db.OutboxLogOpen(ctx, r.opts.Slot, r.opts.Publication)
	if err != nil {
		return err
	}
	defer func() { _ = lg.Close(ctx) }()
	r.log.Info("relay reading the replication slot", "slot", r.opts.Slot)
	var done driver.OutboxSettle
	var through uint64
	var since time.Time
	flush := func() error {
		if n := len(done.Published) + len(done.Dead); n > 0 {
			if _, err := r.claim(ctx, 0, done); err != nil {
				return fmt.Errorf("settle %d published rows: %w", n, err)
			}
			done = driver.OutboxSettle{}
		}
		if through > 0 {
			if err := lg.Confirm(ctx, through); err != nil {
				return err
			}
			through = 0
		}
		return nil
	}
	for {
		wait := time.Duration(0)
		if through > 0 {
			wait = max(r.settleDelay-time.Since(since), time.Millisecond)
		}
		b, err := lg.Next(ctx, r.opts.BatchSize, wait)
		if err != nil {
			if ctx.Err() != nil {
				return flush()
			}
			return err
		}
		if len(b.Rows) > 0 {
			// A commit is streamed before its transaction is visible: its
			// rows could be taken for deleted, or not be deleted when
			// settled.
			if err := r.db.OutboxLogAwaitVisible(ctx, b.Xids); err != nil {
				if ctx.Err() != nil {
					return flush()
				}
				return err
			}
			settled, err := r.publishLog(ctx, lg, b.Rows)
			done.Published = append(done.Published, settled.Published...)
			done.Dead = append(done.Dead, settled.Dead...)
			done.Late = append(done.Late, settled.Late...)
			if err != nil {
				if ctx.Err() != nil && !errors.Is(err, errCrashed) {
					return flush()
				}
				return err
			}
		}
		if b.Through > 0 {
			if through == 0 {
				since = time.Now()
			}
			through = b.Through
		}
		full := len(done.Published)+len(done.Dead) >= r.opts.BatchSize
		if full || through > 0 && (len(b.Rows) == 0 || time.Since(since) >= r.settleDelay) {
			if err := flush(); err != nil {
				return err
			}
		}
	}
}

// catchUp publishes, by claims as the polling relay does, the rows the slot
// does not stream: those written before it was created
// (driver.Executor.OutboxLogOwed). Claims may take newer rows too, which
// the slot streams again: duplicates, which receivers' inboxes absorb, never
// a loss. It returns once nothing is owed, or with the error of a claim or
// of the count; the next stream starts it again.
func (r *Relay) catchUp(ctx context.Context) error {
	owed, err := r.db.OutboxLogOwed(ctx, r.opts.Slot)
	if err != nil || owed == 0 {
		return err
	}
	r.log.Warn("relay publishing, from the table, the rows its replication slot does not stream (written before the slot was created: a failover, a dropped slot, a switch to log mode)",
		"rows", owed, "slot", r.opts.Slot)
	failures := 0
	for {
		rows, err := r.claim(ctx, r.opts.BatchSize, driver.OutboxSettle{})
		if err != nil {
			return err
		}
		if len(rows) > 0 {
			settled, perr := r.publish(ctx, rows)
			if errors.Is(perr, errCrashed) {
				return perr
			}
			// Recorded at once, so that the count below sees it.
			if _, err := r.claim(ctx, 0, settled); err != nil {
				return err
			}
			if perr != nil {
				failures++
				wait := backoff(DefaultMinBackoff, DefaultMaxBackoff, failures)
				r.log.Warn("relay batch not confirmed; backing off", "err", perr, "retry_in", wait, "failures", failures)
				if !sleepFor(ctx, wait) {
					return ctx.Err()
				}
			} else {
				failures = 0
			}
		} else if !sleepFor(ctx, r.opts.PollInterval) {
			// Rows owed but none claimable: they wait out a retry delay,
			// or another relay's lease.
			return ctx.Err()
		}
		if owed, err = r.db.OutboxLogOwed(ctx, r.opts.Slot); err != nil || owed == 0 {
			return err
		}
	}
}

// withoutDeleted returns rows without those no longer in the outbox
// (withdrawn with their terminated saga, or deleted by an operator): all of
// rows are looked up when all is true, else only those written more than
// LateSend before (read late: the relay was down or behind), so that a
// stream that keeps up costs no lookup. When the lookup fails it returns
// rows unchanged: publishing a deleted row is a duplicate at worst.
func (r *Relay) withoutDeleted(ctx context.Context, rows []driver.OutboxRow, all bool) []driver.OutboxRow {
	var ids []int64
	now := time.Now()
	for _, row := range rows {
		if all || now.Sub(row.Message.CreatedAt) > LateSend {
			ids = append(ids, row.ID)
		}
	}
	if len(ids) == 0 {
		return rows
	}
	present, err := r.db.OutboxPresent(ctx, ids)
	if err != nil {
		r.log.Warn("relay could not check whether late rows were deleted meanwhile; publishing them", "err", err)
		return rows
	}
	gone := make(map[int64]bool, len(ids))
	for _, id := range ids {
		gone[id] = true
	}
	for _, id := range present {
		delete(gone, id)
	}
	if len(gone) == 0 {
		return rows
	}
	r.log.Info("relay skipped messages deleted from the outbox after they were written (withdrawn with their terminated saga, or by an operator)", "messages", len(gone))
	return slices.DeleteFunc(slices.Clone(rows), func(row driver.OutboxRow) bool { return gone[row.ID] })
}

// publishLog publishes rows until each is confirmed, given up on (dead)
// or gone from the outbox (withdrawn, deleted), and returns how to settle
// them; only once they are settled may
// the slot move past them. It returns early, with what was confirmed so
// far, when ctx is done or the test hook crashes it.
func (r *Relay) publishLog(ctx context.Context, lg driver.OutboxLog, rows []driver.OutboxRow) (driver.OutboxSettle, error) {
	var done driver.OutboxSettle
	if rows = r.withoutDeleted(ctx, rows, false); len(rows) == 0 {
		return done, nil
	}
	for attempt := 1; ; attempt++ {
		for i := range rows {
			rows[i].PublishAttempts = attempt
		}
		settle, pubErr := r.publish(ctx, rows)
		if errors.Is(pubErr, errCrashed) {
			return driver.OutboxSettle{}, pubErr
		}
		done.Published = append(done.Published, settle.Published...)
		done.Dead = append(done.Dead, settle.Dead...)
		done.Late = append(done.Late, settle.Late...)
		if pubErr == nil {
			return done, nil
		}
		failed := make(map[int64]bool, len(settle.Failed))
		for _, id := range settle.Failed {
			failed[id] = true
		}
		left := rows[:0:0]
		for _, row := range rows {
			if failed[row.ID] {
				left = append(left, row)
			}
		}
		rows = left
		wait := backoff(DefaultMinBackoff, DefaultMaxBackoff, attempt)
		// A row deleted meanwhile (withdrawn with its terminated saga, or
		// by an operator) is not retried: it no longer holds the stream.
		if rows = r.withoutDeleted(ctx, rows, true); len(rows) == 0 {
			return done, nil
		}
		r.log.Warn("relay batch not confirmed; backing off", "err", pubErr, "retry_in", wait, "attempt", attempt)
		// The stream waits meanwhile: tell the server the reader is alive.
		if err := lg.Confirm(ctx, 0); err != nil {
			return done, err
		}
		if !sleepFor(ctx, wait) {
			return done, ctx.Err()
		}
	}
}
