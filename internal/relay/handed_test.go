package relay

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store/driver"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

// writeLeased writes msgs in a transaction of the engine under lease (as a
// delivery's transition write does), hands the rows its commit leased to
// r, as the engine does, and reports the rows it wrote unleased.
func writeLeased(t *testing.T, s *dbtest.DB, r *Relay, lease *driver.OutboxLease, msgs []message.Message) (unleased int) {
	t.Helper()
	tx := s.Begin(&driver.BeginOpts{Lease: lease})
	defer tx.Rollback(context.Background())
	require.NoError(t, s.SagaWrite(context.Background(), tx, []driver.Transition{{Messages: msgs}}, time.Now()))
	c := dbtest.Commit(t, tx)
	r.Hand(c.Leased)
	return c.Unleased
}

// waitLease returns the relay's write-time lease once its workers run.
func waitLease(t *testing.T, r *Relay) *driver.OutboxLease {
	t.Helper()
	var l *driver.OutboxLease
	require.Eventually(t, func() bool {
		l = r.WriteLease()
		return l != nil
	}, waitFor, time.Millisecond)
	return l
}

// Rows written under the relay's write-time lease are published on commit
// without a claim (a structural count of statements), those of one key in
// order, and settled afterwards: a clean stop leaves none behind.
func TestHandedRowsArePublishedWithoutAClaim(t *testing.T) {
	t.Parallel()
	var rts dbtest.RoundTrips
	pool := dbtest.PoolWith(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = &rts })
	s := dbtest.StoreOnPool(t, pool)
	b := amqptest.NewBroker(t, rabbitmq.Config{})
	snk := newSink(t, b)
	r, stop := runRelay(t, testConfig{Store: s, Publisher: b, Options: Options{Workers: 2, PollInterval: time.Hour}, SettleDelay: time.Hour})
	waitLease(t, r)

	const n = 20
	rts.Start()
	for i := range n {
		// Each write asks for the lease anew, as each delivery does.
		require.Zero(t, writeLeased(t, s, r, waitLease(t, r), events(fmt.Sprintf("k%d", i), 0, 3)))
	}
	snk.waitDistinct(t, 3*n)
	rts.Stop()
	// Only the workers' first claims, at start, may fall after the count
	// began (see warmUpClaims); a claim per write would be n.
	require.LessOrEqual(t, rts.Count("OutboxClaim"), warmUpClaims(2), "handed rows need no claim")
	_, order := snk.snapshot()
	for i := range n {
		require.Equal(t, []int{0, 1, 2}, order[fmt.Sprintf("k%d", i)], "one key's rows arrive in order")
	}
	stop()
	waitBacklogZero(t, s)
}

// A row whose key has an earlier unpublished row is written unleased and
// published after that row, by a claim.
func TestRowBehindAnUnpublishedRowWaitsForAClaim(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t)
	b := amqptest.NewBroker(t, rabbitmq.Config{})
	snk := newSink(t, b)
	r, _ := runRelay(t, testConfig{Store: s, Publisher: b, Options: Options{Workers: 2, PollInterval: time.Hour}})
	lease := waitLease(t, r)
	writeCommitted(t, s, events("k", 0, 1)) // no wake-up: it waits for one
	require.Equal(t, 1, writeLeased(t, s, r, lease, events("k", 1, 1)), "the row behind an unpublished one is not leased")
	r.Wake() // as the engine does after a write with unleased rows
	snk.waitDistinct(t, 2)
	_, order := snk.snapshot()
	require.Equal(t, []int{0, 1}, order["k"])
}

// Rows leased at write by a relay that never publishes them (its process
// died after the commit) are published by another relay once their lease
// ends: the lease loses nothing.
func TestRowsLeasedByADeadRelayArePublishedAfterTheLease(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t)
	b := amqptest.NewBroker(t, rabbitmq.Config{})
	snk := newSink(t, b)
	dead := &driver.OutboxLease{Lease: 300 * time.Millisecond, ClaimedBy: "dead-relay"}
	tx := s.Begin(&driver.BeginOpts{Lease: dead})
	defer tx.Rollback(context.Background())
	require.NoError(t, s.SagaWrite(context.Background(), tx, []driver.Transition{{Messages: events("k", 0, 3)}}, time.Now()))
	require.Len(t, dbtest.Commit(t, tx).Leased, 3, "leased, and never handed: the relay died")
	runRelay(t, testConfig{Store: s, Publisher: b, Options: Options{Workers: 1, PollInterval: 50 * time.Millisecond}})
	snk.waitDistinct(t, 3)
	_, order := snk.snapshot()
	require.Equal(t, []int{0, 1, 2}, order["k"])
	waitBacklogZero(t, s)
}

// A relay gives no lease while it does not run, nor in log mode.
func TestWriteLeaseOnlyWhileRunning(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t)
	b := amqptest.NewBroker(t, rabbitmq.Config{})
	r, err := New(s.Executor, b, Options{}, Schema{}, amqptest.Logger(t))
	require.NoError(t, err)
	require.Nil(t, r.WriteLease(), "a relay that does not run gives no lease")
	running, stop := runRelay(t, testConfig{Store: s, Publisher: b})
	l := waitLease(t, running)
	require.Equal(t, running.name, l.ClaimedBy)
	stop()
	require.Nil(t, running.WriteLease(), "a stopped relay gives no lease")
	logRelay, err := New(s.Executor, b, Options{Mode: ModeLog}, Schema{}, amqptest.Logger(t))
	require.NoError(t, err)
	logRelay.leasing.Store(true)
	require.Nil(t, logRelay.WriteLease(), "a relay reading the log gives no lease")
}
