package orchestrator_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
)

// Environment of the child process that starts a saga.
const (
	starterSchemaEnv = "SAGABOX_TEST_STARTER_SCHEMA"
	starterOrderEnv  = "SAGABOX_TEST_STARTER_ORDER"
)

// runChildStarter starts one saga, as a web process would: a client without
// broker or relay of its own, with Relay.Notify, in a transaction of its
// own. It prints the saga id.
func runChildStarter() int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbtest.URL())
	if err != nil {
		return 2
	}
	defer pool.Close()
	def := orderSaga(1, time.Minute, 1)
	c, err := orchestrator.NewClient(orchestrator.Config{
		Pool: pool, Schema: os.Getenv(starterSchemaEnv), Service: "orders",
		Definitions: []saga.Runner{def}, Relay: orchestrator.RelayConfig{Notify: true},
	})
	if err != nil {
		return 2
	}
	var id uuid.UUID
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		st, err := orchestrator.Start(ctx, c, tx, def, Order{ID: os.Getenv(starterOrderEnv), Qty: 1, Amount: 10, Address: "here"}, nil)
		if err == nil {
			id = st.ID
		}
		return err
	})
	if err != nil {
		fmt.Fprint(os.Stderr, err)
		return 1
	}
	fmt.Fprint(os.Stdout, id)
	return 0
}

// A saga started in another process, by a client that runs no relay, is
// published at once by the orchestrator's relay through LISTEN/NOTIFY
// (Relay.Notify on the writer, Relay.Listen on the relay): the relay's
// poll interval is an hour, so nothing else could wake it in time.
func TestNotifyWakesTheRelayOfAnotherProcess(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	def := orderSaga(1, time.Minute, 1)
	cfg := e.orchConfig(def)
	cfg.Relay = orchestrator.RelayConfig{Listen: true, PollInterval: time.Hour}
	c := e.runOrchestrator(cfg)
	testkit.Run(t, e.inventory(true).Run)
	testkit.Run(t, e.payment(true).Run)
	// The relay's listener is in place once its LISTEN is the last
	// statement of a connection.
	testkit.WaitFor(t, 30*time.Second, "the relay to LISTEN", func() bool {
		var n int
		err := e.pool.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %' || $1 || '%'`, e.orch.Schema()).Scan(&n)
		return err == nil && n == 1
	})

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), starterSchemaEnv+"="+e.orch.Schema(), starterOrderEnv+"=notified")
	out, err := cmd.Output()
	require.NoError(t, err, "the starter process failed: %s", out)
	id, err := uuid.Parse(string(out))
	require.NoError(t, err, "the starter prints the saga id: %q", out)
	s := waitStatus(t, c, id, saga.StatusCompleted, 30*time.Second)
	o, err := def.DecodeData(s.Data)
	require.NoError(t, err)
	require.Equal(t, "notified", o.ID)
}
