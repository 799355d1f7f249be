package orchestrator_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store/driver"
)

// TestRestartFromAStep: a compensated saga (its charge was declined) is
// restarted from its first step on a newer version of its definition with
// corrected data. The participants perform the restarted steps again —
// their barriers keep a mark per run, where a mark of the first run would
// answer from the first run's outcome — and the saga completes in run 1.
// The restart is audited; restarts the core refuses, and unknown versions,
// are errors; an operator request (the CLI's path) restarts a saga too.
func TestRestartFromAStep(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	v1, v2 := orderSaga(1, time.Minute, 1), orderSaga(2, time.Minute, 1)
	testkit.Run(t, e.inventory(true).Run)
	testkit.Run(t, e.payment(true).Run)
	c := e.runOrchestrator(e.orchConfig(v1, v2))
	ctx := context.Background()

	o := Order{ID: "r-1", Qty: 1, Amount: declinedAmount, Address: "here"}
	st := e.start(c, v1, o, nil)
	out, err := orchestrator.Await(ctx, c, v1, st.ID, nil)
	require.NoError(t, err)
	require.Equal(t, saga.StatusCompensated, out.Status)

	_, err = c.Restart(ctx, st.ID, "alice", "", orchestrator.RestartOpts{From: "charge"})
	require.ErrorIs(t, err, saga.ErrInvalidTransition, "the reservation was released: the saga cannot restart after it")
	_, err = c.Restart(ctx, st.ID, "alice", "", orchestrator.RestartOpts{From: "reserve", Version: 3})
	require.ErrorIs(t, err, saga.ErrUnknownDefinition)
	_, err = c.Restart(ctx, st.ID, "alice", "", orchestrator.RestartOpts{From: "reserve", Data: json.RawMessage(`{"id":"r-1","amont":10}`)})
	require.ErrorIs(t, err, saga.ErrInvalidPayload)

	fixed := Order{ID: "r-1-fixed", Qty: 1, Amount: 10, Address: "here"}
	data, err := json.Marshal(fixed)
	require.NoError(t, err)
	s, err := c.Restart(ctx, st.ID, "alice", "card replaced", orchestrator.RestartOpts{From: "reserve", Version: 2, Data: data})
	require.NoError(t, err)
	require.Equal(t, saga.StatusRunning, s.Status)
	require.Equal(t, 1, s.Run)
	require.Equal(t, 2, s.Version)
	waitStatus(t, c, st.ID, saga.StatusCompleted, 30*time.Second)
	e.checkBusiness(fixed, saga.StatusCompleted)
	e.checkBusiness(o, saga.StatusCompensated)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM %[1]s.sagabox_saga_v WHERE id = $1 AND run = 1 AND version = 2`, st.ID))
	require.Equal(t, 2, e.count(`SELECT count(*) FROM %[2]s.sagabox_barrier WHERE saga_id = $1 AND step IN ('reserve', 'reserve' || chr(31) || '1') AND phase = 'action'`, st.ID),
		"one action mark per run")
	h, err := c.History(ctx, st.ID)
	require.NoError(t, err)
	var restarted *saga.HistoryEntry
	for i := range h {
		if h[i].Event == saga.HistoryRestarted {
			restarted = &h[i]
		}
	}
	require.NotNil(t, restarted)
	require.Equal(t, "alice", restarted.Actor)
	require.Equal(t, `from step "reserve": run 1, after run 0 ended compensated; definition version 2, was 1; data replaced by the operator: card replaced`, restarted.Detail)

	// Through an operator request, as the CLI records it.
	declined := e.start(c, v2, Order{ID: "r-2", Qty: 1, Amount: declinedAmount, Address: "here"}, nil)
	waitStatus(t, c, declined.ID, saga.StatusCompensated, 30*time.Second)
	params, err := json.Marshal(orchestrator.RestartOpts{From: "reserve", Data: json.RawMessage(`{"id":"r-2-fixed","qty":1,"amount":20,"address":"here"}`)})
	require.NoError(t, err)
	op, err := e.orch.OperationRequest(ctx, driver.NewOperation{SagaID: declined.ID, Action: "restart", Actor: "bob", Reason: "retry with a smaller amount", Params: params})
	require.NoError(t, err)
	c.Wake()
	waitStatus(t, c, declined.ID, saga.StatusCompleted, 30*time.Second)
	applied, err := e.orch.OperationGet(ctx, op.ID)
	require.NoError(t, err)
	require.Empty(t, applied.Error)
	requireRestarted := e.count(`SELECT count(*) FROM %[1]s.sagabox_saga_history WHERE saga_id = $1 AND event = 'restarted' AND actor = 'bob'`, declined.ID)
	require.Equal(t, 1, requireRestarted)

	// A request the core refuses is marked with the reason.
	bad, err := e.orch.OperationRequest(ctx, driver.NewOperation{SagaID: declined.ID, Action: "restart", Actor: "bob", Reason: "again", Params: params})
	require.NoError(t, err)
	c.Wake()
	testkit.WaitFor(t, 30*time.Second, "the refused request to be marked", func() bool {
		op, err := e.orch.OperationGet(ctx, bad.ID)
		require.NoError(t, err)
		return !op.Pending()
	})
	refused, err := e.orch.OperationGet(ctx, bad.ID)
	require.NoError(t, err)
	require.Contains(t, refused.Error, "only a failed or compensated saga can be restarted, this one is completed")
}
