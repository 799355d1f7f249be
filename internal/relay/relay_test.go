package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/store/driver"
	"github.com/sagabox/sagabox/transport"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

const waitFor = 30 * time.Second

// sink consumes every test event of a namespace and records what arrived.
type sink struct {
	mu    sync.Mutex
	seen  map[uuid.UUID]int // message id -> deliveries
	order map[string][]int  // ordering key -> payload sequence numbers in arrival order
	cond  chan struct{}
}

type payload struct {
	Key string `json:"key"`
	N   int    `json:"n"`
}

func newSink(t *testing.T, b transport.Broker) *sink {
	t.Helper()
	s := &sink{seen: map[uuid.UUID]int{}, order: map[string][]int{}, cond: make(chan struct{}, 1)}
	spec := transport.QueueSpec{Name: "sink", Events: []string{"test.#"}}
	require.NoError(t, b.Declare(context.Background(), spec))
	testkit.Run(t, func(ctx context.Context) error {
		return b.Subscribe(ctx, spec, transport.HandlerFunc(func(_ context.Context, d *transport.Delivery) transport.Outcome {
			var p payload
			if err := json.Unmarshal(d.Payload, &p); err != nil {
				return transport.DeadLetter(err.Error())
			}
			s.mu.Lock()
			s.seen[d.MessageID]++
			if s.seen[d.MessageID] == 1 {
				s.order[p.Key] = append(s.order[p.Key], p.N)
			}
			s.mu.Unlock()
			select {
			case s.cond <- struct{}{}:
			default:
			}
			return transport.Ack()
		}), &transport.SubscribeOpts{Concurrency: 1, Prefetch: 200})
	})
	return s
}

// waitDistinct waits until n distinct messages arrived.
func (s *sink) waitDistinct(t *testing.T, n int) {
	t.Helper()
	deadline := time.After(waitFor)
	for {
		s.mu.Lock()
		got := len(s.seen)
		s.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-s.cond:
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			t.Fatalf("only %d of %d messages arrived within %s", got, n, waitFor)
		}
	}
}

func (s *sink) snapshot() (map[uuid.UUID]int, map[string][]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := make(map[uuid.UUID]int, len(s.seen))
	for k, v := range s.seen {
		seen[k] = v
	}
	order := make(map[string][]int, len(s.order))
	for k, v := range s.order {
		order[k] = append([]int(nil), v...)
	}
	return seen, order
}

func events(key string, from, n int) []message.Message {
	msgs := make([]message.Message, n)
	for i := range n {
		body, _ := json.Marshal(payload{Key: key, N: from + i})
		msgs[i] = message.Message{
			Envelope: message.Envelope{Type: "test.event", Kind: message.KindEvent, OrderingKey: key},
			Payload:  body,
		}
	}
	return msgs
}

func writeCommitted(t *testing.T, s *dbtest.DB, msgs []message.Message) []uuid.UUID {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, s.InTx(ctx, func(tx pgx.Tx) error { return s.OutboxWrite(ctx, tx, msgs) }))
	ids := make([]uuid.UUID, len(msgs))
	for i, m := range msgs {
		ids[i] = m.MessageID
	}
	return ids
}

func tryWrite(s *dbtest.DB, msgs []message.Message) ([]uuid.UUID, error) {
	ctx := context.Background()
	if err := s.InTx(ctx, func(tx pgx.Tx) error { return s.OutboxWrite(ctx, tx, msgs) }); err != nil {
		return nil, err
	}
	ids := make([]uuid.UUID, len(msgs))
	for i, m := range msgs {
		ids[i] = m.MessageID
	}
	return ids, nil
}

// testConfig is what a test relay runs with.
type testConfig struct {
	Store     *dbtest.DB
	Publisher transport.Publisher
	Options
	// Observer, when set, counts the messages the relay got confirmed.
	Observer *countingPublisher
	// SettleDelay, when set, replaces defaultSettleDelay: a test that
	// counts statements makes it long, so that how fast the machine is
	// does not decide whether a batch waits for the next claim or is
	// settled on its own.
	SettleDelay time.Duration
}

func runRelay(t *testing.T, cfg testConfig) (*Relay, func()) {
	t.Helper()
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 50 * time.Millisecond
	}
	pub := cfg.Publisher
	if cfg.Observer != nil {
		cfg.Observer.Publisher = pub
		pub = cfg.Observer
	}
	r, err := New(cfg.Store.Executor, pub, cfg.Options, Schema{}, amqptest.Logger(t))
	require.NoError(t, err)
	if cfg.SettleDelay > 0 {
		r.settleDelay = cfg.SettleDelay
	}
	stop := testkit.Run(t, r.Run)
	return r, func() { require.NoError(t, stop()) }
}

func waitBacklogZero(t *testing.T, s *dbtest.DB) {
	t.Helper()
	require.Eventually(t, func() bool {
		st, err := s.OutboxStats(context.Background())
		return err == nil && st.Backlog == 0
	}, waitFor, 20*time.Millisecond)
}

func TestOptionsValidation(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t, store.LineMessaging)
	_, err := New(nil, nil, Options{}, Schema{}, nil)
	require.ErrorContains(t, err, "a store and a publisher are required")
	b := amqptest.NewBroker(t, rabbitmq.Config{})
	_, err = New(s.Executor, b, Options{Lease: time.Second, PublishTimeout: 2 * time.Second}, Schema{}, nil)
	require.ErrorContains(t, err, "Options.Lease 1s must exceed PublishTimeout 2s")
	_, err = New(s.Executor, b, Options{BatchSize: -1}, Schema{}, nil)
	require.ErrorContains(t, err, "Options.BatchSize -1 is less than 1")
}

func TestGuaranteeAtomicOutboxOnlyCommittedRowsPublished(t *testing.T) {
	t.Parallel()
	forModes(t, testAtomicOutboxOnlyCommittedRowsPublished)
}

func testAtomicOutboxOnlyCommittedRowsPublished(t *testing.T, mode Mode, s *dbtest.DB) {
	b := amqptest.NewBroker(t, rabbitmq.Config{})
	snk := newSink(t, b)
	ctx := context.Background()

	rolledBack := events("rb", 0, 5)
	err := s.InTx(ctx, func(tx pgx.Tx) error {
		if err := s.OutboxWrite(ctx, tx, rolledBack); err != nil {
			return err
		}
		return fmt.Errorf("abort")
	})
	require.ErrorContains(t, err, "abort")
	committed := writeCommitted(t, s, events("ok", 0, 20))

	r, _ := runRelay(t, testConfig{Store: s, Publisher: b, Options: Options{Mode: mode}})
	r.Wake()
	snk.waitDistinct(t, len(committed))
	waitBacklogZero(t, s)

	seen, _ := snk.snapshot()
	require.Len(t, seen, len(committed), "exactly the committed rows arrive")
	for _, id := range committed {
		require.Contains(t, seen, id)
	}
	for _, m := range rolledBack {
		require.NotContains(t, seen, m.MessageID, "a rolled-back row must never be published")
	}
}

// A relay killed after the broker confirmed a batch and before it marked the
// rows published loses nothing: once the lease ends, another relay publishes
// them again (duplicates allowed).
func TestGuaranteeNoLostMessageRelayCrashBetweenPublishAndMark(t *testing.T) {
	t.Parallel()
	forModes(t, testNoLostMessageRelayCrashBetweenPublishAndMark)
}

// In log mode the crash comes between the broker's confirms and the
// slot's confirmed position: the next reader streams from the last
// confirmed position.
func testNoLostMessageRelayCrashBetweenPublishAndMark(t *testing.T, mode Mode, s *dbtest.DB) {
	b := amqptest.NewBroker(t, rabbitmq.Config{})
	snk := newSink(t, b)
	ids := writeCommitted(t, s, events("k", 0, 30))

	crashed := make(chan struct{})
	r, err := New(s.Executor, b, Options{Mode: mode, Workers: 1, BatchSize: 10, Lease: 1500 * time.Millisecond, PublishTimeout: time.Second}, Schema{}, amqptest.Logger(t))
	require.NoError(t, err)
	var once sync.Once
	r.testHookAfterPublish = func([]driver.OutboxRow) bool {
		once.Do(func() { close(crashed) })
		return true
	}
	stop := testkit.Run(t, r.Run)
	<-crashed
	require.NoError(t, stop())

	st, err := s.OutboxStats(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, len(ids), st.Backlog, "the crashed relay marked nothing")

	_, _ = runRelay(t, testConfig{Store: s, Publisher: b, Options: Options{Mode: mode, Lease: 1500 * time.Millisecond, PublishTimeout: time.Second}})
	snk.waitDistinct(t, len(ids))
	waitBacklogZero(t, s)
	seen, order := snk.snapshot()
	for _, id := range ids {
		require.GreaterOrEqual(t, seen[id], 1, "message %s lost", id)
	}
	require.IsIncreasing(t, order["k"], "first deliveries of one key arrive in write order")
}

// The broker connection is force-closed while rows are being written and
// published: the relay resumes on its own and every committed row arrives.
func TestGuaranteeNoLostMessageConnectionClosedMidStream(t *testing.T) {
	t.Parallel()
	forModes(t, testNoLostMessageConnectionClosedMidStream)
}

func testNoLostMessageConnectionClosedMidStream(t *testing.T, mode Mode, s *dbtest.DB) {
	cfg := amqptest.Config(t)
	b := amqptest.NewBroker(t, cfg)
	snk := newSink(t, b)
	r, _ := runRelay(t, testConfig{Store: s, Publisher: b, Options: Options{Mode: mode, BatchSize: 20}})

	var ids []uuid.UUID
	for i := range 20 {
		ids = append(ids, writeCommitted(t, s, events("k", i*10, 10))...)
		r.Wake()
		if i == 10 {
			require.Positive(t, amqptest.CloseConnections(t, cfg.ConnectionName), "no connection closed")
		}
	}
	snk.waitDistinct(t, len(ids))
	waitBacklogZero(t, s)
	seen, order := snk.snapshot()
	for _, id := range ids {
		require.Contains(t, seen, id)
	}
	require.IsIncreasing(t, order["k"])
}

// countingPublisher counts the messages a relay got confirmed.
type countingPublisher struct {
	transport.Publisher
	n atomic.Int64
}

func (p *countingPublisher) Publish(ctx context.Context, msgs ...message.Message) error {
	err := p.Publisher.Publish(ctx, msgs...)
	for _, ok := range transport.Confirmed(len(msgs), err) {
		if ok {
			p.n.Add(1)
		}
	}
	return err
}

// Two relays drain one outbox: every row is published once in total (no row
// by both in one pass) and each key's rows arrive in write order.
func TestGuaranteeOrderingTwoRelaysKeepPerKeyOrder(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t, store.LineMessaging)
	b := amqptest.NewBroker(t, rabbitmq.Config{})
	snk := newSink(t, b)

	const keys, perKey = 8, 60
	var ids []uuid.UUID
	// Interleave keys across several commits so each key's rows are spread
	// over many claim batches.
	for round := range 6 {
		var batch []message.Message
		for k := range keys {
			batch = append(batch, events(fmt.Sprintf("key-%d", k), round*perKey/6, perKey/6)...)
		}
		ids = append(ids, writeCommitted(t, s, batch)...)
	}

	var obsA, obsB countingPublisher
	ra, _ := runRelay(t, testConfig{Store: s, Publisher: b, Options: Options{BatchSize: 7, Workers: 2}, Observer: &obsA})
	rb, _ := runRelay(t, testConfig{Store: s, Publisher: b, Options: Options{BatchSize: 5, Workers: 2}, Observer: &obsB})
	ra.Wake()
	rb.Wake()

	snk.waitDistinct(t, len(ids))
	waitBacklogZero(t, s)
	require.EqualValues(t, len(ids), obsA.n.Load()+obsB.n.Load(), "each row is published by exactly one relay")
	require.Positive(t, obsA.n.Load())
	require.Positive(t, obsB.n.Load())
	_, order := snk.snapshot()
	require.Len(t, order, keys)
	for k, seq := range order {
		require.Len(t, seq, perKey, k)
		require.IsIncreasing(t, seq, "key %s out of order", k)
	}
}

func TestListenWakesRelayFromAnotherProcess(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t, store.LineMessaging)
	b := amqptest.NewBroker(t, rabbitmq.Config{})
	snk := newSink(t, b)
	// A poll interval far beyond the test's patience: only the NOTIFY can
	// wake the relay in time.
	_, _ = runRelay(t, testConfig{Store: s, Publisher: b, Options: Options{Listen: true, PollInterval: time.Hour}})
	// The listener's first wake-up polls once; wait for the LISTEN to be in
	// place by publishing a first message through it.
	ctx := context.Background()
	first := events("n", 0, 1)
	require.Eventually(t, func() bool {
		_ = s.InTx(ctx, func(tx pgx.Tx) error {
			if err := s.OutboxWrite(ctx, tx, events("probe", 0, 1)); err != nil {
				return err
			}
			return s.OutboxNotify(ctx, tx)
		})
		seen, _ := snk.snapshot()
		return len(seen) > 0
	}, waitFor, 200*time.Millisecond)
	require.NoError(t, s.InTx(ctx, func(tx pgx.Tx) error {
		if err := s.OutboxWrite(ctx, tx, first); err != nil {
			return err
		}
		return s.OutboxNotify(ctx, tx)
	}))
	require.Eventually(t, func() bool {
		seen, _ := snk.snapshot()
		return seen[first[0].MessageID] > 0
	}, waitFor, 10*time.Millisecond)
}

// A message the broker refuses (no queue is bound for it yet) is published
// once a queue is: the relay retries it after its backoff on its own,
// without waiting for its poll interval (an hour here) or a wake-up.
func TestUnconfirmedMessageRetriedWithoutAWakeUp(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t, store.LineMessaging)
	b := amqptest.NewBroker(t, amqptest.Config(t))
	msgs := events("late", 0, 1)
	msgs[0].Type = "late.event"
	writeCommitted(t, s, msgs)
	_, _ = runRelay(t, testConfig{Store: s, Publisher: b, Options: Options{PollInterval: time.Hour}})
	refused := `SELECT count(*) FROM ` + pgx.Identifier{s.Schema()}.Sanitize() + `.sagabox_outbox WHERE last_error <> ''`
	require.Eventually(t, func() bool {
		var n int
		err := s.Pool.QueryRow(context.Background(), refused).Scan(&n)
		return err == nil && n == 1
	}, waitFor, 10*time.Millisecond, "the first publish is refused")

	ctx := context.Background()
	spec := transport.QueueSpec{Name: "late", Events: []string{"late.#"}}
	require.NoError(t, b.Declare(ctx, spec))
	require.Equal(t, msgs[0].MessageID, firstDelivered(t, b, spec, "the refused message"))
}

// Messages that trickle in, one at a time, cost one claim each: the claim
// that takes a message also settles the one before (the settle waits for
// it), so the relay does not run a second statement per message to settle.
// A structural count of statements through a pgx tracer.
func TestTricklingMessagesCostOneClaimEach(t *testing.T) {
	t.Parallel()
	var rts dbtest.RoundTrips
	pool := dbtest.PoolWith(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = &rts })
	s := dbtest.StoreOnPool(t, pool, store.LineMessaging)
	b := amqptest.NewBroker(t, rabbitmq.Config{})
	snk := newSink(t, b)
	r, _ := runRelay(t, testConfig{Store: s, Publisher: b, Options: Options{Workers: 1, PollInterval: time.Hour}, SettleDelay: time.Hour})
	writeCommitted(t, s, events("warm", 0, 1))
	r.Wake()
	snk.waitDistinct(t, 1)

	const n = 20
	rts.Start()
	for i := range n {
		writeCommitted(t, s, events(fmt.Sprintf("k%d", i), 0, 1))
		r.Wake()
		snk.waitDistinct(t, 2+i)
		time.Sleep(5 * time.Millisecond)
	}
	rts.Stop()
	claims := rts.Count("OutboxClaim")
	t.Logf("%d messages, %d claims", n, claims)
	// A few more may be the warm-up's, late on a loaded machine: the
	// worker's first claim at start, and the claim that the warm message's
	// wake-up triggers once that message was taken (settling it, finding
	// nothing).
	require.LessOrEqual(t, claims, n+warmUpClaims(1), "one claim per message, not a claim and a settle")
}

// warmUpClaims bounds the claims of a relay's start and warm-up that can
// fall, on a loaded machine, after a test began to count: each of its
// workers' first claim and the one a warm-up message's wake-up triggers
// after the message was taken. A relay that paid a claim and a settle per
// message would exceed the count by the number of messages.
func warmUpClaims(workers int) int { return workers + 1 }

// One key's messages written one at a time, each once the one before was
// published (a saga's commands, a participant's replies to one saga), cost
// one claim each with several workers too: the worker woken for a message
// settles the previous one, published by whichever worker, in the claim
// that takes it, instead of finding it held back behind that previous row
// until its publisher settles it. A structural count of statements.
func TestKeyChainAcrossWorkersCostsOneClaimEach(t *testing.T) {
	t.Parallel()
	var rts dbtest.RoundTrips
	pool := dbtest.PoolWith(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = &rts })
	s := dbtest.StoreOnPool(t, pool, store.LineMessaging)
	b := amqptest.NewBroker(t, rabbitmq.Config{})
	snk := newSink(t, b)
	r, _ := runRelay(t, testConfig{Store: s, Publisher: b, Options: Options{Workers: 3, PollInterval: time.Hour}, SettleDelay: time.Hour})
	writeCommitted(t, s, events("warm", 0, 1))
	r.Wake()
	snk.waitDistinct(t, 1)

	const n = 20
	rts.Start()
	for i := range n {
		id := writeCommitted(t, s, events("chain", i, 1))[0]
		r.Wake()
		snk.waitDistinct(t, 2+i)
		// The relay has recorded the confirm: the next message of the key
		// comes after it, as a saga's next message comes after the reply
		// to its previous one. The row awaits a claim to be settled, or a
		// worker's first claim, late on a busy machine, settled it already.
		require.Eventually(t, func() bool { return r.confirmed.pending() || outboxRows(t, s, id) == 0 }, waitFor, time.Millisecond)
	}
	rts.Stop()
	claims := rts.Count("OutboxClaim")
	t.Logf("%d messages, %d claims", n, claims)
	// Held back, every message cost an empty claim and a settle besides
	// its own. A few more may be the warm-up's (see warmUpClaims).
	require.LessOrEqual(t, claims, n+warmUpClaims(3), "one claim per message, not an empty claim and a settle")
	_, order := snk.snapshot()
	require.IsIncreasing(t, order["chain"])
}

// One key's messages written one at a time, each once the one before was
// published (a saga's commands), all arrive with two workers and no poll to
// fall back on: a wake-up whose claim finds the new row behind its key's
// previous row, published but not yet settled by the other worker, is not
// lost.
func TestKeyChainWrittenAfterEachPublishArrives(t *testing.T) {
	t.Parallel()
	forModes(t, testKeyChainWrittenAfterEachPublishArrives)
}

func testKeyChainWrittenAfterEachPublishArrives(t *testing.T, mode Mode, s *dbtest.DB) {
	b := amqptest.NewBroker(t, rabbitmq.Config{})
	snk := newSink(t, b)
	r, _ := runRelay(t, testConfig{Store: s, Publisher: b, Options: Options{Mode: mode, Workers: 2, PollInterval: time.Hour}})
	const n = 60
	for i := range n {
		writeCommitted(t, s, events("chain", i, 1))
		r.Wake()
		snk.waitDistinct(t, i+1)
	}
	_, order := snk.snapshot()
	require.IsIncreasing(t, order["chain"])
}

// A reply given up on in a batch of its own, where nothing failed beside
// it, is recorded dead at once: it is published UnroutableAttempts times,
// never again. (The batch's settle once kept only its confirmed rows, so a
// dead row alone was dropped, published again after its lease, and given
// up on again, for ever.)
func TestUnroutableReplyAloneIsRecordedDead(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t, store.LineMessaging)
	b := amqptest.NewBroker(t, amqptest.Config(t))
	ctx := context.Background()
	msgs := []message.Message{{
		Envelope: message.Envelope{Type: "inventory.reserve", Kind: message.KindReplyFailure, RoutingKey: "gone", SagaID: uuid.New(), Step: "reserve"},
		Payload:  []byte(`{"reason":"poison"}`),
	}}
	writeCommitted(t, s, msgs)
	const attempts = 2
	runRelay(t, testConfig{Store: s, Publisher: b, Options: Options{UnroutableAttempts: attempts, PollInterval: 50 * time.Millisecond, Lease: 2 * time.Second, PublishTimeout: time.Second}})
	require.Eventually(t, func() bool {
		st, err := s.OutboxStats(ctx)
		return err == nil && st.Dead == 1
	}, waitFor, 20*time.Millisecond, "the reply is recorded dead")
	dead, err := s.Store.DeadRows(ctx, nil, 10)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, msgs[0].MessageID, dead[0].Message.MessageID)
	require.Equal(t, attempts, dead[0].PublishAttempts, "published UnroutableAttempts times, no more")
}

// A reply that no queue takes (its reply_to routes nowhere) is published
// UnroutableAttempts times and then given up on: dead, with the reason,
// out of the backlog and visible, so that it does not keep the relay failing
// for ever; a command to nowhere keeps being retried (its saga waits for
// the participant's queue). An operator's retry publishes the dead reply
// once a queue takes it.
func TestUnroutableReplyIsGivenUpAndCanBeRetried(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t, store.LineMessaging)
	b := amqptest.NewBroker(t, amqptest.Config(t))
	ctx := context.Background()
	reply := message.Message{
		Envelope: message.Envelope{Type: "inventory.reserve", Kind: message.KindReplyFailure, RoutingKey: "gone", SagaID: uuid.New(), Step: "reserve"},
		Payload:  []byte(`{"reason":"poison"}`),
	}
	command := message.Message{
		Envelope: message.Envelope{Type: "nowhere.do", Kind: message.KindCommand, SagaID: uuid.New(), Step: "do", ReplyTo: "orders"},
		Payload:  []byte(`{}`),
	}
	msgs := []message.Message{reply, command}
	writeCommitted(t, s, msgs)
	reply, command = msgs[0], msgs[1]
	const attempts = 3
	runRelay(t, testConfig{Store: s, Publisher: b, Options: Options{UnroutableAttempts: attempts, PollInterval: 50 * time.Millisecond}})

	require.Eventually(t, func() bool {
		st, err := s.OutboxStats(ctx)
		return err == nil && st.Dead == 1
	}, waitFor, 20*time.Millisecond, "the reply is given up on")
	dead, err := s.Store.DeadRows(ctx, nil, 10)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, reply.MessageID, dead[0].Message.MessageID)
	require.Equal(t, attempts, dead[0].PublishAttempts)
	require.Contains(t, dead[0].Reason, "unroutable after 3 attempts")
	require.False(t, dead[0].DeadAt.IsZero())
	var inView int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{s.Schema()}.Sanitize()+`.sagabox_outbox_dead_v WHERE message_id = $1`, reply.MessageID).Scan(&inView))
	require.Equal(t, 1, inView, "the view shows it")

	require.Eventually(t, func() bool {
		var n int
		err := s.Pool.QueryRow(ctx, `SELECT publish_attempts FROM `+pgx.Identifier{s.Schema()}.Sanitize()+`.sagabox_outbox WHERE message_id = $1`, command.MessageID).Scan(&n)
		return err == nil && n > attempts+1
	}, waitFor, 20*time.Millisecond, "the command is still retried")
	st, err := s.OutboxStats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Backlog, "only the command is still waiting")

	// A queue for the reply appears; the operator retries it.
	spec := transport.QueueSpec{Name: "gone", Replies: true}
	require.NoError(t, b.Declare(ctx, spec))
	n, err := s.Store.RetryDeadRows(ctx, []int64{dead[0].ID})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Equal(t, reply.MessageID, firstDelivered(t, b, spec, "the retried reply"))
}

// firstDelivered subscribes to spec until a message arrives and returns its
// id, failing the test if what (the message awaited) is not published
// within waitFor.
func firstDelivered(t *testing.T, b transport.Broker, spec transport.QueueSpec, what string) uuid.UUID {
	t.Helper()
	got := make(chan uuid.UUID, 1)
	stop := testkit.Run(t, func(ctx context.Context) error {
		return b.Subscribe(ctx, spec, transport.HandlerFunc(func(_ context.Context, d *transport.Delivery) transport.Outcome {
			select {
			case got <- d.MessageID:
			default: // the test reads only the first
			}
			return transport.Ack()
		}), nil)
	})
	defer func() { require.NoError(t, stop()) }()
	select {
	case id := <-got:
		return id
	case <-time.After(waitFor):
		t.Fatalf("%s was not published within %s", what, waitFor)
		return uuid.Nil
	}
}

// outboxRows counts the outbox rows of message id (0 once settled). It is
// safe in a require.Eventually condition.
func outboxRows(t *testing.T, s *dbtest.DB, id uuid.UUID) int {
	var n int
	err := s.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+pgx.Identifier{s.Schema()}.Sanitize()+`.sagabox_outbox WHERE message_id = $1`, id).Scan(&n)
	if err != nil {
		t.Errorf("count the outbox rows of %s: %v", id, err)
	}
	return n
}

// deleteOutboxRow deletes the outbox row of message id, as a terminated
// saga's withdrawal or an operator does.
func deleteOutboxRow(t *testing.T, s *dbtest.DB, id uuid.UUID) {
	t.Helper()
	_, err := s.Pool.Exec(context.Background(), `DELETE FROM `+pgx.Identifier{s.Schema()}.Sanitize()+`.sagabox_outbox WHERE message_id = $1`, id)
	require.NoError(t, err)
}
