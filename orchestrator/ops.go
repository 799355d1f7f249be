package orchestrator

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"

	"github.com/sagabox/sagabox/internal/engine"
	"github.com/sagabox/sagabox/internal/telemetry"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store/driver"
)

// Get returns the saga id, or an error wrapping ErrNotFound.
func (c *Client) Get(ctx context.Context, id uuid.UUID) (*Saga, error) {
	return sagaRead(c.db.SagaGet(ctx, id))
}

// History returns the history of saga id, oldest first: every decision of
// the saga core (commands and compensations sent, replies applied or
// ignored, timeouts, retries), operator actions with their actor and
// reason, and replies the orchestrator dead-lettered
// (HistoryReplyDeadLettered). It returns an error wrapping ErrNotFound if
// the saga does not exist.
func (c *Client) History(ctx context.Context, id uuid.UUID) ([]saga.HistoryEntry, error) {
	recs, err := c.db.SagaHistory(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("orchestrator: %w", err)
	}
	if len(recs) == 0 {
		if _, err := c.db.SagaGet(ctx, id); err != nil {
			return nil, fmt.Errorf("orchestrator: %w", err)
		}
	}
	out := make([]saga.HistoryEntry, len(recs))
	for i, r := range recs {
		out[i] = saga.HistoryEntry{
			At: r.At, Event: saga.HistoryEvent(r.Event), Step: r.Step, StepIndex: r.StepIndex, Phase: saga.Phase(r.Phase),
			Attempt: r.Attempt, Detail: r.Detail, Actor: r.Actor, MessageID: r.MessageID,
		}
	}
	return out, nil
}

// DefaultListLimit is the page size of List when ListOpts.Limit is zero.
const DefaultListLimit = 100

// ListOpts selects sagas for List. A nil *ListOpts lists every saga.
type ListOpts struct {
	// Type keeps only sagas of this definition name. Defaults to "" (all).
	Type string
	// Version keeps only sagas of this definition version. Defaults to 0
	// (all).
	Version int
	// Statuses keeps only sagas in one of these statuses. Defaults to none
	// (all statuses).
	Statuses []saga.Status
	// StartKey keeps only sagas started with this key (StartOpts.StartKey);
	// with Type, at most one saga unless StartKeyReuseFinished reused the key.
	// Defaults to "" (all).
	StartKey string
	// OlderThan keeps only sagas not updated for at least this long (by
	// Clock): stuck ones. Defaults to 0 (all).
	OlderThan time.Duration
	// Overdue keeps only running or compensating sagas whose next deadline
	// has passed (by Clock): stuck past a deadline that no orchestrator
	// fired. Defaults to false (all).
	Overdue bool
	// Limit is the page size. Defaults to DefaultListLimit (100).
	Limit int
	// After continues a listing: pass the previous page's
	// ListResult.Cursor. Defaults to "" (first page).
	After string
}

// ListResult is one page of List.
type ListResult struct {
	// Sagas are the page's sagas, oldest (first started) first.
	Sagas []*Saga
	// Cursor continues the listing (ListOpts.After); "" when this page is
	// the last.
	Cursor string
}

// List returns the sagas selected by opts, oldest (first started) first,
// one page at a time. Pages follow each other however the sagas change
// meanwhile: the order is by start time, which never changes.
func (c *Client) List(ctx context.Context, opts *ListOpts) (*ListResult, error) {
	if opts == nil {
		opts = &ListOpts{}
	}
	if opts.Limit < 0 {
		return nil, fmt.Errorf("orchestrator: list: ListOpts.Limit %d is negative", opts.Limit)
	}
	if opts.Version < 0 {
		return nil, fmt.Errorf("orchestrator: list: ListOpts.Version %d is negative", opts.Version)
	}
	f := driver.SagaFilter{Type: opts.Type, Version: opts.Version, StartKey: opts.StartKey, Limit: opts.Limit}
	if f.Limit == 0 {
		f.Limit = DefaultListLimit
	}
	for _, st := range opts.Statuses {
		if !st.Valid() {
			return nil, fmt.Errorf("orchestrator: list: ListOpts.Statuses: unknown status %q", st)
		}
		f.Statuses = append(f.Statuses, string(st))
	}
	if opts.OlderThan > 0 {
		f.UpdatedBefore = c.now().Add(-opts.OlderThan)
	}
	if opts.Overdue {
		f.DeadlineBefore = c.now()
	}
	if opts.After != "" {
		after, err := decodeCursor(opts.After)
		if err != nil {
			return nil, fmt.Errorf("orchestrator: list: ListOpts.After: %w", err)
		}
		f.After = after
	}
	recs, err := c.db.SagaList(ctx, f)
	if err != nil {
		return nil, fmt.Errorf("orchestrator: %w", err)
	}
	res := &ListResult{Sagas: make([]*Saga, len(recs))}
	for i := range recs {
		if res.Sagas[i], err = sagaFromRecord(&recs[i]); err != nil {
			return nil, fmt.Errorf("orchestrator: %w", err)
		}
	}
	if len(recs) == f.Limit {
		last := recs[len(recs)-1]
		res.Cursor = encodeCursor(last.CreatedAt, last.ID)
	}
	return res, nil
}

func encodeCursor(at time.Time, id uuid.UUID) string {
	return base64.RawURLEncoding.EncodeToString([]byte(at.UTC().Format(time.RFC3339Nano) + "|" + id.String()))
}

func decodeCursor(s string) (*driver.SagaRecord, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("cursor %q is not valid: %w", s, err)
	}
	at, id, ok := strings.Cut(string(b), "|")
	if !ok {
		return nil, fmt.Errorf("cursor %q is not valid", s)
	}
	t, err := time.Parse(time.RFC3339Nano, at)
	if err != nil {
		return nil, fmt.Errorf("cursor %q is not valid: %w", s, err)
	}
	u, err := uuid.Parse(id)
	if err != nil {
		return nil, fmt.Errorf("cursor %q is not valid: %w", s, err)
	}
	return &driver.SagaRecord{ID: u, CreatedAt: t}, nil
}

// Retry asks saga id to re-send what is in flight, with the next attempt
// number: the action of a running saga (e.g. stuck on a participant that
// lost the command), the compensation of a compensating one, or the failed
// compensation of a failed saga, which becomes compensating again. actor
// and reason are recorded in the history. A saga in another status gives an
// error wrapping saga.ErrInvalidTransition; an unknown one, ErrNotFound. It
// returns the saga's new state.
func (c *Client) Retry(ctx context.Context, id uuid.UUID, actor, reason string) (*Saga, error) {
	return c.operate(ctx, id, operatorAction{kind: saga.EventRetry, actor: actor, reason: reason})
}

// Cancel compensates the running saga id as if its current step had timed
// out for good, whether that step is running or waiting for a retry: the
// step's own compensation first (the participant's barrier makes it a
// no-op if the action never ran, and keeps a late action from being
// applied), then the completed steps' in reverse order; the saga ends
// compensated (or failed, if a compensation fails). actor and reason are
// recorded in the history (saga.HistoryCancelled, with the time) and
// LastError. A queued saga (never admitted, so nothing to compensate) ends
// compensated at once. A saga neither running nor queued gives an error
// wrapping saga.ErrInvalidTransition; an unknown one, ErrNotFound. It
// returns the saga's new state.
func (c *Client) Cancel(ctx context.Context, id uuid.UUID, actor, reason string) (*Saga, error) {
	return c.operate(ctx, id, operatorAction{kind: saga.EventCancel, actor: actor, reason: reason})
}

// Abort is Cancel.
//
// Deprecated: use Cancel, which it calls.
func (c *Client) Abort(ctx context.Context, id uuid.UUID, actor, reason string) (*Saga, error) {
	return c.Cancel(ctx, id, actor, reason)
}

// Terminate stops the queued, running, compensating or failed saga id at once,
// compensating nothing: it ends terminated (saga.StatusTerminated), the
// step in flight marked saga.StepTerminated, and no further command or
// compensation is sent: its commands and compensations that no relay has
// published yet are deleted from the outbox in the same transaction. One
// already published (or being published at that moment) is still
// delivered; its reply is recorded and ignored. A relay in log mode reads
// the inserts from the write-ahead log: it looks up the rows it reads more
// than a second after their write, and those it retries, and skips the ones
// deleted since, so a withdrawn command may still go out only if it was
// read within a second of its write. actor and reason are
// recorded in the history (saga.HistoryTerminated, with the time) and
// LastError. A saga that has ended gives an error wrapping
// saga.ErrInvalidTransition; an unknown one, ErrNotFound. It returns the
// saga's new state.
func (c *Client) Terminate(ctx context.Context, id uuid.UUID, actor, reason string) (*Saga, error) {
	return c.operate(ctx, id, operatorAction{kind: saga.EventTerminate, actor: actor, reason: reason})
}

// RestartOpts says how Restart runs a saga again. It is also the JSON of
// the params of a "restart" operator request (the sagabox CLI's `saga
// restart`).
type RestartOpts struct {
	// From names the step to run again from; a branch of a parallel group,
	// or the group's name, runs the whole group again. Required.
	From string `json:"from"`
	// Version is the definition version to run the saga on from now: a
	// newer version of its definition (registered with the Client) whose
	// steps before From are the same as the saga's. Defaults to 0, the
	// saga's own version.
	Version int `json:"version,omitempty"`
	// Data replaces the saga's data when set: JSON that decodes strictly
	// (no unknown fields) into the definition's data type. Defaults to nil,
	// the data as stored.
	Data json.RawMessage `json:"data,omitempty"`
}

// Restart runs the failed or compensated saga id again from the step
// opts.From, in a new run (Saga.Run): the steps before it keep their state
// (their actions must be in effect: succeeded, skipped, or with a
// compensation that failed), the others start again, and the saga is
// running. Each participant performs the restarted steps again: its
// barrier keeps one mark per run. Replies to the earlier run are ignored.
// actor and reason are recorded in the history (saga.HistoryRestarted).
// A saga in another status, a step that cannot be restarted from, or a
// version that is older or does not keep the earlier steps gives an error
// wrapping saga.ErrInvalidTransition; data that does not fit the type,
// saga.ErrInvalidPayload; an unregistered version,
// saga.ErrUnknownDefinition; an unknown saga, ErrNotFound. A saga whose
// start key a newer saga took (StartKeyReuseFinished) cannot be restarted.
// The restarted saga runs at once: an operator's restart does not wait for
// the definition's admission limit or its concurrency key. It returns the
// saga's new state.
func (c *Client) Restart(ctx context.Context, id uuid.UUID, actor, reason string, opts RestartOpts) (*Saga, error) {
	return c.operate(ctx, id, operatorAction{kind: saga.EventRestart, actor: actor, reason: reason, restart: &opts})
}

// operatorAction is an operator's action on a saga.
type operatorAction struct {
	kind          saga.EventKind
	actor, reason string
	// restart is the restart's options (kind saga.EventRestart).
	restart *RestartOpts
}

// operatorActionOf is the action an operator request asks for.
func operatorActionOf(op *driver.Operation) (operatorAction, error) {
	act := operatorAction{kind: requestKind(op.Action), actor: op.Actor, reason: op.Reason}
	if act.kind == saga.EventRestart {
		act.restart = &RestartOpts{}
		if err := json.Unmarshal(op.Params, act.restart); err != nil {
			return act, fmt.Errorf("%w: restart request %d: params %s: %w", saga.ErrInvalidEvent, op.ID, op.Params, err)
		}
	}
	return act, nil
}

func (c *Client) operate(ctx context.Context, id uuid.UUID, act operatorAction) (_ *Saga, err error) {
	kind, actor := act.kind, act.actor
	ctx, span := c.startOperation(ctx, id, kind, actor)
	defer endSpan(span, &err)
	if err := checkActor(actor); err != nil {
		return nil, fmt.Errorf("orchestrator: %s saga %s: %w", kind, id, err)
	}
	var tr transition
	err = engine.Retrying(ctx, func() error {
		t := c.db.Begin(nil)
		defer t.Rollback(ctx)
		var err error
		if tr, err = c.operateTx(ctx, t, id, act); err != nil {
			return err
		}
		return c.writeAndCommit(ctx, t, writes(tr), tr.at)
	})
	if err != nil {
		return nil, fmt.Errorf("orchestrator: %s saga %s: %w", kind, id, err)
	}
	c.operated(ctx, tr, act)
	return sagaFromRecord(&tr.rec)
}

// errNoActor refuses an operator action without an actor.
var errNoActor = errors.New("actor is required")

func checkActor(actor string) error {
	if strings.TrimSpace(actor) == "" {
		return errNoActor
	}
	return nil
}

// startOperation starts the span of an operator action.
func (c *Client) startOperation(ctx context.Context, id uuid.UUID, kind saga.EventKind, actor string) (context.Context, trace.Span) {
	return c.tel.Tracer().Start(ctx, "saga "+string(kind), trace.WithAttributes(
		telemetry.AttrSagaID.String(id.String()), telemetry.AttrActor.String(actor), telemetry.AttrSchema.String(c.cfg.Schema)))
}

// operateTx locks saga id in t and applies operator action act to it. The
// transition is the caller's to write.
func (c *Client) operateTx(ctx context.Context, t driver.Tx, id uuid.UUID, act operatorAction) (transition, error) {
	kind, actor, reason := act.kind, act.actor, act.reason
	recs, err := c.db.SagaLock(ctx, t, []uuid.UUID{id})
	if err != nil {
		return transition{}, err
	}
	if len(recs) == 0 {
		return transition{}, fmt.Errorf("saga %s: %w", id, message.ErrNotFound)
	}
	rec := recs[0]
	version := rec.Version
	if act.restart != nil {
		if act.restart.Version != 0 {
			version = act.restart.Version
		}
		if rec.StartKeyReleased {
			return transition{}, fmt.Errorf("%w: restart saga %s: its start key %q names a newer saga now (StartKeyReuseFinished)", saga.ErrInvalidTransition, id, rec.StartKey)
		}
	}
	runner, err := c.registry.Lookup(rec.Type, version)
	if err != nil {
		return transition{}, err
	}
	now := c.now()
	if saga.Status(rec.Status) == saga.StatusQueued {
		return c.withdrawQueued(rec, kind, actor, reason, now)
	}
	s, err := sagaFromRecord(&rec)
	if err != nil {
		return transition{}, err
	}
	ev := saga.Event{Kind: kind, Actor: actor, Reason: reason, At: now}
	if act.restart != nil {
		ev.Step, ev.Payload = act.restart.From, act.restart.Data
	}
	res, err := runner.Apply(c.localScope(ctx, t), s.Instance(), ev)
	if err != nil {
		return transition{}, err
	}
	tr, err := c.transition(ctx, rec, res, now)
	tr.at = now
	return tr, err
}

// operated does what follows the commit of an operator action: wake-ups,
// metrics, the log line and the span's attributes.
func (c *Client) operated(ctx context.Context, tr transition, act operatorAction) {
	kind, actor, reason := act.kind, act.actor, act.reason
	c.committed(ctx, tr)
	if kind == saga.EventRetry {
		c.countResends(ctx, tr, telemetry.CauseOperator)
	}
	trace.SpanFromContext(ctx).SetAttributes(telemetry.AttrSagaType.String(tr.rec.Type), telemetry.AttrStatus.String(string(tr.res.Instance.Status)))
	attrs := []any{"saga_id", tr.rec.ID.String(), "saga_type", tr.rec.Type, "actor", actor, "reason", reason, "status", string(tr.res.Instance.Status)}
	switch kind {
	case saga.EventCancel, saga.EventAbort:
		c.log.Warn("saga cancelled by operator", attrs...)
	case saga.EventTerminate:
		c.log.Warn("saga terminated by operator", attrs...)
	case saga.EventRestart:
		c.log.Warn("saga restarted by operator", append(attrs, "from", act.restart.From, "version", tr.res.Instance.Version, "run", tr.res.Instance.Run)...)
	default:
		c.log.Info("saga retried by operator", attrs...)
	}
}
