package orchestrator_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
)

// startTx starts a saga of def in its own transaction and commits it if
// Start succeeded.
func startTx[D any](t *testing.T, e *env, c *orchestrator.Client, def *saga.Definition[D], data D, opts *orchestrator.StartOpts) (*orchestrator.Started, error) {
	t.Helper()
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	st, err := orchestrator.Start(ctx, c, tx, def, data, opts)
	if err != nil {
		return nil, err
	}
	require.NoError(t, tx.Commit(ctx))
	return st, nil
}

// TestGuaranteeStartKeyDifferentDataIsRejected: by default a start whose
// key names a saga started with other data fails with a typed error and
// writes nothing; the same data (whatever its JSON key order) returns the
// first saga; StartKeyReturnExisting returns it whatever the data.
func TestGuaranteeStartKeyDifferentDataIsRejected(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	def := orderSaga(1, time.Minute, 1)
	c := e.newOrchestrator(e.orchConfig(def))
	key := &orchestrator.StartOpts{StartKey: "o-1"}
	first, err := startTx(t, e, c, def, Order{ID: "o-1", Qty: 1, Amount: 10, Address: "here"}, key)
	require.NoError(t, err)
	require.False(t, first.Existing)
	rows := func() []int {
		return []int{
			e.count(`SELECT count(*) FROM %[1]s.sagabox_saga`),
			e.count(`SELECT count(*) FROM %[1]s.sagabox_saga_history`),
			e.count(`SELECT count(*) FROM %[1]s.sagabox_outbox`),
		}
	}
	before := rows()

	again, err := startTx(t, e, c, def, Order{ID: "o-1", Qty: 1, Amount: 10, Address: "here"}, key)
	require.NoError(t, err)
	require.True(t, again.Existing)
	require.Equal(t, first.ID, again.ID)

	// The same data as JSON with its keys in another order is the same start.
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	raw := json.RawMessage(`{"address": "here", "amount": 10, "qty": 1, "id": "o-1"}`)
	same, err := c.StartJSON(ctx, tx, "order", 1, raw, key)
	require.NoError(t, err)
	require.Equal(t, first.ID, same.ID)
	require.NoError(t, tx.Rollback(ctx))

	_, err = startTx(t, e, c, def, Order{ID: "o-1", Qty: 2, Amount: 10, Address: "here"}, key)
	require.ErrorIs(t, err, orchestrator.ErrStartKeyConflict)
	require.ErrorIs(t, err, saga.ErrStartKeyConflict)
	var conflict *orchestrator.StartKeyConflictError
	require.True(t, errors.As(err, &conflict))
	require.Equal(t, first.ID, conflict.Existing)
	require.Equal(t, "o-1", conflict.StartKey)
	require.Equal(t, saga.StatusRunning, conflict.Status)
	require.Equal(t, before, rows(), "a rejected start writes nothing")

	existing, err := startTx(t, e, c, def, Order{ID: "o-1", Qty: 2, Amount: 10, Address: "here"},
		&orchestrator.StartOpts{StartKey: "o-1", StartKeyPolicy: orchestrator.StartKeyReturnExisting})
	require.NoError(t, err)
	require.Equal(t, first.ID, existing.ID)
	require.Equal(t, before, rows())

	_, err = startTx(t, e, c, def, Order{ID: "o-1"}, &orchestrator.StartOpts{StartKey: "o-1", StartKeyPolicy: 7})
	require.ErrorContains(t, err, "StartKeyPolicy")
}

// TestStartKeyReuseFinished: with StartKeyReuseFinished a key names a new
// saga once the saga it named finished; the old one keeps the key, marked
// released, with a history entry. While the saga it names runs, the key
// behaves as by default. Two concurrent reusing starts start one saga.
func TestStartKeyReuseFinished(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// A saga of local steps only finishes within its Start.
	local := saga.MustNew("local", 1, noteLocal("only", nil))
	def := orderSaga(1, time.Minute, 1)
	c := e.newOrchestrator(e.orchConfig(local, def))
	ctx := context.Background()
	reuse := func(key string) *orchestrator.StartOpts {
		return &orchestrator.StartOpts{StartKey: key, StartKeyPolicy: orchestrator.StartKeyReuseFinished}
	}
	startLocal := func(o Order, opts *orchestrator.StartOpts) (*orchestrator.Started, error) {
		tx, err := e.pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		_, err = tx.Exec(ctx, `SELECT set_config('test.schema', $1, true)`, `"`+e.inv.Schema()+`"`)
		require.NoError(t, err)
		st, err := orchestrator.Start(ctx, c, tx, local, o, opts)
		if err != nil {
			return nil, err
		}
		require.NoError(t, tx.Commit(ctx))
		return st, nil
	}

	first, err := startLocal(Order{ID: "a"}, reuse("sub-1"))
	require.NoError(t, err)
	require.Equal(t, saga.StatusCompleted, first.Status)
	// The default policy returns the finished saga.
	again, err := startLocal(Order{ID: "a"}, &orchestrator.StartOpts{StartKey: "sub-1"})
	require.NoError(t, err)
	require.Equal(t, first.ID, again.ID)

	second, err := startLocal(Order{ID: "b"}, reuse("sub-1"))
	require.NoError(t, err)
	require.False(t, second.Existing)
	require.NotEqual(t, first.ID, second.ID)
	s, err := c.GetByKey(ctx, "local", "sub-1")
	require.NoError(t, err)
	require.Equal(t, second.ID, s.ID, "the key names the new saga")
	res, err := c.List(ctx, &orchestrator.ListOpts{StartKey: "sub-1"})
	require.NoError(t, err)
	require.Len(t, res.Sagas, 2, "the old saga keeps its key")
	h, err := c.History(ctx, first.ID)
	require.NoError(t, err)
	require.Equal(t, orchestrator.HistoryStartKeyReleased, h[len(h)-1].Event)
	require.Contains(t, h[len(h)-1].Detail, second.ID.String())

	// A reusing start that fails (its local step's insert collides with
	// the second saga's) leaves the caller's transaction usable and the key
	// with the second saga.
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, `SELECT set_config('test.schema', $1, true)`, `"`+e.inv.Schema()+`"`)
	require.NoError(t, err)
	_, err = orchestrator.Start(ctx, c, tx, local, Order{ID: "b"}, reuse("sub-1"))
	require.Error(t, err)
	require.NoError(t, tx.Commit(ctx))
	s, err = c.GetByKey(ctx, "local", "sub-1")
	require.NoError(t, err)
	require.Equal(t, second.ID, s.ID, "the failed start released nothing")
	require.False(t, s.FinishedAt.IsZero())

	// A running saga keeps its key: the same data returns it, other data
	// is a conflict.
	running, err := startTx(t, e, c, def, Order{ID: "r", Qty: 1, Amount: 10, Address: "here"}, reuse("r"))
	require.NoError(t, err)
	again, err = startTx(t, e, c, def, Order{ID: "r", Qty: 1, Amount: 10, Address: "here"}, reuse("r"))
	require.NoError(t, err)
	require.Equal(t, running.ID, again.ID)
	_, err = startTx(t, e, c, def, Order{ID: "r", Qty: 5, Amount: 10, Address: "here"}, reuse("r"))
	require.ErrorIs(t, err, orchestrator.ErrStartKeyConflict)

	// Two reusing starts at once: the second waits for the first's
	// transaction and then finds the key held by the saga it started.
	tx1, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx1.Rollback(ctx)
	_, err = tx1.Exec(ctx, `SELECT set_config('test.schema', $1, true)`, `"`+e.inv.Schema()+`"`)
	require.NoError(t, err)
	won, err := orchestrator.Start(ctx, c, tx1, local, Order{ID: "c"}, reuse("sub-1"))
	require.NoError(t, err)
	lost := make(chan *orchestrator.Started, 1)
	go func() {
		st, err := startLocal(Order{ID: "c"}, reuse("sub-1"))
		if err != nil {
			t.Errorf("second start: %v", err)
		}
		lost <- st
	}()
	testkit.WaitFor(t, 30*time.Second, "the second start to wait for the first", func() bool {
		var n int
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1::text || '%'`, e.orch.Schema()).Scan(&n))
		return n > 0
	})
	require.NoError(t, tx1.Commit(ctx))
	st := <-lost
	require.NotNil(t, st)
	require.True(t, st.Existing)
	require.Equal(t, won.ID, st.ID)
	require.Equal(t, 3, e.count(`SELECT count(*) FROM %[1]s.sagabox_saga WHERE start_key = 'sub-1'`))
	require.Equal(t, 1, e.count(`SELECT count(*) FROM %[1]s.sagabox_saga WHERE start_key = 'sub-1' AND NOT start_key_released`))
}
