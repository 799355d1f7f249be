package orchestrator_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store/driver"
)

// retries counts the operator retries recorded in the history of saga id.
func (e *env) retries(id uuid.UUID) int {
	e.t.Helper()
	return e.count(`SELECT count(*) FROM %[1]s.sagabox_saga_history WHERE saga_id = $1 AND event = 'retried'`, id)
}

// TestOperatorRequestAppliedOnceWhenMarkingFails: an operator request
// (from the CLI) is applied together with its "applied" mark: when the mark
// cannot be written the action is not applied either, so the request is
// applied exactly once when it is claimed again, never once per pass.
func TestOperatorRequestAppliedOnceWhenMarkingFails(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	def := orderSaga(1, time.Minute, 1)
	c := e.newOrchestrator(e.orchConfig(def))
	ctx := context.Background()
	st := e.start(c, def, Order{ID: "op", Qty: 1, Amount: 10, Address: "here"}, nil)
	op, err := e.orch.OperationRequest(ctx, driver.NewOperation{SagaID: st.ID, Action: "retry", Actor: "alice", Reason: "participant lost the command", Params: nil})
	require.NoError(t, err)

	// Marking the request fails (a constraint, a statement timeout, a
	// dropped connection at commit).
	schema := pgx.Identifier{e.orch.Schema()}.Sanitize()
	_, err = e.pool.Exec(ctx, fmt.Sprintf(`
		CREATE FUNCTION %[1]s.refuse_mark() RETURNS trigger LANGUAGE plpgsql AS
			$$ BEGIN RAISE EXCEPTION 'cannot mark operator requests'; END $$;
		CREATE TRIGGER refuse_mark BEFORE UPDATE ON %[1]s.sagabox_saga_operation
			FOR EACH ROW EXECUTE FUNCTION %[1]s.refuse_mark();`, schema))
	require.NoError(t, err)
	for range 3 {
		require.Error(t, c.ApplyRequests(ctx))
	}
	s, err := c.Get(ctx, st.ID)
	require.NoError(t, err)
	require.Equal(t, 1, s.Steps[0].Attempt, "the retry must not be applied while its request cannot be marked")
	require.Zero(t, e.retries(st.ID))

	_, err = e.pool.Exec(ctx, fmt.Sprintf(`DROP TRIGGER refuse_mark ON %s.sagabox_saga_operation`, schema))
	require.NoError(t, err)
	require.NoError(t, c.ApplyRequests(ctx))
	require.NoError(t, c.ApplyRequests(ctx))
	s, err = c.Get(ctx, st.ID)
	require.NoError(t, err)
	require.Equal(t, 2, s.Steps[0].Attempt)
	require.Equal(t, 1, e.retries(st.ID))
	got, err := e.orch.OperationGet(ctx, op.ID)
	require.NoError(t, err)
	require.False(t, got.AppliedAt.IsZero())
	require.Empty(t, got.Error)
}

// TestOperatorRequestsOfOtherDefinitionsDoNotStarve: requests for sagas of
// a definition this orchestrator does not run are left for one that does,
// without keeping it from the requests it can apply; a request that can
// never be applied (no actor) is refused, not retried forever.
func TestOperatorRequestsOfOtherDefinitionsDoNotStarve(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	v1, v2 := orderSaga(1, time.Minute, 1), orderSaga(2, time.Minute, 1)
	c := e.newOrchestrator(e.orchConfig(v1))
	newer := e.newOrchestrator(e.orchConfig(v2))
	ctx := context.Background()

	// More requests for v2 sagas than one pass claims, all older than the
	// v1 requests.
	var others []uuid.UUID
	for i := range 25 {
		st := e.start(newer, v2, Order{ID: fmt.Sprintf("v2-%d", i), Qty: 1, Amount: 10, Address: "here"}, nil)
		_, err := e.orch.OperationRequest(ctx, driver.NewOperation{SagaID: st.ID, Action: "retry", Actor: "alice", Reason: "v2", Params: nil})
		require.NoError(t, err)
		others = append(others, st.ID)
	}
	mine := e.start(c, v1, Order{ID: "v1", Qty: 1, Amount: 10, Address: "here"}, nil)
	applied, err := e.orch.OperationRequest(ctx, driver.NewOperation{SagaID: mine.ID, Action: "retry", Actor: "bob", Reason: "v1", Params: nil})
	require.NoError(t, err)
	blank, err := e.orch.OperationRequest(ctx, driver.NewOperation{SagaID: mine.ID, Action: "abort", Actor: "", Reason: "no actor", Params: nil})
	require.NoError(t, err)

	require.NoError(t, c.ApplyRequests(ctx))
	op, err := e.orch.OperationGet(ctx, applied.ID)
	require.NoError(t, err)
	require.False(t, op.AppliedAt.IsZero(), "the v1 request must be applied")
	require.Empty(t, op.Error)
	require.Equal(t, 1, e.retries(mine.ID))
	op, err = e.orch.OperationGet(ctx, blank.ID)
	require.NoError(t, err)
	require.False(t, op.AppliedAt.IsZero(), "a request without actor is refused")
	require.Contains(t, op.Error, "actor is required")
	s, err := c.Get(ctx, mine.ID)
	require.NoError(t, err)
	require.Equal(t, saga.StatusRunning, s.Status)

	// The v2 requests wait, untouched, for an orchestrator that runs v2.
	require.Equal(t, 25, e.count(`SELECT count(*) FROM %[1]s.sagabox_saga_operation WHERE applied_at IS NULL`))
	require.NoError(t, newer.ApplyRequests(ctx))
	require.NoError(t, newer.ApplyRequests(ctx))
	require.Zero(t, e.count(`SELECT count(*) FROM %[1]s.sagabox_saga_operation WHERE applied_at IS NULL`))
	for _, id := range others {
		require.Equal(t, 1, e.retries(id))
	}
}

// TestRequestsThroughThePublicAPI: a tool's client (no definitions, no
// broker) requests actions as the CLI and the console do; an orchestrator
// that runs the definition applies each once; the request reads back as
// applied or refused, lists, and cannot be withdrawn once handled. Bad
// requests are refused before anything is recorded.
func TestRequestsThroughThePublicAPI(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	def := orderSaga(1, time.Minute, 1)
	c := e.newOrchestrator(e.orchConfig(def))
	tool := e.newOrchestrator(orchestrator.Config{Pool: e.pool, Schema: e.orch.Schema(), Service: "tool"})
	ctx := context.Background()
	st := e.start(c, def, Order{ID: "req", Qty: 1, Amount: 10, Address: "here"}, nil)

	for _, bad := range []struct {
		action, actor string
		restart       *orchestrator.RestartOpts
	}{
		{"delete", "alice", nil},
		{"retry", " ", nil},
		{"restart", "alice", nil},
		{"retry", "alice", &orchestrator.RestartOpts{From: "reserve"}},
	} {
		_, err := tool.RequestAction(ctx, st.ID, bad.action, bad.actor, "why", bad.restart)
		require.Error(t, err, "%+v", bad)
	}
	pending, err := tool.ListRequests(ctx, nil)
	require.NoError(t, err)
	require.Empty(t, pending, "a refused request records nothing")

	retry, err := tool.RequestAction(ctx, st.ID, "retry", "alice", "lost command", nil)
	require.NoError(t, err)
	require.True(t, retry.Pending())
	restart, err := tool.RequestAction(ctx, st.ID, "restart", "bob", "not failed yet", &orchestrator.RestartOpts{From: "reserve"})
	require.NoError(t, err)
	require.JSONEq(t, `{"from":"reserve"}`, string(restart.Params))
	pending, err = tool.ListRequests(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, []int64{retry.ID, restart.ID}, []int64{pending[0].ID, pending[1].ID}, "pending requests, oldest first")
	page, err := tool.ListRequests(ctx, &orchestrator.ListRequestsOpts{After: retry.ID})
	require.NoError(t, err)
	require.Len(t, page, 1)
	require.Equal(t, restart.ID, page[0].ID)

	// Nothing applies them yet: the wait ends with the request pending.
	got, err := tool.WaitRequest(ctx, retry.ID, 50*time.Millisecond)
	require.NoError(t, err)
	require.True(t, got.Pending())

	require.NoError(t, c.ApplyRequests(ctx))
	got, err = tool.WaitRequest(ctx, retry.ID, time.Second)
	require.NoError(t, err)
	require.False(t, got.Pending())
	require.Empty(t, got.Error, "the retry was applied")
	require.Equal(t, 1, e.retries(st.ID))
	got, err = tool.GetRequest(ctx, restart.ID)
	require.NoError(t, err)
	require.NotEmpty(t, got.Error, "a running saga cannot be restarted: refused")

	_, err = tool.WithdrawRequest(ctx, retry.ID, "carol")
	require.ErrorIs(t, err, orchestrator.ErrRequestNotPending)
	_, err = tool.GetRequest(ctx, 1<<40)
	require.ErrorIs(t, err, orchestrator.ErrNotFound)
	all, err := tool.ListRequests(ctx, &orchestrator.ListRequestsOpts{All: true})
	require.NoError(t, err)
	require.Len(t, all, 2)
	require.Equal(t, restart.ID, all[0].ID, "every request, newest first")

	// A pending request withdrawn is never applied.
	cancel, err := tool.RequestAction(ctx, st.ID, "cancel", "dave", "changed my mind", nil)
	require.NoError(t, err)
	withdrawn, err := tool.WithdrawRequest(ctx, cancel.ID, "dave")
	require.NoError(t, err)
	require.False(t, withdrawn.Pending())
	require.Equal(t, "dave", withdrawn.WithdrawnBy)
	require.NoError(t, c.ApplyRequests(ctx))
	s, err := c.Get(ctx, st.ID)
	require.NoError(t, err)
	require.Equal(t, saga.StatusRunning, s.Status)
}
