package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/google/uuid"

	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store"
)

// maxReason is the longest reason an action accepts, in bytes.
const maxReason = 2000

// reasonOf returns the request's required reason.
func reasonOf(r *http.Request) (string, error) {
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	switch {
	case reason == "":
		return "", errors.New("a reason is required: it is recorded with the action")
	case len(reason) > maxReason:
		return "", fmt.Errorf("the reason has %d bytes: at most %d", len(reason), maxReason)
	}
	return reason, nil
}

// actorOf returns who performs the request's action: the authenticated
// user, or without authentication whom Config.Actor names.
func (c *console) actorOf(r *http.Request) (string, error) {
	if c.auth.on() {
		return whoOf(r).Name, nil
	}
	actor := strings.TrimSpace(c.cfg.Actor(r))
	if actor == "" {
		return "", errors.New("no actor: the console's Actor found nobody for this request")
	}
	return actor, nil
}

// reasonAndActor returns why and by whom the request's action is taken.
// When either is missing it answers the request with the error (400 for
// the reason, 403 for the actor) and ok is false.
func (c *console) reasonAndActor(w http.ResponseWriter, r *http.Request) (reason, actor string, ok bool) {
	reason, err := reasonOf(r)
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, err)
		return "", "", false
	}
	actor, err = c.actorOf(r)
	if err != nil {
		c.fail(w, r, http.StatusForbidden, err)
		return "", "", false
	}
	return reason, actor, true
}

// sagaAction records an operator request (retry, abort, terminate, or
// restart from the step in the form's "from") for a saga, which a running
// orchestrator of the schema applies, and waits up to ActionWait for it to
// be applied.
func (c *console) sagaAction(w http.ResponseWriter, r *http.Request) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, fmt.Errorf("%q is not a saga id (a UUID)", r.PathValue("id")))
		return
	}
	action := r.PathValue("action")
	switch action {
	case "retry", "abort", "terminate", "restart":
	default:
		c.fail(w, r, http.StatusNotFound, fmt.Errorf("unknown action %q: want retry, abort, terminate or restart", action))
		return
	}
	reason, actor, ok := c.reasonAndActor(w, r)
	if !ok {
		return
	}
	var restart *orchestrator.RestartOpts
	if action == "restart" {
		from := strings.TrimSpace(r.PostFormValue("from"))
		if from == "" {
			c.fail(w, r, http.StatusBadRequest, errors.New("choose the step to restart the saga from"))
			return
		}
		restart = &orchestrator.RestartOpts{From: from}
	}
	ctx := r.Context()
	s, err := c.orch.Get(ctx, id)
	if err != nil {
		c.fail(w, r, statusOf(err), err)
		return
	}
	// Refuse at once what the saga core would refuse: the request would
	// only be recorded and refused later.
	switch {
	case action == "abort" && s.Status != saga.StatusRunning && s.Status != saga.StatusQueued:
		c.fail(w, r, http.StatusConflict, fmt.Errorf("saga %s is %s: only a running or queued saga can be aborted", id, s.Status))
		return
	case action == "retry" && s.Status != saga.StatusRunning && s.Status != saga.StatusCompensating && s.Status != saga.StatusFailed:
		c.fail(w, r, http.StatusConflict, fmt.Errorf("saga %s is %s: only a running, compensating or failed saga can be retried", id, s.Status))
		return
	case action == "terminate" && !canTerminate(s.Status):
		c.fail(w, r, http.StatusConflict, fmt.Errorf("saga %s is %s: it has ended, there is nothing to terminate", id, s.Status))
		return
	case action == "restart" && !canRestart(s.Status):
		c.fail(w, r, http.StatusConflict, fmt.Errorf("saga %s is %s: only a failed or compensated saga can be restarted", id, s.Status))
		return
	}
	op, err := c.orch.RequestAction(ctx, id, action, actor, reason, restart)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	c.log.Info("operator request recorded", "request_id", op.ID, "saga_id", id.String(), "action", action, "actor", actor, "reason", reason)
	if op, err = c.orch.WaitRequest(ctx, op.ID, c.cfg.ActionWait); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		c.fail(w, r, statusOf(err), err)
		return
	}
	flash := fmt.Sprintf("%s requested (request %d); no orchestrator of schema %s applied it within %s: it is pending", action, op.ID, c.cfg.Schema, c.cfg.ActionWait)
	switch {
	case !op.AppliedAt.IsZero() && op.Error != "":
		flash = fmt.Sprintf("%s refused: %s", action, op.Error)
	case !op.AppliedAt.IsZero():
		flash = fmt.Sprintf("%s applied (request %d by %s)", action, op.ID, actor)
	}
	v := url.Values{"op": {strconv.FormatInt(op.ID, 10)}, "flash": {flash}}
	http.Redirect(w, r, fmt.Sprintf("%s/sagas/%s?%s", c.cfg.BasePath, id, v.Encode()), http.StatusSeeOther)
}

// canTerminate reports whether a saga in status st can be terminated.
func canTerminate(st saga.Status) bool {
	return st == saga.StatusQueued || st == saga.StatusRunning || st == saga.StatusCompensating || st == saga.StatusFailed
}

// canRestart reports whether a saga in status st can be restarted from a
// step.
func canRestart(st saga.Status) bool {
	return st == saga.StatusFailed || st == saga.StatusCompensated
}

// replay makes a dead outbox row unpublished again, so that the relay
// publishes it, and logs it with the actor and the reason.
func (c *console) replay(w http.ResponseWriter, r *http.Request) {
	schema := r.PathValue("schema")
	var st *store.Store
	for _, sc := range c.schemas {
		if sc.name == schema {
			st = sc.store
		}
	}
	if st == nil {
		c.fail(w, r, http.StatusNotFound, fmt.Errorf("schema %q is not one this console shows", schema))
		return
	}
	row, err := strconv.ParseInt(r.PathValue("row"), 10, 64)
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, fmt.Errorf("%q is not an outbox row id", r.PathValue("row")))
		return
	}
	reason, actor, ok := c.reasonAndActor(w, r)
	if !ok {
		return
	}
	n, err := st.RetryDeadRows(r.Context(), []int64{row})
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	if n == 0 {
		c.fail(w, r, http.StatusNotFound, fmt.Errorf("outbox row %d of schema %s is not dead (replayed or deleted already?)", row, schema))
		return
	}
	c.log.Warn("dead outbox row replayed by operator", "schema", schema, "outbox_id", row, "actor", actor, "reason", reason)
	v := url.Values{"flash": {fmt.Sprintf("outbox row %d of schema %s replayed by %s: the relay publishes it again", row, schema, actor)}}
	http.Redirect(w, r, c.cfg.BasePath+"/outbox?"+v.Encode(), http.StatusSeeOther)
}
