package orchestrator_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/orchestrator"
)

// ConnsNeeded says what the documentation says: a connection per worker and
// per relay worker, three for the sweeper, the admission (with operator
// requests) and retention, one more for a listening relay.
func TestConnsNeededCountsWhatRunHolds(t *testing.T) {
	t.Parallel()
	require.Equal(t, orchestrator.DefaultWorkers+2+3, orchestrator.Config{}.ConnsNeeded())
	cfg := orchestrator.Config{Workers: 4, Relay: orchestrator.RelayConfig{Workers: 3, Listen: true}}
	require.Equal(t, 4+3+3+1, cfg.ConnsNeeded())
}

// A pool smaller than ConnsNeeded is reported when the orchestrator starts,
// with the numbers; a pool of exactly ConnsNeeded is not.
func TestOrchestratorPoolTooSmallIsReportedAtStart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cfg := e.orchConfig(holdSaga())
	cfg.Workers = 4
	need := cfg.ConnsNeeded()

	logs := runLogged(t, cfg, int32(need-1))
	testkit.WaitFor(t, 10*time.Second, "the warning", func() bool { return strings.Contains(logs.String(), "conns_needed=") })
	require.Contains(t, logs.String(), "is smaller than the 9 this client can use at once")

	logs = runLogged(t, cfg, int32(need))
	testkit.WaitFor(t, 10*time.Second, "the relay to start", func() bool { return strings.Contains(logs.String(), "relay started") })
	require.NotContains(t, logs.String(), "conns_needed=", "a pool of ConnsNeeded connections is large enough")
}

// runLogged runs an orchestrator for cfg on a pool of size connections of
// the same database until the test ends, and returns its log.
func runLogged(t *testing.T, cfg orchestrator.Config, size int32) *testkit.Buffer {
	t.Helper()
	cfg.Pool = dbtest.PoolWith(t, func(c *pgxpool.Config) { c.MaxConns = size })
	logs := &testkit.Buffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	c, err := orchestrator.NewClient(cfg)
	require.NoError(t, err)
	testkit.Run(t, c.Run)
	return logs
}
