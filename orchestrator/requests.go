package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/sagabox/sagabox/internal/engine"
	"github.com/sagabox/sagabox/internal/telemetry"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store/driver"
)

// requestBatch is the most operator requests one pass applies.
const requestBatch = 20

// applyRequests applies operator requests recorded by tools that have no
// saga definitions (the sagabox CLI), up to requestBatch of them. Only
// requests for sagas of the definitions this orchestrator runs are claimed;
// the others are left for an orchestrator that runs them.
func (c *Client) applyRequests(ctx context.Context) error {
	keys := c.sagaKeys()
	for range requestBatch {
		found, err := c.applyRequest(ctx, keys)
		if err != nil || !found {
			return err
		}
	}
	return nil
}

// applyRequest claims the oldest pending request (SKIP LOCKED), applies it
// as Retry, Cancel or Terminate would and marks it with its outcome, all in one
// transaction: the action is applied if and only if its request is marked,
// so a request is never applied twice. It reports whether it found one.
func (c *Client) applyRequest(ctx context.Context, keys []driver.SagaKey) (found bool, err error) {
	var op *driver.Operation
	var kind saga.EventKind
	var applied operatorAction
	var tr transition
	var refusal error
	err = engine.Retrying(ctx, func() error {
		t := c.db.Begin(nil)
		defer t.Rollback(ctx)
		var err error
		if op, err = c.db.OperationClaim(ctx, t, keys); err != nil || op == nil {
			return err
		}
		var act operatorAction
		act, refusal = operatorActionOf(op)
		kind = act.kind
		sp, err := t.Savepoint(ctx)
		if err != nil {
			return err
		}
		defer sp.Rollback(context.WithoutCancel(ctx))
		opCtx, span := c.startOperation(ctx, op.SagaID, kind, op.Actor)
		defer span.End()
		if refusal == nil {
			refusal = checkActor(op.Actor)
		}
		if refusal == nil {
			tr, refusal = c.operateTx(opCtx, t, op.SagaID, act)
			applied = act
		}
		switch {
		case refusal == nil:
			if err := sp.Commit(ctx); err != nil {
				return err
			}
			if err := c.db.SagaWrite(ctx, t, writes(tr), tr.at); err != nil {
				return err
			}
		case refused(refusal):
			telemetry.Fail(span, refusal)
			if err := sp.Rollback(ctx); err != nil {
				return err
			}
		default:
			// Transient (the database): claimed again next pass.
			telemetry.Fail(span, refusal)
			return refusal
		}
		reason := ""
		if refusal != nil {
			reason = fmt.Sprintf("%s saga %s: %v", kind, op.SagaID, refusal)
		}
		if err := c.db.OperationMark(ctx, t, op.ID, c.now(), reason); err != nil {
			return err
		}
		_, err = t.Commit(ctx)
		return err
	})
	if op == nil {
		return false, err
	}
	if err != nil {
		return true, fmt.Errorf("operator request %d (%s saga %s): %w", op.ID, op.Action, op.SagaID, err)
	}
	if refusal != nil {
		c.log.Warn("operator request refused", "request_id", op.ID, "saga_id", op.SagaID.String(),
			"action", op.Action, "actor", op.Actor, "err", refusal)
		return true, nil
	}
	c.operated(ctx, tr, applied)
	return true, nil
}

// refused reports whether err refuses an operator action for good: the
// action is not allowed, the saga or its definition does not exist, or the
// saga core cannot apply it. Only database errors are worth another try.
func refused(err error) bool {
	for _, target := range []error{
		errNoActor, message.ErrNotFound, saga.ErrInvalidTransition, saga.ErrUnknownDefinition,
		saga.ErrInvalidInstance, saga.ErrInvalidEvent, saga.ErrInvalidPayload,
	} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

// sagaKeys names the definitions the Client runs.
func (c *Client) sagaKeys() []driver.SagaKey {
	runners := c.registry.Runners()
	keys := make([]driver.SagaKey, 0, len(runners))
	for _, r := range runners {
		keys = append(keys, driver.SagaKey{Type: r.Name(), Version: r.Version()})
	}
	return keys
}

// requestKind is the event of an operator request's action: "retry",
// "cancel" ("abort", its former name, from an older CLI) or "terminate".
func requestKind(action string) saga.EventKind {
	switch action {
	case "cancel", "abort":
		return saga.EventCancel
	case "terminate":
		return saga.EventTerminate
	case "retry":
		return saga.EventRetry
	case "restart":
		return saga.EventRestart
	}
	return saga.EventKind(action) // unknown: the saga core refuses it
}

// Request is an operator action recorded for an orchestrator to apply:
// tools that run no saga definitions (the sagabox CLI, the console) act on
// sagas this way, and a running orchestrator that runs the saga's
// definition applies the request as Retry, Cancel, Terminate or Restart
// would, exactly once (Client.RequestAction).
type Request struct {
	ID     int64
	SagaID uuid.UUID
	// Action is "retry", "cancel" ("abort", its former name), "terminate"
	// or "restart".
	Action string
	// Params are the action's parameters as JSON: a restart's RestartOpts;
	// nil for the other actions.
	Params      json.RawMessage
	Actor       string
	Reason      string
	RequestedAt time.Time
	// AppliedAt is when an orchestrator handled the request; zero while it
	// is pending.
	AppliedAt time.Time
	// Error is why the orchestrator refused the action; empty when applied.
	Error string
	// WithdrawnAt is when the request was withdrawn (no orchestrator
	// applies it), and WithdrawnBy who withdrew it; zero and empty unless
	// withdrawn.
	WithdrawnAt time.Time
	WithdrawnBy string
}

// Pending reports whether the request waits for an orchestrator.
func (r *Request) Pending() bool { return r.AppliedAt.IsZero() && r.WithdrawnAt.IsZero() }

// ErrRequestNotPending is wrapped by WithdrawRequest's error when the
// request was applied, refused or withdrawn before.
var ErrRequestNotPending = driver.ErrNotPending

// requestActions are the actions a Request may ask for.
var requestActions = []string{"retry", "cancel", "abort", "terminate", "restart"}

// RequestAction records a request for action ("retry", "cancel",
// "terminate" or "restart") on saga id on behalf of actor, for reason, and
// returns it: an orchestrator that runs the saga's definition applies it
// (refused, with Request.Error, when the saga's state does not allow it).
// restart is the restart's options, required for "restart" and nil
// otherwise. A Client without definitions (a tool's) records requests like
// any other. Follow the request with WaitRequest.
func (c *Client) RequestAction(ctx context.Context, id uuid.UUID, action, actor, reason string, restart *RestartOpts) (*Request, error) {
	if !slices.Contains(requestActions, action) {
		return nil, fmt.Errorf("orchestrator: request %q of saga %s: the actions are retry, cancel, terminate and restart", action, id)
	}
	if err := checkActor(actor); err != nil {
		return nil, fmt.Errorf("orchestrator: request %s of saga %s: %w", action, id, err)
	}
	var params []byte
	switch {
	case action == "restart" && restart == nil:
		return nil, fmt.Errorf("orchestrator: request restart of saga %s: RestartOpts are required", id)
	case action == "restart":
		var err error
		if params, err = json.Marshal(restart); err != nil {
			return nil, fmt.Errorf("orchestrator: request restart of saga %s: encode its options: %w", id, err)
		}
	case restart != nil:
		return nil, fmt.Errorf("orchestrator: request %s of saga %s: RestartOpts are for a restart", action, id)
	}
	op, err := c.db.OperationRequest(ctx, driver.NewOperation{SagaID: id, Action: action, Params: params, Actor: actor, Reason: reason})
	if err != nil {
		return nil, fmt.Errorf("orchestrator: %w", err)
	}
	return requestOf(op), nil
}

// GetRequest returns request id, or an error wrapping ErrNotFound.
func (c *Client) GetRequest(ctx context.Context, id int64) (*Request, error) {
	op, err := c.db.OperationGet(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("orchestrator: %w", err)
	}
	return requestOf(op), nil
}

// WaitRequest waits until request id was handled (applied, refused or
// withdrawn), wait has passed or ctx is done, and returns it as last read:
// still pending when no orchestrator handled it in time.
func (c *Client) WaitRequest(ctx context.Context, id int64, wait time.Duration) (*Request, error) {
	deadline := time.Now().Add(wait)
	tick := time.NewTicker(DefaultRequestPollInterval)
	defer tick.Stop()
	for {
		r, err := c.GetRequest(ctx, id)
		if err != nil || !r.Pending() || !time.Now().Before(deadline) {
			return r, err
		}
		select {
		case <-ctx.Done():
			return r, ctx.Err()
		case <-tick.C:
		}
	}
}

// DefaultRequestPollInterval is how often WaitRequest reads its request.
const DefaultRequestPollInterval = 100 * time.Millisecond

// WithdrawRequest withdraws pending request id on behalf of actor, so that
// no orchestrator applies it, and returns it. It returns an error wrapping
// ErrRequestNotPending, with the request as it is, if it was applied,
// refused or withdrawn before, and one wrapping ErrNotFound if it does not
// exist.
func (c *Client) WithdrawRequest(ctx context.Context, id int64, actor string) (*Request, error) {
	op, err := c.db.OperationWithdraw(ctx, id, actor)
	if errors.Is(err, driver.ErrNotPending) {
		return requestOf(op), fmt.Errorf("orchestrator: withdraw request %d: %w", id, err)
	}
	if err != nil {
		return nil, fmt.Errorf("orchestrator: %w", err)
	}
	return requestOf(op), nil
}

// ListRequestsOpts selects requests for ListRequests.
type ListRequestsOpts struct {
	// All lists every request, newest first; otherwise the pending ones,
	// oldest first.
	All bool
	// After continues a listing of pending requests after this request id.
	After int64
	// Limit is the page size. Defaults to DefaultListLimit.
	Limit int
}

// ListRequests lists requests as opts says (nil: the first page of pending
// requests).
func (c *Client) ListRequests(ctx context.Context, opts *ListRequestsOpts) ([]Request, error) {
	var o ListRequestsOpts
	if opts != nil {
		o = *opts
	}
	if o.Limit <= 0 {
		o.Limit = DefaultListLimit
	}
	var ops []driver.Operation
	var err error
	if o.All {
		ops, err = c.db.OperationList(ctx, true, o.Limit)
	} else {
		ops, err = c.db.OperationListPending(ctx, o.After, o.Limit)
	}
	if err != nil {
		return nil, fmt.Errorf("orchestrator: %w", err)
	}
	out := make([]Request, len(ops))
	for i := range ops {
		out[i] = *requestOf(ops[i])
	}
	return out, nil
}

func requestOf(op driver.Operation) *Request {
	return &Request{
		ID: op.ID, SagaID: op.SagaID, Action: op.Action, Params: op.Params, Actor: op.Actor, Reason: op.Reason,
		RequestedAt: op.RequestedAt, AppliedAt: op.AppliedAt, Error: op.Error, WithdrawnAt: op.WithdrawnAt, WithdrawnBy: op.WithdrawnBy,
	}
}
