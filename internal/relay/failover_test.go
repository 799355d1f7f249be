package relay

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/internal/testkit/servers"
	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

// A primary with a synchronous standby dies (kill -9) while rows are
// written; the standby is promoted. Clients find the new primary through a
// multi-host URL (target_session_attrs=read-write), and each relay mode goes
// on by itself: the polling relay claims on the new primary; the log relay
// finds its slot gone (slots are not replicated), creates it again and
// publishes, from the table, the rows written before it, which the new slot
// does not stream. Every row whose commit was acknowledged is published, and
// the outbox drains.
func TestGuaranteeNoLostMessageRelayAcrossFailover(t *testing.T) {
	t.Parallel()
	for _, mode := range []Mode{ModePoll, ModeLog} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			testRelayAcrossFailover(t, mode)
		})
	}
}

func testRelayAcrossFailover(t *testing.T, mode Mode) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	settings := map[string]string{"synchronous_standby_names": "'standby'"}
	for k, v := range logSettings {
		settings[k] = v
	}
	primary, err := servers.StartPostgres(ctx, servers.PostgresOptions{Settings: settings})
	require.NoError(t, err, "start a private primary")
	t.Cleanup(func() { require.NoError(t, primary.Close()) })
	standby, err := primary.StartStandby(ctx, servers.StandbyOptions{Name: "standby"})
	require.NoError(t, err, "start its synchronous standby with pg_basebackup")
	t.Cleanup(func() { require.NoError(t, standby.Close()) })

	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write",
		primary.Port(), standby.Port())
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s := dbtest.StoreOnPool(t, pool, store.LineMessaging)
	if mode == ModeLog {
		_, err := s.Store.SetupOutboxLog(ctx, store.OutboxLogNames{})
		require.NoError(t, err)
	}
	b := amqptest.NewBroker(t, rabbitmq.Config{})
	snk := newSink(t, b)
	runRelay(t, testConfig{Store: s, Publisher: b, Options: Options{Mode: mode, BatchSize: 50, PollInterval: 100 * time.Millisecond}})

	// Writers: one row per transaction, again after a failure until
	// acknowledged (a commit whose answer was lost may have happened: the
	// same message id then has two rows, one message).
	const n = 300
	var mu sync.Mutex
	var acked []uuid.UUID
	written := make(chan struct{})
	go func() {
		defer close(written)
		for i := range n {
			msgs := events(fmt.Sprintf("k%d", i%7), i, 1)
			msgs[0].MessageID = uuid.Must(uuid.NewV7())
			for {
				if ctx.Err() != nil {
					return
				}
				if err := s.InTx(ctx, func(tx pgx.Tx) error { return s.OutboxWrite(ctx, tx, msgs) }); err == nil {
					break
				}
				time.Sleep(20 * time.Millisecond) // the failover: try again
			}
			mu.Lock()
			acked = append(acked, msgs[0].MessageID)
			mu.Unlock()
			time.Sleep(5 * time.Millisecond)
		}
	}()
	snk.waitDistinct(t, 50) // traffic before the failover
	require.NoError(t, primary.Kill(), "kill -9 the primary")
	require.NoError(t, standby.Promote(ctx), "promote the standby")
	<-written
	mu.Lock()
	want := append([]uuid.UUID(nil), acked...)
	mu.Unlock()
	require.Len(t, want, n)
	require.Eventually(t, func() bool {
		seen, _ := snk.snapshot()
		for _, id := range want {
			if seen[id] == 0 {
				return false
			}
		}
		return true
	}, 2*time.Minute, 100*time.Millisecond, "every acknowledged row published after the failover")
	waitBacklogZero(t, s)
}

// A slot an operator dropped while the relay was stopped (or a first
// switch from polling to log mode, with rows unpublished) leaves rows that
// no slot will stream: the relay creates the slot and publishes them from
// the table, then streams what comes after.
func TestLogRelayPublishesWhatADroppedSlotOwed(t *testing.T) {
	t.Parallel()
	s := logStore(t, logPostgres(t))
	b := amqptest.NewBroker(t, rabbitmq.Config{})
	snk := newSink(t, b)
	_, stop := runRelay(t, testConfig{Store: s, Publisher: b, Options: Options{Mode: ModeLog, BatchSize: 10}})
	writeCommitted(t, s, events("k", 0, 5))
	snk.waitDistinct(t, 5)
	stop()

	ctx := context.Background()
	slot, pub := LogNames(s.Schema())
	require.NoError(t, s.Store.DropOutboxLog(ctx, store.OutboxLogNames{Slot: slot, Publication: pub}))
	_, err := s.Store.SetupOutboxLog(ctx, store.OutboxLogNames{Slot: slot, Publication: pub}) // the publication back, and a new slot
	require.NoError(t, err)
	require.NoError(t, s.Store.DropOutboxLog(ctx, store.OutboxLogNames{Slot: slot})) // the slot gone again
	writeCommitted(t, s, events("k", 5, 25))                                         // before any slot
	_, err = s.Pool.Exec(ctx, "CREATE PUBLICATION "+pgx.Identifier{pub}.Sanitize()+" FOR TABLE "+pgx.Identifier{s.Schema(), "sagabox_outbox"}.Sanitize()+" WITH (publish = 'insert')")
	if err != nil {
		require.ErrorContains(t, err, "already exists")
	}

	runRelay(t, testConfig{Store: s, Publisher: b, Options: Options{Mode: ModeLog, BatchSize: 10}})
	snk.waitDistinct(t, 30)
	writeCommitted(t, s, events("k", 30, 5)) // streamed by the new slot
	snk.waitDistinct(t, 35)
	waitBacklogZero(t, s)
	_, order := snk.snapshot()
	require.IsIncreasing(t, order["k"], "one key's rows keep their order")
}
