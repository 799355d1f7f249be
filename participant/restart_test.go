package participant_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/internal/testkit/servers"
	"github.com/sagabox/sagabox/participant"
	"github.com/sagabox/sagabox/store"
)

// A client started while its database is down waits for it (logging why)
// instead of failing, and handles commands once it is up: Run returns no
// transient error. A private cluster, so that stopping it disturbs no one.
func TestRunWaitsForTheDatabase(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pg, err := servers.StartPostgres(ctx, servers.PostgresOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, pg.Close()) })
	pool, err := pgxpool.New(ctx, pg.URL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	st, err := store.New(pool, "inv")
	require.NoError(t, err)
	_, err = st.MigrateUp(ctx, store.LineMessaging)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `CREATE TABLE inv.stock (sku text PRIMARY KEY, qty integer NOT NULL); INSERT INTO inv.stock VALUES ('a', 5)`)
	require.NoError(t, err)
	require.NoError(t, pg.Stop(ctx, "fast"))

	e := newEnv(t) // for the broker namespace and the reply sink
	b := e.newBroker()
	cfg := e.config(b)
	cfg.Pool, cfg.Schema = pool, "inv"
	var logs testkit.Buffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	c, err := participant.NewClient(cfg)
	require.NoError(t, err)
	participant.HandleCommand(c, Reserve, func(ctx context.Context, tx pgx.Tx, req *participant.Request[ReserveReq]) (ReserveReply, error) {
		var left int
		err := tx.QueryRow(ctx, `UPDATE inv.stock SET qty = qty - $2 WHERE sku = $1 RETURNING qty`, req.Data.SKU, req.Data.Qty).Scan(&left)
		return ReserveReply{Remaining: left}, err
	})
	runErr := make(chan error, 1)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	require.NoError(t, b.Declare(ctx, c.QueueSpec()))
	go func() { runErr <- c.Run(runCtx) }()

	testkit.WaitFor(t, waitFor, "the client to report the wait", func() bool { return strings.Contains(logs.String(), "check the schema: not reachable yet; retrying") })
	select {
	case err := <-runErr:
		t.Fatalf("Run returned while the database was down: %v", err)
	default:
	}
	require.NoError(t, pg.Start(ctx))
	cmd := reserve(uuid.New(), "a", 2)
	e.publish(cmd)
	requireSuccess(t, e.replies.wait(t, cmd.MessageID))
	stop()
	require.NoError(t, <-runErr, "Run returns no error once stopped")
}
