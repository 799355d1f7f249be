package orchestrator_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/saga"
)

// maxBusinessRoundTrips is the most round trips to PostgreSQL that sagabox
// spends in the business transactions of one completed three-step saga:
// the start (two statements in the caller's transaction: the admission
// check of flow control, which a definition without a limit skips, and the
// start itself) and, for each step, the participant's delivery (two round
// trips: the first statement goes out with BEGIN, the last with COMMIT;
// the handler runs between them) and the orchestrator's reply (one: the
// saga is in the Client's cache, Config.SagaCache, so its inbox record and
// its write go out together). The handlers' own statements are not
// counted. The first version took 49.
const maxBusinessRoundTrips = 11

// maxBusinessRoundTripsUncached is maxBusinessRoundTrips without the saga
// cache: each reply reads and locks its saga with BEGIN, then writes with
// COMMIT.
const maxBusinessRoundTripsUncached = 14

// TestRoundTripsPerSaga counts, through a pgx tracer, the round trips of
// the business transactions of one three-step saga that completes: a
// structural property of the store's operations, not a timing.
func TestRoundTripsPerSaga(t *testing.T) {
	t.Parallel()
	t.Run("saga cache", func(t *testing.T) {
		t.Parallel()
		replies := countRoundTrips(t, 0, maxBusinessRoundTrips)
		for _, n := range replies {
			require.Equal(t, 1, n, "a reply to a saga the orchestrator keeps takes one round trip")
		}
	})
	t.Run("no saga cache", func(t *testing.T) {
		t.Parallel()
		countRoundTrips(t, -1, maxBusinessRoundTripsUncached)
	})
}

// countRoundTrips runs one counted saga on an orchestrator whose
// Config.SagaCache is cache, checks that its business transactions take at
// most max engine round trips, and returns the round trips of each reply's
// transaction.
func countRoundTrips(t *testing.T, cache, max int) (replies []int) {
	t.Helper()
	var rts dbtest.RoundTrips
	pool := dbtest.PoolWith(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = &rts })
	e := newEnvOnPool(t, pool)
	def := orderSaga(1, time.Minute, 1)
	cfg := e.orchConfig(def)
	cfg.SweepInterval = time.Hour
	cfg.SagaCache = cache
	c := e.runOrchestrator(cfg)
	testkit.Run(t, e.inventory(true).Run)
	testkit.Run(t, e.payment(true).Run)

	// The first saga warms the connections' statement caches.
	warm := e.start(c, def, Order{ID: "warm", Qty: 1, Amount: 10, Address: "here"}, nil)
	waitStatus(t, c, warm.ID, saga.StatusCompleted, 30*time.Second)

	rts.Start()
	st := e.start(c, def, Order{ID: "counted", Qty: 1, Amount: 10, Address: "here"}, nil)
	waitStatus(t, c, st.ID, saga.StatusCompleted, 30*time.Second)
	rts.Stop()

	total, business := 0, 0
	for _, tx := range rts.Transactions() {
		if !isBusiness(tx) {
			continue
		}
		business++
		// The start runs in the caller's transaction: its BEGIN and COMMIT
		// are the caller's round trips, which it spends on its own writes
		// anyway.
		callers := tx.Has("SagaStart")
		n := 0
		for _, rt := range tx.RoundTrips {
			if isEngine(rt) && (!callers || !isTxControl(rt)) {
				n++
			}
		}
		total += n
		if tx.Has("SagaReceive") || tx.Has("SagaReceiveKnown") {
			replies = append(replies, n)
		}
		t.Logf("transaction of %d engine round trips: %s", n, summary(tx))
	}
	t.Logf("%d business transactions, %d engine round trips", business, total)
	require.Equal(t, 7, business, "start + 3 × (participant delivery + orchestrator reply)")
	require.Len(t, replies, 3, "three replies")
	require.LessOrEqual(t, total, max)
	return replies
}

// isBusiness reports whether tx is one of a saga's business transactions:
// it starts a saga or receives a message. Background work (the relay, the
// sweeper, gauges, retention) never does.
func isBusiness(tx dbtest.Transaction) bool {
	for _, name := range []string{"SagaStart", "SagaReceive", "SagaReceiveKnown", "DeliveryBeginAction", "DeliveryBeginCompensation", "InboxRecord"} {
		if tx.Has(name) {
			return true
		}
	}
	return false
}

// isTxControl reports whether rt carries only transaction control.
func isTxControl(rt dbtest.RoundTrip) bool {
	for _, s := range rt.SQL {
		u := strings.ToUpper(strings.TrimSpace(s))
		if !strings.HasPrefix(u, "BEGIN") && !strings.HasPrefix(u, "COMMIT") {
			return false
		}
	}
	return true
}

// isEngine reports whether rt is sagabox's: it carries a statement on a
// sagabox table or a transaction control statement. Round trips that carry
// only a handler's own statements are the handler's cost, not the engine's.
func isEngine(rt dbtest.RoundTrip) bool {
	for _, s := range rt.SQL {
		u := strings.ToUpper(strings.TrimSpace(s))
		if strings.Contains(s, "sagabox_") || strings.HasPrefix(u, "BEGIN") || strings.HasPrefix(u, "COMMIT") ||
			strings.HasPrefix(u, "ROLLBACK") || strings.HasPrefix(u, "SAVEPOINT") || strings.HasPrefix(u, "RELEASE") {
			return true
		}
	}
	return false
}

// summary names the statements of each round trip of tx.
func summary(tx dbtest.Transaction) string {
	var parts []string
	for _, rt := range tx.RoundTrips {
		var names []string
		for _, s := range rt.SQL {
			name, _, _ := strings.Cut(strings.TrimPrefix(s, "-- name: "), " ")
			names = append(names, name)
		}
		parts = append(parts, "["+strings.Join(names, " ")+"]")
	}
	return strings.Join(parts, " ")
}
