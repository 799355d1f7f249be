package relay

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/internal/testkit/servers"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

// A primary whose commits wait for a synchronous standby streams each
// commit to the log relay before the transaction is visible to other
// sessions. The log relay must neither take such a row for deleted (a late
// row is looked up before it is published: it would never be published) nor
// settle it before it is visible (the delete finds no row, and the row
// stays in the outbox, unpublished, for ever): it waits until the
// transactions it streamed are visible. The standby's replay is paused and
// the primary waits for it (synchronous_commit = remote_apply), so the
// window is held open until the test closes it.
func TestLogRelayWaitsUntilStreamedCommitsAreVisible(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	settings := map[string]string{"synchronous_standby_names": "'standby'", "synchronous_commit": "remote_apply"}
	for k, v := range logSettings {
		settings[k] = v
	}
	primary, err := servers.StartPostgres(ctx, servers.PostgresOptions{Settings: settings})
	require.NoError(t, err, "start a private primary")
	t.Cleanup(func() { require.NoError(t, primary.Close()) })
	standby, err := primary.StartStandby(ctx, servers.StandbyOptions{Name: "standby"})
	require.NoError(t, err, "start its synchronous standby with pg_basebackup")
	t.Cleanup(func() { require.NoError(t, standby.Close()) })

	s := logStore(t, primary)
	b := amqptest.NewBroker(t, rabbitmq.Config{})
	snk := newSink(t, b)
	runRelay(t, testConfig{Store: s, Publisher: b, Options: Options{Mode: ModeLog, BatchSize: 10, PollInterval: 100 * time.Millisecond}})
	writeCommitted(t, s, events("warm", 0, 1))
	snk.waitDistinct(t, 1) // the relay streams
	waitBacklogZero(t, s)  // and settled: it has nothing to write while commits wait

	// Commits now wait for the standby, which does not apply them.
	standbyPool, err := pgxpool.New(ctx, standby.URL())
	require.NoError(t, err)
	t.Cleanup(standbyPool.Close)
	_, err = standbyPool.Exec(ctx, "SELECT pg_wal_replay_pause()")
	require.NoError(t, err)

	fresh := events("fresh", 0, 1)
	late := events("late", 0, 1)
	late[0].CreatedAt = time.Now().Add(-time.Minute) // read late: looked up before it is published
	committed := make(chan error, 2)
	for _, msgs := range [][]message.Message{fresh, late} {
		go func() {
			committed <- s.InTx(ctx, func(tx pgx.Tx) error { return s.OutboxWrite(ctx, tx, msgs) })
		}()
	}
	// Both commits are flushed on the primary and wait for the standby.
	require.Eventually(t, func() bool {
		var n int
		err := s.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'`).Scan(&n)
		return err == nil && n == 2
	}, waitFor, 10*time.Millisecond, "the commits wait for the synchronous standby")
	var flushed string
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT pg_current_wal_flush_lsn()::text`).Scan(&flushed))
	// The relay's stream has them: its walsender sent past their commits.
	require.Eventually(t, func() bool {
		var sent bool
		err := s.Pool.QueryRow(ctx, `SELECT coalesce(bool_or(sent_lsn >= $1::pg_lsn), false) FROM pg_stat_replication
			WHERE application_name = 'sagabox-relay'`, flushed).Scan(&sent)
		return err == nil && sent
	}, waitFor, 10*time.Millisecond, "the relay's walsender to send the commits")
	// A relay that does not wait publishes the fresh row now, and settles
	// it (in vain) and the late one (skipped as deleted) meanwhile; give it
	// the time to. One that waits publishes nothing while the transactions
	// are not visible.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if seen, _ := snk.snapshot(); len(seen) > 1 {
			t.Fatalf("the relay published a row its transaction does not show yet: %v", seen)
		}
		time.Sleep(50 * time.Millisecond)
	}

	_, err = standbyPool.Exec(ctx, "SELECT pg_wal_replay_resume()")
	require.NoError(t, err)
	for range 2 {
		require.NoError(t, <-committed)
	}
	snk.waitDistinct(t, 3) // the late row too: none is lost
	waitBacklogZero(t, s)  // and none is left behind
	_, order := snk.snapshot()
	require.Equal(t, []int{0}, order["fresh"])
	require.Equal(t, []int{0}, order["late"], "the late row: %v", order)
}
