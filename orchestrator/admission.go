package orchestrator

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sagabox/sagabox/internal/engine"
	"github.com/sagabox/sagabox/internal/telemetry"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store/driver"
)

// History events of flow control, besides the saga core's.
const (
	// HistoryQueued: the saga was started while it could not run (its
	// definition's limit of running sagas, or its concurrency key); Detail
	// says which.
	HistoryQueued saga.HistoryEvent = "queued"
	// HistoryAdmitted: a queued saga was admitted; its steps start now.
	// Detail says how long it waited.
	HistoryAdmitted saga.HistoryEvent = "admitted"
	// HistoryAdmissionFailed: the saga core refused to start a queued saga
	// (its data or a command could not be built); the saga is failed.
	HistoryAdmissionFailed saga.HistoryEvent = "admission-failed"
)

// mustQueue decides, in tx, whether a saga of definition name started with
// concurrency key key ("" for none) must wait for admission, and returns
// why ("" when it can run at once). Without a limit or key it reads
// nothing; with a key it first takes the key's lock, held until tx ends.
func (c *Client) mustQueue(ctx context.Context, tx pgx.Tx, name, key string) (string, error) {
	limit := c.cfg.Admission.limit(name)
	if limit < 0 && key == "" {
		return "", nil
	}
	if key != "" {
		if err := c.db.SagaConcurrencyKeyLock(ctx, tx, name, key); err != nil {
			return "", err
		}
	} else if c.room.take(name, limit, time.Now()) {
		return "", nil
	}
	a, err := c.db.SagaAdmission(ctx, tx, name, limit, key)
	if err != nil {
		return "", err
	}
	if key == "" {
		c.room.saw(name, a, time.Now())
	}
	switch {
	case a.KeyTaken:
		return fmt.Sprintf("a saga with concurrency key %q is queued or running", key), nil
	case limit >= 0 && a.Queued:
		return "sagas started earlier are waiting for admission", nil
	case limit >= 0 && a.Running >= limit:
		return fmt.Sprintf("%d sagas of %s are running, its limit (Admission)", a.Running, name), nil
	}
	return "", nil
}

// roomFreshness is how long a Start trusts the admission count another
// Start of the same definition read in this process.
const roomFreshness = 100 * time.Millisecond

// admissionRooms remembers, per definition, the last admission count this
// process read. Counting the running sagas at each Start visits up to
// MaxRunning rows; well below the limit that work decides nothing. So a
// Start without a concurrency key skips the count while the last one is
// fresh (roomFreshness), found no saga queued, and it plus the Starts
// since take no more than half of the room that count left below the
// limit: near the limit every Start counts. Two processes that start
// sagas at once can together fill the room within one freshness window,
// no more; more processes can overshoot by half the room each. The limit
// stays as soft as it was documented to be (a start counts committed
// sagas only): the admission pass, which admits queued sagas, always
// counts. (With a quarter of the limit as the bound, a saturated bench with
// over a hundred sagas running counted at every Start: half a millisecond
// of PostgreSQL time per saga.)
type admissionRooms struct {
	mu   sync.Mutex
	seen map[string]admissionRoom
}

type admissionRoom struct {
	running, since int
	at             time.Time
}

// take reports whether a Start of definition name, with limit, may skip
// the count, and counts it if so.
func (r *admissionRooms) take(name string, limit int, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.seen[name]
	if !ok || now.Sub(s.at) > roomFreshness || s.since+1 > (limit-s.running)/2 {
		return false
	}
	s.since++
	r.seen[name] = s
	return true
}

// saw records the admission count a Start of definition name read.
func (r *admissionRooms) saw(name string, a driver.Admission, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if a.Queued {
		delete(r.seen, name)
		return
	}
	if r.seen == nil {
		r.seen = make(map[string]admissionRoom)
	}
	r.seen[name] = admissionRoom{running: a.Running, at: now}
}

// enqueue writes, in tx, saga id of runner as queued: its row with every
// step pending and a history entry saying why, no message. None of its
// steps runs, local ones included, before it is admitted. It reports false
// when the start key is taken: nothing was written.
func (c *Client) enqueue(ctx context.Context, tx pgx.Tx, runner saga.Runner, id uuid.UUID, data json.RawMessage, opts *StartOpts, startHash []byte, why string) (bool, error) {
	if !json.Valid(data) {
		return false, fmt.Errorf("%w: data is not valid JSON", saga.ErrInvalidPayload)
	}
	now := c.now()
	steps := make([]saga.StepState, len(runner.Steps()))
	for i, st := range runner.Steps() {
		steps[i] = saga.StepState{Name: st.Name, Status: saga.StepPending, Group: st.Group}
	}
	inst := saga.Instance{
		ID: id, Type: runner.Name(), Version: runner.Version(), Status: saga.StatusQueued, Phase: saga.PhaseAction,
		Data: data, Steps: steps,
	}
	rec := driver.SagaRecord{StartKey: opts.StartKey, ConcurrencyKey: opts.ConcurrencyKey, StartDataHash: startHash}
	rec.TraceParent, rec.TraceState = telemetry.Inject(ctx)
	if err := applyToRecord(&rec, &inst, now); err != nil {
		return false, err
	}
	return c.db.SagaStart(ctx, tx, &driver.SagaStart{
		Saga:    rec,
		History: []driver.HistoryRecord{{SagaID: id, At: now, Event: string(HistoryQueued), Phase: string(saga.PhaseAction), Detail: why}},
	}, now)
}

// signalStart tells Run's waker that a saga was started (queued: it waits
// for admission), so that it wakes the relay (and the admission pass) a few
// times while the caller's transaction commits.
func (c *Client) signalStart(queued bool) {
	if queued {
		c.queuedStart.Store(true)
		c.mayBeQueued.Store(true)
	}
	c.wokenSinceStart.Store(false)
	select {
	case c.startWake <- struct{}{}:
	default:
	}
}

// wakeAdmission asks the admission pass to run soon.
func (c *Client) wakeAdmission() {
	select {
	case c.admitWake <- struct{}{}:
	default:
	}
}

// admitLoop admits queued sagas when woken (a saga of this process ended,
// or one was queued) and every SweepInterval, until ctx is cancelled. Its
// transactions run on workCtx.
func (c *Client) admitLoop(ctx, workCtx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	failures := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.admitWake:
		case <-t.C:
		}
		for ctx.Err() == nil {
			more, err := c.admitPass(workCtx)
			if err != nil {
				failures++
				if ctx.Err() == nil {
					c.log.Warn("admission pass failed; will try again", "err", err, "failures", failures)
				}
				break
			}
			failures = 0
			if !more {
				break
			}
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(c.cfg.SweepInterval)
	}
}

// Admit runs one admission pass now: it starts queued sagas of the
// definitions the Client runs, in start order, as far as their limits and
// concurrency keys allow, and returns how many it admitted. Run does this on
// its own; Admit is for tests and tools.
func (c *Client) Admit(ctx context.Context) (int, error) {
	total := 0
	for {
		n, more, err := c.admit(ctx)
		total += n
		if err != nil || !more {
			return total, err
		}
	}
}

func (c *Client) admitPass(ctx context.Context) (bool, error) {
	_, more, err := c.admit(ctx)
	return more, err
}

// admit runs one admission transaction: under the schema's admission lock
// (another orchestrator's pass in progress: nothing to do), for each
// definition name it runs, it counts the running sagas, claims up to the
// free places' worth of queued sagas that may run (at most
// Admission.Batch in all), runs the saga core's Start on each and writes
// them as one statement with the commit. It reports how many it admitted
// and whether more may be admitted at once.
func (c *Client) admit(ctx context.Context) (admitted int, more bool, err error) {
	var trs []transition
	var waits []time.Duration
	claimed, full := 0, false
	err = engine.Retrying(ctx, func() error {
		trs, waits, more, claimed, full = trs[:0], waits[:0], false, 0, false
		now := c.now()
		t := c.db.Begin(nil)
		defer t.Rollback(ctx)
		locked, err := c.db.AdmissionTryLock(ctx, t)
		if err != nil || !locked {
			return err
		}
		budget := c.cfg.Admission.Batch
		for name, versions := range c.definitionVersions() {
			if budget == 0 {
				more = true
				break
			}
			limit, free := c.cfg.Admission.limit(name), budget
			if limit >= 0 {
				running, err := c.db.SagaCountRunning(ctx, t, name, limit)
				if err != nil {
					return err
				}
				free = min(budget, limit-running)
			}
			if free <= 0 {
				full = true // queued sagas may wait for the next place
				continue
			}
			recs, err := c.db.SagaClaimQueued(ctx, t, name, versions, free)
			if err != nil {
				return err
			}
			claimed += len(recs)
			if len(recs) == free {
				more = true
			}
			if recs, err = c.keysFree(ctx, t, name, recs); err != nil {
				return err
			}
			for _, rec := range recs {
				tr, err := c.admitOne(ctx, t, rec, now)
				if err != nil {
					return err
				}
				trs = append(trs, tr)
				waits = append(waits, now.Sub(rec.CreatedAt))
				budget--
			}
		}
		return c.writeAndCommit(ctx, t, writes(trs...), now)
	})
	if err != nil {
		return 0, false, fmt.Errorf("admit queued sagas: %w", err)
	}
	// Queued sagas that may be left behind (a full batch, a definition at
	// its limit, sagas waiting for their key) keep the ends of sagas waking
	// the pass at once; otherwise its poll looks again.
	c.mayBeQueued.Store(more || full || claimed > len(trs))
	for i, tr := range trs {
		c.tel.SagaAdmitted(ctx, tr.rec.Type, waits[i])
		if !tr.res.Instance.Deadline.IsZero() {
			c.noteDeadline(tr.res.Instance.Deadline)
		}
	}
	c.committed(ctx, trs...)
	if len(trs) > 0 {
		c.log.Debug("queued sagas admitted", "count", len(trs))
	}
	return len(trs), more, nil
}

// keysFree returns those of recs without a concurrency key or whose key's
// lock it took in t and no saga is running or compensating for.
func (c *Client) keysFree(ctx context.Context, t driver.Tx, name string, recs []driver.SagaRecord) ([]driver.SagaRecord, error) {
	var keys []string
	for _, r := range recs {
		if r.ConcurrencyKey != "" {
			keys = append(keys, r.ConcurrencyKey)
		}
	}
	if len(keys) == 0 {
		return recs, nil
	}
	free, err := c.db.SagaConcurrencyKeysFree(ctx, t, name, keys)
	if err != nil {
		return nil, err
	}
	out := recs[:0]
	for _, r := range recs {
		if r.ConcurrencyKey == "" || free[r.ConcurrencyKey] {
			out = append(out, r)
		}
	}
	return out, nil
}

// admitOne runs the saga core's Start on the queued saga rec, in a span of
// its own in the trace of the span that started it, with its leading local
// steps under a savepoint of t. A saga the core refuses to start is failed,
// with the reason in its history.
func (c *Client) admitOne(ctx context.Context, t driver.Tx, rec driver.SagaRecord, now time.Time) (_ transition, err error) {
	ctx, span := c.sagaSpan(ctx, "saga admitted", rec)
	defer endSpan(span, &err)
	runner, err := c.registry.Lookup(rec.Type, rec.Version)
	if err != nil {
		return transition{}, err // not claimed: ClaimQueuedSagas filters on known versions
	}
	admitted := driver.HistoryRecord{
		SagaID: rec.ID, At: now, Event: string(HistoryAdmitted), Phase: string(saga.PhaseAction),
		Detail: fmt.Sprintf("waited %s for admission", now.Sub(rec.CreatedAt).Round(time.Millisecond)),
	}
	scope, sp, err := c.coreScope(ctx, t, runner)
	if err != nil {
		return transition{}, err
	}
	if sp != nil {
		defer sp.Rollback(context.WithoutCancel(ctx))
	}
	res, startErr := runner.Start(scope, rec.ID, rec.Data, now)
	if startErr != nil {
		if ctx.Err() != nil {
			return transition{}, startErr
		}
		telemetry.Fail(span, startErr)
		c.log.Error("queued saga cannot be started; it is failed", "saga_id", rec.ID.String(), "saga_type", rec.Type, "err", startErr)
		next := rec
		next.Status, next.LastError = string(saga.StatusFailed), "admission: "+startErr.Error()
		return transition{rec: next, res: saga.Result{Instance: saga.Instance{Status: saga.StatusFailed}}, write: driver.Transition{
			Saga: &next,
			History: []driver.HistoryRecord{admitted, {
				SagaID: rec.ID, At: now, Event: string(HistoryAdmissionFailed), Phase: string(saga.PhaseAction), Detail: startErr.Error(),
			}},
		}}, nil
	}
	tr, err := c.transition(ctx, rec, res, now)
	if err == nil {
		// Events sent while it was queued, for a step it now waits at.
		tr, err = c.consumeKept(ctx, t, nil, runner, tr, now)
	}
	if err != nil {
		return transition{}, err
	}
	tr.write.History = append([]driver.HistoryRecord{admitted}, tr.write.History...)
	tr.at = now
	if sp != nil {
		if err := sp.Commit(ctx); err != nil {
			return transition{}, err
		}
	}
	return tr, nil
}

// withdrawQueued returns the transition of an operator's cancel (or abort)
// or terminate of rec, a queued saga: nothing of it ran, so a cancel ends it
// compensated at once, with nothing to compensate, and a terminate ends it
// terminated. A retry is refused.
func (c *Client) withdrawQueued(rec driver.SagaRecord, kind saga.EventKind, actor, reason string, now time.Time) (transition, error) {
	status, event := saga.StatusCompensated, saga.HistoryCancelled
	switch kind {
	case saga.EventCancel:
	case saga.EventAbort:
		event = saga.HistoryAborted
	case saga.EventTerminate:
		status, event = saga.StatusTerminated, saga.HistoryTerminated
	default:
		return transition{}, fmt.Errorf("%w: %s of a queued saga (it has not started; cancel or terminate withdraws it)", saga.ErrInvalidTransition, kind)
	}
	next := rec
	next.Status, next.FinishedAt, next.CurrentStep = string(status), now, -1
	next.LastError = string(kind) + " before admission"
	if reason != "" {
		next.LastError += ": " + reason
	}
	tr := transition{
		before: saga.StatusQueued, since: rec.UpdatedAt, at: now, phase: saga.PhaseAction,
		res: saga.Result{Instance: saga.Instance{Status: status}},
		write: driver.Transition{Saga: &next, History: []driver.HistoryRecord{{
			SagaID: rec.ID, At: now, Event: string(event), Phase: string(saga.PhaseAction),
			Detail: "withdrawn before admission: " + reason, Actor: actor,
		}}},
	}
	tr.rec = next
	tr.rec.Revision++
	tr.rec.UpdatedAt = now
	return tr, nil
}

// definitionVersions returns the versions of each definition name the
// Client runs.
func (c *Client) definitionVersions() map[string][]int {
	out := map[string][]int{}
	for _, r := range c.registry.Runners() {
		out[r.Name()] = append(out[r.Name()], r.Version())
	}
	return out
}
