package orchestrator_test

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

// Environment of the child orchestrator process.
const (
	childSchemaEnv    = "SAGABOX_TEST_CHILD_SCHEMA"
	childNamespaceEnv = "SAGABOX_TEST_CHILD_NAMESPACE"
)

// childRelay is the relay configuration of the child and of its successor:
// a short lease, so that rows the killed child had claimed are published
// again soon.
var childRelay = orchestrator.RelayConfig{PollInterval: 100 * time.Millisecond, Lease: 2 * time.Second, PublishTimeout: time.Second}

// runChildOrchestrator runs only an orchestrator, on the schema and broker
// namespace from the environment, until the process is killed.
func runChildOrchestrator() int {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbtest.URL())
	if err != nil {
		log.Error("child: open pool", "err", err)
		return 2
	}
	url := os.Getenv("TEST_AMQP_URL")
	if url == "" {
		url = amqptest.DefaultURL
	}
	ns := os.Getenv(childNamespaceEnv)
	b, err := rabbitmq.New(ctx, rabbitmq.Config{URL: url, Namespace: ns, ConnectionName: amqptest.ConnectionName(ns) + "-child", Logger: log})
	if err != nil {
		log.Error("child: connect broker", "err", err)
		return 2
	}
	c, err := orchestrator.NewClient(orchestrator.Config{
		Pool: pool, Schema: os.Getenv(childSchemaEnv), Service: "orders", Broker: b,
		Definitions: []saga.Runner{orderSaga(1, time.Minute, 1)}, Relay: childRelay, Logger: log,
	})
	if err != nil {
		log.Error("child: new client", "err", err)
		return 2
	}
	if err := c.Run(ctx); err != nil {
		log.Error("child: run", "err", err)
		return 1
	}
	return 0
}

// TestGuaranteeCrashedOrchestratorRecovers: an orchestrator process killed
// (SIGKILL) while sagas are in flight loses nothing: a new orchestrator on
// the same schema finishes every saga, with consistent business state.
func TestGuaranteeCrashedOrchestratorRecovers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	def := orderSaga(1, time.Minute, 1)
	// Shipping is not served until the child is dead, so that sagas are
	// caught in the middle: ship commands wait in their queue.
	ctx, cancel := context.WithTimeout(context.Background(), amqptest.Timeout)
	defer cancel()
	ship, err := newShipping(e)
	require.NoError(t, err)
	require.NoError(t, e.broker.Declare(ctx, ship.QueueSpec()))
	testkit.Run(t, e.inventory(false).Run)
	testkit.Run(t, e.payment(true).Run)
	starter := e.newOrchestrator(e.orchConfig(def))
	// The successor must declare the reply queue through the test's broker
	// (so that cleanup deletes it): declare it now, before the child.
	require.NoError(t, e.broker.Declare(ctx, orchestratorQueue))

	os_ := orders("k", 60, 7)
	ids := e.startAll(starter, def, os_)

	out := &testkit.Buffer{}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childSchemaEnv+"="+e.orch.Schema(), childNamespaceEnv+"="+e.ns)
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	// Kill it once a third of the sagas reached shipping (or ended).
	testkit.WaitFor(t, time.Minute, "sagas to progress in the child", func() bool {
		return e.count(`SELECT count(*) FROM %[1]s.sagabox_saga WHERE current_step = 2 OR status <> 'running'`) >= len(os_)/3
	})
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	killed = true
	progressed := e.count(`SELECT count(*) FROM %[1]s.sagabox_saga WHERE current_step = 2 OR status <> 'running'`)
	t.Logf("killed the orchestrator with %d of %d sagas at shipping or finished", progressed, len(os_))
	if t.Failed() {
		t.Logf("child output:\n%s", out.String())
	}

	cfg := e.orchConfig(def)
	cfg.Relay = childRelay
	c := e.runOrchestrator(cfg)
	testkit.Run(t, ship.Run)
	e.waitSettled(len(os_), time.Minute)
	for i, id := range ids {
		s, err := c.Get(context.Background(), id)
		require.NoError(t, err)
		require.Equal(t, expected(os_[i]), s.Status, "order %s: %q", os_[i].ID, s.LastError)
		e.checkBusiness(os_[i], s.Status)
	}
}
