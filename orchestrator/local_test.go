package orchestrator_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
)

// noteLocal is a local step that writes a reservation row for order id+name
// in the orchestrator's transaction, then returns result.
func noteLocal(name string, result error) *saga.StepSpec[Order] {
	return saga.LocalStep(name, func(ctx context.Context, o *Order) error {
		tx := orchestrator.TxFromContext(ctx)
		var schema string
		if err := tx.QueryRow(ctx, `SELECT current_setting('test.schema')`).Scan(&schema); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+schema+`.reservations (order_id, qty) VALUES ($1, 1)`, o.ID+"-"+name); err != nil {
			return err
		}
		return result
	})
}

// TestGuaranteeAtomicStartLocalStepRejectionUndoesItsWrites: a local step
// that rejects did nothing (its step is "rejected" and is not compensated),
// so its writes are rolled back while those of the local steps before it
// are kept; a local step that fails makes Start fail without leaving any
// write of the saga in the caller's transaction, which stays usable.
func TestGuaranteeAtomicStartLocalStepRejectionUndoesItsWrites(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rejects := saga.MustNew("local-rejects", 1, noteLocal("kept", nil), noteLocal("rejected", saga.Reject(errors.New("over the limit"))))
	fails := saga.MustNew("local-fails", 1, noteLocal("kept", nil), noteLocal("failed", errors.New("printer out of paper")))
	c := e.newOrchestrator(e.orchConfig(rejects, fails))
	ctx := context.Background()
	begin := func() pgx.Tx {
		tx, err := e.pool.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(ctx) })
		_, err = tx.Exec(ctx, `SELECT set_config('test.schema', $1, true)`, pgx.Identifier{e.inv.Schema()}.Sanitize())
		require.NoError(t, err)
		return tx
	}

	tx := begin()
	st, err := orchestrator.Start(ctx, c, tx, rejects, Order{ID: "r"}, nil)
	require.NoError(t, err)
	require.Equal(t, saga.StatusCompensated, st.Status)
	require.NoError(t, tx.Commit(ctx))
	s, err := c.Get(ctx, st.ID)
	require.NoError(t, err)
	require.Equal(t, saga.StepRejected, s.Steps[1].Status)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM %[2]s.reservations WHERE order_id = 'r-kept'`))
	require.Zero(t, e.count(`SELECT count(*) FROM %[2]s.reservations WHERE order_id = 'r-rejected'`), "the rejected step's write is rolled back")

	tx = begin()
	_, err = tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{e.inv.Schema()}.Sanitize()+`.reservations (order_id, qty) VALUES ('callers', 1)`)
	require.NoError(t, err)
	_, err = orchestrator.Start(ctx, c, tx, fails, Order{ID: "f"}, nil)
	require.ErrorContains(t, err, "printer out of paper")
	require.NoError(t, tx.Commit(ctx), "the caller's transaction is still usable")
	require.Equal(t, 1, e.count(`SELECT count(*) FROM %[2]s.reservations WHERE order_id = 'callers'`))
	require.Zero(t, e.count(`SELECT count(*) FROM %[2]s.reservations WHERE order_id LIKE 'f-%%'`), "a failed Start leaves no local step's write")
	require.Zero(t, e.count(`SELECT count(*) FROM %[1]s.sagabox_saga WHERE saga_type = 'local-fails'`))
}

// A saga started by a local step, in the transaction of the reply before
// it, gets its first command published with no poll to fall back on (the
// relay polls hourly here): the reply's transaction writes its own
// commands under the relay's write-time lease, and the rows it writes
// without it still reach a claim (the store tells the lease of them:
// TestUnleasedWritesAreNoted).
func TestSagaStartedByALocalStepIsPublishedAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	testkit.Run(t, e.inventory(false).Run)
	child := saga.MustNew("child", 1,
		saga.Step("reserve", saga.Invoke(Reserve, func(o *Order) ReserveReq { return ReserveReq{OrderID: o.ID, Qty: 1} }, nil)))
	var c *orchestrator.Client
	var childID atomic.Value
	parent := saga.MustNew("parent", 1,
		saga.Step("reserve", saga.Invoke(Reserve, func(o *Order) ReserveReq { return ReserveReq{OrderID: o.ID, Qty: 1} }, nil)),
		saga.LocalStep("spawn", func(ctx context.Context, o *Order) error {
			st, err := orchestrator.Start(ctx, c, orchestrator.TxFromContext(ctx), child, Order{ID: o.ID + "-child"}, nil)
			if err == nil {
				childID.Store(st.ID)
			}
			return err
		}))
	cfg := e.orchConfig(parent, child)
	cfg.Relay.PollInterval = time.Hour
	c = e.runOrchestrator(cfg)
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	st, err := orchestrator.Start(ctx, c, tx, parent, Order{ID: "p"}, nil)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	c.Wake()
	waitStatus(t, c, st.ID, saga.StatusCompleted, 20*time.Second)
	require.NotNil(t, childID.Load(), "the local step started the child")
	waitStatus(t, c, childID.Load().(uuid.UUID), saga.StatusCompleted, 20*time.Second)
}
