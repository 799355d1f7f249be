package relay

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"

	"github.com/sagabox/sagabox/internal/telemetry"
	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/internal/testkit/servers"
	"github.com/sagabox/sagabox/internal/testkit/telemetrytest"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/store/driver"
	"github.com/sagabox/sagabox/transport"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

// logSettings are the server settings of the private clusters log mode is
// tested on.
var logSettings = map[string]string{"wal_level": "logical", "max_replication_slots": "40", "max_wal_senders": "40"}

// logPG is the private cluster (wal_level = logical) the log-mode tests
// share; tests that restart a server start one of their own.
var logPG struct {
	once sync.Once
	pg   *servers.Postgres
	err  error
}

func logPostgres(t *testing.T) *servers.Postgres {
	t.Helper()
	logPG.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		logPG.pg, logPG.err = servers.StartPostgres(ctx, servers.PostgresOptions{Settings: logSettings})
	})
	require.NoError(t, logPG.err, "start a private PostgreSQL with wal_level = logical")
	return logPG.pg
}

func closeLogPostgres() {
	if logPG.pg != nil {
		if err := logPG.pg.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "close private PostgreSQL:", err)
		}
	}
}

// logStore returns a fresh schema on pg with log mode set up (publication
// and slot), dropped when the test ends.
func logStore(t *testing.T, pg *servers.Postgres) *dbtest.DB {
	t.Helper()
	return logStoreWith(t, pg, nil)
}

// logStoreWith is logStore with modify applied to the pool's configuration.
func logStoreWith(t *testing.T, pg *servers.Postgres, modify func(*pgxpool.Config)) *dbtest.DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(pg.URL())
	require.NoError(t, err)
	cfg.MaxConns = 8
	if modify != nil {
		modify(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s := dbtest.StoreOnPool(t, pool, store.LineMessaging)
	slot, pub := LogNames(s.Schema())
	created, err := s.OutboxLogSetup(ctx, slot, pub)
	require.NoError(t, err)
	require.True(t, created)
	t.Cleanup(func() {
		// The relays have stopped (cleanups run last first); a killed
		// reader's backend may take a moment to go.
		require.Eventually(t, func() bool {
			return s.Store.DropOutboxLog(context.Background(), store.OutboxLogNames{Slot: slot, Publication: pub}) == nil
		}, waitFor, 100*time.Millisecond, "drop the slot")
	})
	return s
}

// modeStore returns a store mode can read: the shared server for the
// polling relay, the private logical cluster for the log relay.
func modeStore(t *testing.T, mode Mode) *dbtest.DB {
	t.Helper()
	if mode == ModeLog {
		return logStore(t, logPostgres(t))
	}
	return dbtest.Store(t, store.LineMessaging)
}

// forModes runs test once per relay mode: the guarantees of the polling
// relay are the log relay's too.
func forModes(t *testing.T, test func(t *testing.T, mode Mode, s *dbtest.DB)) {
	t.Helper()
	for _, mode := range []Mode{ModePoll, ModeLog} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			test(t, mode, modeStore(t, mode))
		})
	}
}

// The slot's confirmed position moves past published messages, and the
// rows it passed are settled (deleted) in batches: one statement per
// batch, not per row (a structural count through a pgx tracer).
func TestLogRelayConfirmsThePositionPastPublishedRows(t *testing.T) {
	t.Parallel()
	var rts dbtest.RoundTrips
	s := logStoreWith(t, logPostgres(t), func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = &rts })
	b := amqptest.NewBroker(t, rabbitmq.Config{})
	snk := newSink(t, b)
	slot, pub := LogNames(s.Schema())
	before, err := s.OutboxLogStatus(context.Background(), slot, pub)
	require.NoError(t, err)
	ids := writeCommitted(t, s, events("k", 0, 50))
	rts.Start()
	runRelay(t, testConfig{Store: s, Publisher: b, Options: Options{Mode: ModeLog, BatchSize: 20}})
	snk.waitDistinct(t, len(ids))
	waitBacklogZero(t, s)
	rts.Stop()
	settles := rts.Count("OutboxClaim")
	require.LessOrEqual(t, settles, 5, "50 rows in batches of 20 are settled in a few statements")
	require.Eventually(t, func() bool {
		st, err := s.OutboxLogStatus(context.Background(), slot, pub)
		return err == nil && st.Active && st.ConfirmedLSN > before.ConfirmedLSN
	}, waitFor, 50*time.Millisecond, "the slot moved on")
	_, order := snk.snapshot()
	require.IsIncreasing(t, order["k"])
}

// In log mode a command no queue takes holds the stream: the relay retries
// it, and nothing after it goes out. Once the row is gone from the outbox
// (withdrawn with its terminated saga, or deleted by an operator), the
// relay stops retrying it and the stream moves on.
func TestLogRelayDropsARowDeletedWhileItIsRetried(t *testing.T) {
	t.Parallel()
	s := logStore(t, logPostgres(t))
	b := amqptest.NewBroker(t, rabbitmq.Config{})
	snk := newSink(t, b)
	command := []message.Message{{
		Envelope: message.Envelope{Type: "nowhere.do", Kind: message.KindCommand, SagaID: uuid.New(), Step: "do", ReplyTo: "orders"},
		Payload:  []byte(`{}`),
	}}
	writeCommitted(t, s, command)
	after := writeCommitted(t, s, events("k", 0, 1))
	runRelay(t, testConfig{Store: s, Publisher: b, Options: Options{Mode: ModeLog}})

	deleteOutboxRow(t, s, command[0].MessageID)
	snk.waitDistinct(t, len(after))
	waitBacklogZero(t, s)
}

// A relay in log mode that reads rows long after they were written (it was
// down or behind) looks them up first and skips those deleted meanwhile,
// as a terminated saga's withdrawn commands are: they are never published.
func TestLogRelaySkipsRowsDeletedBeforeItReadThem(t *testing.T) {
	t.Parallel()
	s := logStore(t, logPostgres(t))
	b := amqptest.NewBroker(t, rabbitmq.Config{})
	snk := newSink(t, b)
	old := events("k", 0, 3)
	for i := range old {
		old[i].CreatedAt = time.Now().Add(-time.Minute) // written while the relay was down
	}
	writeCommitted(t, s, old)
	withdrawn := old[1].MessageID
	deleteOutboxRow(t, s, withdrawn)
	fresh := writeCommitted(t, s, events("k", 3, 2))
	runRelay(t, testConfig{Store: s, Publisher: b, Options: Options{Mode: ModeLog}})

	snk.waitDistinct(t, 2+len(fresh))
	waitBacklogZero(t, s)
	seen, order := snk.snapshot()
	require.NotContains(t, seen, withdrawn, "a row deleted before the relay read it is not published")
	require.Equal(t, []int{0, 2, 3, 4}, order["k"], "the others go out, in order")
}

// A relay in log mode refuses to start on a server whose wal_level is not
// logical, and says what to change.
func TestLogRelayCheckSaysWhatToChange(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t, store.LineMessaging)
	b := amqptest.NewBroker(t, rabbitmq.Config{})
	r, err := New(s.Executor, b, Options{Mode: ModeLog}, Schema{}, amqptest.Logger(t))
	require.NoError(t, err)
	st, err := s.OutboxLogStatus(context.Background(), "x", "x")
	require.NoError(t, err)
	if st.WALLevel == "logical" {
		// The shared server is set up for log mode already: check on a
		// private one that is not.
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		pg, err := servers.StartPostgres(ctx, servers.PostgresOptions{Settings: map[string]string{"wal_level": "replica"}})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, pg.Close()) })
		pool, err := pgxpool.New(ctx, pg.URL())
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		s = dbtest.StoreOnPool(t, pool, store.LineMessaging)
		r, err = New(s.Executor, b, Options{Mode: ModeLog}, Schema{}, amqptest.Logger(t))
		require.NoError(t, err)
	}
	err = r.Check(context.Background())
	require.ErrorContains(t, err, "set wal_level = logical")
	// On a logical server without the set-up, it names the command.
	ls := logStore(t, logPostgres(t))
	slot, pub := LogNames(ls.Schema())
	require.NoError(t, ls.Store.DropOutboxLog(context.Background(), store.OutboxLogNames{Slot: slot, Publication: pub}))
	r, err = New(ls.Executor, b, Options{Mode: ModeLog}, Schema{}, amqptest.Logger(t))
	require.NoError(t, err)
	require.ErrorContains(t, r.Check(context.Background()), "sagabox relay setup-log")
	_, err = ls.OutboxLogSetup(context.Background(), slot, pub)
	require.NoError(t, err)
	require.NoError(t, r.Check(context.Background()))
}

// The broker (a private node) restarts while rows are written and
// streamed: the log relay holds its position, retries, and every row
// arrives, each key in order.
func TestGuaranteeNoLostMessageLogRelayAcrossBrokerRestart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	node, err := servers.StartRabbitMQ(ctx, servers.RabbitMQOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, node.Close()) })
	b, err := rabbitmq.New(ctx, rabbitmq.Config{URL: node.URL(), Namespace: amqptest.Namespace(t), QueueType: rabbitmq.QueueTypeQuorum,
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: time.Second, Logger: amqptest.Logger(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	s := logStore(t, logPostgres(t))
	snk := newSink(t, b)
	runRelay(t, testConfig{Store: s, Publisher: b, Options: Options{Mode: ModeLog, BatchSize: 20}})

	var ids []uuid.UUID
	for i := range 10 {
		ids = append(ids, writeCommitted(t, s, events("k", i*10, 10))...)
	}
	require.NoError(t, node.Restart(ctx, true))
	for i := 10; i < 20; i++ {
		ids = append(ids, writeCommitted(t, s, events("k", i*10, 10))...)
	}
	snk.waitDistinct(t, len(ids))
	waitBacklogZero(t, s)
	seen, order := snk.snapshot()
	for _, id := range ids {
		require.Contains(t, seen, id)
	}
	require.IsIncreasing(t, order["k"])
}

// PostgreSQL (a private cluster) crashes under the log relay: the relay
// reconnects to its slot and streams what was committed before and after,
// from the last confirmed position.
func TestGuaranteeNoLostMessageLogRelayAcrossDatabaseRestart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	pg, err := servers.StartPostgres(ctx, servers.PostgresOptions{Settings: logSettings})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, pg.Close()) })
	s := logStore(t, pg)
	b := amqptest.NewBroker(t, rabbitmq.Config{})
	snk := newSink(t, b)
	runRelay(t, testConfig{Store: s, Publisher: b, Options: Options{Mode: ModeLog, BatchSize: 20}})

	ids := writeCommitted(t, s, events("k", 0, 50))
	require.NoError(t, pg.Restart(ctx, "immediate"))
	require.Eventually(t, func() bool {
		more, err := tryWrite(s, events("k", 50, 50))
		if err != nil {
			return false
		}
		ids = append(ids, more...)
		return true
	}, time.Minute, 100*time.Millisecond)
	snk.waitDistinct(t, len(ids))
	waitBacklogZero(t, s)
	seen, order := snk.snapshot()
	for _, id := range ids {
		require.Contains(t, seen, id)
	}
	require.IsIncreasing(t, order["k"])
}

// helperEnv makes the test binary run a log relay (runHelperRelay) instead
// of the tests: a process for the takeover test to kill.
const helperEnv = "SAGABOX_RELAY_HELPER"

// runHelperRelay runs a log relay on the schema and broker of its
// environment until it is killed.
func runHelperRelay() int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("HELPER_DB"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	b, err := rabbitmq.New(ctx, rabbitmq.Config{URL: os.Getenv("HELPER_AMQP"), Namespace: os.Getenv("HELPER_NS")})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ex, err := store.NewExecutor(pool, os.Getenv("HELPER_SCHEMA"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	r, err := New(ex, b, Options{Mode: ModeLog, BatchSize: 10}, Schema{}, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	_ = r.Run(ctx)
	return 0
}

// Two relays in log mode: one reads the slot, the other stands by. The
// reader's process is killed (SIGKILL): the standby takes the slot over
// and every row arrives, each key in order.
func TestLogRelayStandbyTakesOverAfterSIGKILL(t *testing.T) {
	t.Parallel()
	pg := logPostgres(t)
	s := logStore(t, pg)
	cfg := amqptest.Config(t)
	b := amqptest.NewBroker(t, cfg)
	snk := newSink(t, b)
	slot, pub := LogNames(s.Schema())

	self, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1", "HELPER_DB="+pg.URL(), "HELPER_SCHEMA="+s.Schema(),
		"HELPER_AMQP="+cfg.URL, "HELPER_NS="+cfg.Namespace)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	require.NoError(t, cmd.Start())
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	// The helper holds the slot before the standby starts.
	ids := writeCommitted(t, s, events("k", 0, 20))
	snk.waitDistinct(t, len(ids))
	first, err := s.OutboxLogStatus(context.Background(), slot, pub)
	require.NoError(t, err)
	require.True(t, first.Active)

	var obs countingPublisher
	runRelay(t, testConfig{Store: s, Publisher: b, Options: Options{Mode: ModeLog, BatchSize: 10, PollInterval: 200 * time.Millisecond}, Observer: &obs})
	ids = append(ids, writeCommitted(t, s, events("k", 20, 20))...)
	snk.waitDistinct(t, len(ids))
	require.Zero(t, obs.n.Load(), "the standby published nothing while the reader held the slot")

	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	killed = true
	for i := 2; i < 10; i++ {
		ids = append(ids, writeCommitted(t, s, events("k", i*20, 20))...)
	}
	snk.waitDistinct(t, len(ids))
	waitBacklogZero(t, s)
	require.Positive(t, obs.n.Load(), "the standby took over")
	now, err := s.OutboxLogStatus(context.Background(), slot, pub)
	require.NoError(t, err)
	require.True(t, now.Active)
	require.NotEqual(t, first.ActivePID, now.ActivePID, "another backend reads the slot")
	seen, order := snk.snapshot()
	for _, id := range ids {
		require.Contains(t, seen, id)
	}
	require.IsIncreasing(t, order["k"])
}

// droppingPublisher publishes nothing of its drop-th call.
type droppingPublisher struct {
	transport.Publisher
	calls atomic.Int32
	drop  int32
}

func (p *droppingPublisher) Publish(ctx context.Context, msgs ...message.Message) error {
	if p.calls.Add(1) == p.drop {
		return errors.New("dropped")
	}
	return p.Publisher.Publish(ctx, msgs...)
}

// A log relay that dies while a batch is not confirmed (the broker got
// none of it) has not moved the slot past it: the next reader streams it
// again, and nothing is lost. A relay that confirmed the slot's position
// as it read (before the broker's confirms) would lose the second
// transactions of the dropped batch here.
func TestGuaranteeNoLostMessageLogRelayCrashBeforeConfirm(t *testing.T) {
	t.Parallel()
	s := logStore(t, logPostgres(t))
	b := amqptest.NewBroker(t, rabbitmq.Config{})
	snk := newSink(t, b)
	var ids []uuid.UUID
	// One row per transaction: the dropped batch holds the commits of
	// most of its rows.
	for i := range 30 {
		ids = append(ids, writeCommitted(t, s, events("k", i, 1))...)
	}
	pub := &droppingPublisher{Publisher: b, drop: 2}
	r, err := New(s.Executor, pub, Options{Mode: ModeLog, BatchSize: 10}, Schema{}, amqptest.Logger(t))
	require.NoError(t, err)
	crashed := make(chan struct{})
	var calls atomic.Int32
	r.testHookAfterPublish = func([]driver.OutboxRow) bool {
		if calls.Add(1) == 2 {
			close(crashed)
			return true
		}
		return false
	}
	stop := testkit.Run(t, r.Run)
	<-crashed
	require.NoError(t, stop())
	seen, _ := snk.snapshot()
	require.Less(t, len(seen), len(ids), "the dropped batch did not arrive")

	runRelay(t, testConfig{Store: s, Publisher: b, Options: Options{Mode: ModeLog, BatchSize: 10}})
	snk.waitDistinct(t, len(ids))
	waitBacklogZero(t, s)
	seen, order := snk.snapshot()
	for _, id := range ids {
		require.Contains(t, seen, id)
	}
	require.IsIncreasing(t, order["k"])
}

// The slot gauges show a slot nobody reads holding log (the alert's
// case), and a reader once a relay takes the slot.
func TestLogRelaySlotGauges(t *testing.T) {
	t.Parallel()
	s := logStore(t, logPostgres(t))
	b := amqptest.NewBroker(t, rabbitmq.Config{})
	snk := newSink(t, b)
	meter := telemetrytest.NewMeter(t)
	tel, err := telemetry.New(nil, meter.Provider)
	require.NoError(t, err)
	slot, pub := LogNames(s.Schema())
	reg, err := tel.RegisterSlotGauges(s.Executor, slot, pub)
	require.NoError(t, err)
	defer func() { require.NoError(t, reg.Unregister()) }()
	attrs := []attribute.KeyValue{telemetry.AttrSchema.String(s.Schema()), telemetry.AttrSlot.String(slot)}

	ids := writeCommitted(t, s, events("k", 0, 20))
	m := meter.Collect(t)
	lag, ok := m.Gauge(telemetry.MetricRelaySlotLag, attrs...)
	require.True(t, ok)
	require.Positive(t, lag, "an unread slot holds the log of the rows written since")
	active, ok := m.Gauge(telemetry.MetricRelaySlotActive, attrs...)
	require.True(t, ok)
	require.Zero(t, active)

	runRelay(t, testConfig{Store: s, Publisher: b, Options: Options{Mode: ModeLog}})
	snk.waitDistinct(t, len(ids))
	require.Eventually(t, func() bool {
		active, _ := meter.Collect(t).Gauge(telemetry.MetricRelaySlotActive, attrs...)
		return active == 1
	}, waitFor, 50*time.Millisecond)
}

// A running service switches from polling to log mode and back while it
// keeps writing, by the procedure of docs/operations.md: set up the slot
// while the polling relay runs; start the log relay; stop the polling
// relay once everything written before the slot existed is out; later,
// start a polling relay, stop the log relay and drop the slot. Nothing is
// lost (duplicates are allowed: the inbox absorbs them).
func TestSwitchingRelayModesLosesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := logStore(t, logPostgres(t))
	slot, pub := LogNames(s.Schema())
	require.NoError(t, s.Store.DropOutboxLog(ctx, store.OutboxLogNames{Slot: slot, Publication: pub})) // a service that never ran in log mode
	b := amqptest.NewBroker(t, rabbitmq.Config{})
	snk := newSink(t, b)

	var mu sync.Mutex
	var ids []uuid.UUID
	written := func() []uuid.UUID {
		mu.Lock()
		defer mu.Unlock()
		return append([]uuid.UUID(nil), ids...)
	}
	wctx, stopWriting := context.WithCancel(ctx)
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		for n := 0; wctx.Err() == nil; n++ {
			got, err := tryWrite(s, events(fmt.Sprintf("k%d", n%4), n/4, 1))
			if err == nil {
				mu.Lock()
				ids = append(ids, got...)
				mu.Unlock()
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	waitWritten := func(n int) {
		require.Eventually(t, func() bool { return len(written()) >= n }, waitFor, 5*time.Millisecond)
	}

	_, stopPoll := runRelay(t, testConfig{Store: s, Publisher: b, Options: Options{Mode: ModePoll}})
	waitWritten(50)
	_, err := s.OutboxLogSetup(ctx, slot, pub)
	require.NoError(t, err)
	beforeSlot := written()
	_, stopLog := runRelay(t, testConfig{Store: s, Publisher: b, Options: Options{Mode: ModeLog}})
	waitWritten(len(beforeSlot) + 100)
	// What was written before the slot existed has arrived: the polling
	// relay can go.
	snk.waitDistinct(t, len(beforeSlot))
	seen, _ := snk.snapshot()
	for _, id := range beforeSlot {
		require.Contains(t, seen, id)
	}
	stopPoll()
	waitWritten(len(beforeSlot) + 250)

	// And back to polling.
	runRelay(t, testConfig{Store: s, Publisher: b, Options: Options{Mode: ModePoll}})
	waitWritten(len(beforeSlot) + 300)
	stopLog()
	require.NoError(t, s.Store.DropOutboxLog(ctx, store.OutboxLogNames{Slot: slot, Publication: pub}))
	waitWritten(len(beforeSlot) + 400)
	stopWriting()
	<-writerDone
	all := written()
	snk.waitDistinct(t, len(all))
	waitBacklogZero(t, s)
	seen, _ = snk.snapshot()
	for _, id := range all {
		require.Contains(t, seen, id, "message lost in the switch")
	}
	_, err = s.OutboxLogSetup(ctx, slot, pub) // for the cleanup's drop
	require.NoError(t, err)
}

// With published rows kept for retention, the log relay marks them
// published (in its settling statement) instead of deleting them.
func TestLogRelayKeepsPublishedRowsMarked(t *testing.T) {
	t.Parallel()
	s := logStore(t, logPostgres(t))
	b := amqptest.NewBroker(t, rabbitmq.Config{})
	snk := newSink(t, b)
	ids := writeCommitted(t, s, events("k", 0, 30))
	r, err := New(s.Executor, b, Options{Mode: ModeLog, BatchSize: 10}, Schema{KeepPublished: true}, amqptest.Logger(t))
	require.NoError(t, err)
	testkit.Run(t, r.Run)
	snk.waitDistinct(t, len(ids))
	waitBacklogZero(t, s)
	var marked int
	require.NoError(t, s.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+pgx.Identifier{s.Schema()}.Sanitize()+
		`.sagabox_outbox WHERE published_at IS NOT NULL`).Scan(&marked))
	require.Equal(t, len(ids), marked)
}
