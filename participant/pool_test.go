package participant_test

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/participant"
)

// A pool too small for the workers the client runs is reported when the
// client starts, with the numbers: a silent pool bottleneck shows as
// nothing but slowness.
func TestPoolTooSmallIsReportedAtStart(t *testing.T) {
	t.Parallel()
	pool := dbtest.PoolWith(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 3 })
	e := newEnvOnPool(t, pool)
	var logs testkit.Buffer
	b := e.newBroker()
	cfg := e.config(b)
	cfg.Workers = 4
	require.Equal(t, 4+2+1, cfg.ConnsNeeded(), "the workers, the relay's two and retention")
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	c, err := participant.NewClient(cfg)
	require.NoError(t, err)
	inventory(e, c)
	stop := e.start(c, b)
	testkit.WaitFor(t, waitFor, "the warning", func() bool { return bytes.Contains([]byte(logs.String()), []byte("conns_needed=")) })
	require.NoError(t, stop())
	require.Contains(t, logs.String(), "the connection pool (3 connections) is smaller than the 7 this client can use at once")
	require.Contains(t, logs.String(), "pool_max_conns=3")

	// A pool of the right size gets no warning.
	var quiet testkit.Buffer
	cfg.Logger = slog.New(slog.NewTextHandler(&quiet, nil))
	cfg.Pool = dbtest.Pool(t) // 8 connections
	c, err = participant.NewClient(cfg)
	require.NoError(t, err)
	inventory(e, c)
	stop = e.start(c, b)
	testkit.WaitFor(t, waitFor, "the client to start", func() bool { return bytes.Contains([]byte(quiet.String()), []byte("relay started")) })
	require.NoError(t, stop())
	require.NotContains(t, quiet.String(), "conns_needed=")
}
