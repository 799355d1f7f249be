package orchestrator

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"

	"github.com/sagabox/sagabox/internal/driver"
	"github.com/sagabox/sagabox/internal/engine"
	"github.com/sagabox/sagabox/internal/telemetry"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/saga"
)

// Get returns the saga id, or an error wrapping ErrNotFound.
func (c *Client) Get(ctx context.Context, id uuid.UUID) (*Saga, error) {
	rec, err := c.db.SagaGet(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("orchestrator: %w", err)
	}
	s, err := sagaFromRecord(&rec)
	if err != nil {
		return nil, fmt.Errorf("orchestrator: %w", err)
	}
	return s, nil
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
	// StartKey keeps only the sagas started with this key (one per type).
	// Defaults to "" (all).
	StartKey string
	// Statuses keeps only sagas in one of these statuses. Defaults to none
	// (all statuses).
	Statuses []saga.Status
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
	return c.operate(ctx, id, saga.EventRetry, actor, reason)
}

// Abort compensates the running saga id as if its current step had timed
// out for good: the step's own compensation first (the participant's
// barrier makes it a no-op if the action never ran), then the completed
// steps' in reverse order. actor and reason are recorded in the history and
// LastError. A saga that is not running gives an error wrapping
// saga.ErrInvalidTransition; an unknown one, ErrNotFound. It returns the
// saga's new state.
func (c *Client) Abort(ctx context.Context, id uuid.UUID, actor, reason string) (*Saga, error) {
	return c.operate(ctx, id, saga.EventAbort, actor, reason)
}

func (c *Client) operate(ctx context.Context, id uuid.UUID, kind saga.EventKind, actor, reason string) (_ *Saga, err error) {
	ctx, span := c.startOperation(ctx, id, kind, actor)
	defer func() {
		if err != nil {
			telemetry.Fail(span, err)
		}
		span.End()
	}()
	if err := checkActor(actor); err != nil {
		return nil, fmt.Errorf("orchestrator: %s saga %s: %w", kind, id, err)
	}
	var tr transition
	err = engine.Retrying(ctx, func() error {
		t := c.db.Begin()
		defer t.Rollback(ctx)
		var err error
		if tr, err = c.operateTx(ctx, t, id, kind, actor, reason); err != nil {
			return err
		}
		return c.db.WriteTransitions(ctx, t, writes(tr), tr.at, true)
	})
	if err != nil {
		return nil, fmt.Errorf("orchestrator: %s saga %s: %w", kind, id, err)
	}
	c.operated(ctx, tr, kind, actor, reason)
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

// operateTx locks saga id in t and applies operator action kind to it. The
// transition is the caller's to write.
func (c *Client) operateTx(ctx context.Context, t driver.Tx, id uuid.UUID, kind saga.EventKind, actor, reason string) (transition, error) {
	recs, err := c.db.LockSagas(ctx, t, []uuid.UUID{id})
	if err != nil {
		return transition{}, err
	}
	if len(recs) == 0 {
		return transition{}, fmt.Errorf("saga %s: %w", id, message.ErrNotFound)
	}
	rec := recs[0]
	runner, err := c.registry.Lookup(rec.Type, rec.Version)
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
	res, err := runner.Apply(c.localScope(ctx, t), s.Instance(), saga.Event{Kind: kind, Actor: actor, Reason: reason, At: now})
	if err != nil {
		return transition{}, err
	}
	tr, err := c.transition(ctx, rec, res, now)
	tr.at = now
	return tr, err
}

// operated does what follows the commit of an operator action: wake-ups,
// metrics, the log line and the span's attributes.
func (c *Client) operated(ctx context.Context, tr transition, kind saga.EventKind, actor, reason string) {
	c.committed(ctx, tr)
	if kind == saga.EventRetry {
		c.countResends(ctx, tr, telemetry.CauseOperator)
	}
	trace.SpanFromContext(ctx).SetAttributes(telemetry.AttrSagaType.String(tr.rec.Type), telemetry.AttrStatus.String(string(tr.res.Instance.Status)))
	attrs := []any{"saga_id", tr.rec.ID.String(), "saga_type", tr.rec.Type, "actor", actor, "reason", reason, "status", string(tr.res.Instance.Status)}
	if kind == saga.EventAbort {
		c.log.Warn("saga aborted by operator", attrs...)
	} else {
		c.log.Info("saga retried by operator", attrs...)
	}
}
