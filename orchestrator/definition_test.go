package orchestrator_test

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
)

// An orchestrator records the shapes of its definitions when it starts, so
// that a client without them (the CLI's, the console's) reads them; one
// that starts with a definition changed under the same version says so.
func TestRunRecordsDefinitionShapes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	v1, v2 := orderSaga(1, time.Minute, 1), orderSaga(2, time.Minute, 3)
	e.runOrchestrator(e.orchConfig(v1, v2))

	reader, err := orchestrator.NewClient(orchestrator.Config{Pool: e.pool, Schema: e.orch.Schema(), Service: "reader"})
	require.NoError(t, err)
	var defs []orchestrator.RecordedDefinition
	testkit.WaitFor(t, 30*time.Second, "the orchestrator to record its definitions", func() bool {
		defs, err = reader.Definitions(ctx)
		require.NoError(t, err)
		return len(defs) == 2
	})
	require.Equal(t, "order", defs[0].Type)
	require.Equal(t, 1, defs[0].Version)
	require.Equal(t, v1.Shape(), defs[0].Shape)
	require.Equal(t, v2.Shape(), defs[1].Shape)
	require.False(t, defs[0].RegisteredAt.IsZero())
	require.False(t, defs[0].SeenAt.Before(defs[0].RegisteredAt))

	latest, err := reader.Definition(ctx, "order", 0)
	require.NoError(t, err)
	require.Equal(t, 2, latest.Version, "version 0 is the highest")
	first, err := reader.Definition(ctx, "order", 1)
	require.NoError(t, err)
	require.Equal(t, v1.Shape(), first.Shape)
	_, err = reader.Definition(ctx, "order", 3)
	require.ErrorIs(t, err, orchestrator.ErrNotFound)
	_, err = reader.Definition(ctx, "refund", 0)
	require.ErrorIs(t, err, orchestrator.ErrNotFound)
	require.ErrorContains(t, err, `"refund"`)
	_, err = reader.Definition(ctx, "order", -1)
	require.ErrorContains(t, err, "negative")

	// Another orchestrator of the schema starts with order v1 changed (a
	// local step first) without a new version: it records the new shape and
	// warns.
	ref := func(o *Order) OrderRef { return OrderRef{OrderID: o.ID} }
	changed := saga.MustNew("order", 1,
		saga.LocalStep("check", func(context.Context, *Order) error { return nil }),
		saga.Step("reserve", saga.Invoke(Reserve, func(o *Order) ReserveReq { return ReserveReq{OrderID: o.ID, Qty: o.Qty} }, nil),
			saga.Compensate(Release, ref), saga.WithTimeout[Order](time.Minute)),
	)
	logs := &testkit.Buffer{}
	cfg := e.orchConfig(changed)
	cfg.Service = "orders-2"
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	e.runOrchestrator(cfg)
	testkit.WaitFor(t, 30*time.Second, "the changed shape to be recorded", func() bool {
		d, err := reader.Definition(ctx, "order", 1)
		require.NoError(t, err)
		return d.Shape.Nodes[0].Name == "check"
	})
	require.Eventually(t, func() bool {
		return bytes.Contains([]byte(logs.String()), []byte("saga definition changed without a new version"))
	}, 30*time.Second, 20*time.Millisecond, "the warning about order v1")
	require.Contains(t, logs.String(), "saga_type=order version=1")
}
