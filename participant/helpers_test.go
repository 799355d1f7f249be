package participant_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
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
	"github.com/sagabox/sagabox/participant"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/store/driver"
	"github.com/sagabox/sagabox/transport"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

const (
	waitFor = 30 * time.Second
	service = "inventory"
	orch    = "orch" // the queue replies go to
)

// The contracts of the test participant: an inventory with a stock counter.
type ReserveReq struct {
	SKU string `json:"sku"`
	Qty int    `json:"qty"`
}

type ReserveReply struct {
	Remaining int `json:"remaining"`
}

type ReleaseReq struct {
	SKU string `json:"sku"`
	Qty int    `json:"qty"`
}

var (
	Reserve = saga.NewCommand[ReserveReq, ReserveReply]("inventory.reserve")
	Release = saga.NewCommand[ReleaseReq, saga.None]("inventory.release")
)

// env is one test's world: a fresh schema with a stock table, a RabbitMQ
// namespace and a consumer of the replies sent to orch.
type env struct {
	t       *testing.T
	store   *dbtest.DB
	ns      string
	broker  *rabbitmq.Broker // the test's own connection (publishing, replies)
	replies *sink
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvOnPool(t, dbtest.Pool(t))
}

// newEnvOnPool is newEnv on pool.
func newEnvOnPool(t *testing.T, pool *pgxpool.Pool) *env {
	t.Helper()
	s := dbtest.StoreOnPool(t, pool, store.LineMessaging)
	_, err := s.Pool.Exec(context.Background(), fmt.Sprintf(
		`CREATE TABLE %[1]s.stock (sku text PRIMARY KEY, qty integer NOT NULL);
		 CREATE TABLE %[1]s.cancelled (order_id text PRIMARY KEY)`, pgx.Identifier{s.Schema()}.Sanitize()))
	require.NoError(t, err)
	ns := amqptest.Namespace(t)
	b := amqptest.NewBroker(t, rabbitmq.Config{Namespace: ns})
	e := &env{t: t, store: s, ns: ns, broker: b}
	e.replies = newSink(t, b, transport.QueueSpec{Name: orch, Replies: true})
	return e
}

// newBroker returns another connection to the env's namespace.
func (e *env) newBroker() *rabbitmq.Broker {
	return amqptest.NewBroker(e.t, rabbitmq.Config{Namespace: e.ns})
}

func (e *env) table(name string) string {
	return pgx.Identifier{e.store.Schema(), name}.Sanitize()
}

func (e *env) setStock(sku string, qty int) {
	e.t.Helper()
	_, err := e.store.Pool.Exec(context.Background(), "INSERT INTO "+e.table("stock")+" (sku, qty) VALUES ($1, $2)", sku, qty)
	require.NoError(e.t, err)
}

func (e *env) stock(sku string) int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.store.Pool.QueryRow(context.Background(), "SELECT qty FROM "+e.table("stock")+" WHERE sku = $1", sku).Scan(&n))
	return n
}

// outboxCount counts the outbox rows answering (or caused by) correlation.
func (e *env) outboxReplies(correlation uuid.UUID) int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.store.Pool.QueryRow(context.Background(),
		"SELECT count(*) FROM "+e.table("sagabox_outbox")+" WHERE correlation_id = $1", correlation.String()).Scan(&n))
	return n
}

func (e *env) duplicates(id uuid.UUID) int {
	e.t.Helper()
	var n int
	err := e.store.Pool.QueryRow(context.Background(), "SELECT duplicates FROM "+e.table("sagabox_inbox")+" WHERE message_id = $1", id).Scan(&n)
	if errors.Is(err, pgx.ErrNoRows) {
		return -1
	}
	require.NoError(e.t, err)
	return n
}

// config returns a client config for the env with tiny backoffs.
func (e *env) config(b transport.Broker) participant.Config {
	return participant.Config{
		Pool:    e.store.Pool,
		Schema:  e.store.Schema(),
		Service: service,
		Broker:  b,
		Workers: 2,
		Retry: saga.RetryPolicy{
			InitialInterval: time.Millisecond, MaximumInterval: 20 * time.Millisecond, MaxAttempts: 3,
		},
		StopTimeout: 10 * time.Second,
		Relay:       participant.RelayConfig{PollInterval: 200 * time.Millisecond},
		// Published replies are kept (marked), so that the tests can count
		// the replies each delivery wrote.
		Retention: participant.RetentionConfig{Outbox: time.Hour},
		Logger:    amqptest.Logger(e.t),
	}
}

// start runs c until the test ends (or stop is called) and declares its
// queue first, so that messages published right away are routed.
func (e *env) start(c *participant.Client, b transport.Broker) (stop func() error) {
	e.t.Helper()
	require.NoError(e.t, b.Declare(context.Background(), c.QueueSpec()))
	stop = testkit.Run(e.t, c.Run)
	// Tests crash a client's broker or database on purpose: how Run ends is
	// for a test to check through stop, not for the end of every test.
	e.t.Cleanup(func() { _ = stop() })
	return stop
}

// inventory registers the stock handlers on c.
func inventory(e *env, c *participant.Client) {
	participant.HandleCommand(c, Reserve, func(ctx context.Context, tx pgx.Tx, req *participant.Request[ReserveReq]) (ReserveReply, error) {
		var left int
		err := tx.QueryRow(ctx, "UPDATE "+e.table("stock")+" SET qty = qty - $2 WHERE sku = $1 AND qty >= $2 RETURNING qty",
			req.Data.SKU, req.Data.Qty).Scan(&left)
		if errors.Is(err, pgx.ErrNoRows) {
			return ReserveReply{}, participant.RejectWithCode("out_of_stock", fmt.Errorf("not enough %s in stock for %d", req.Data.SKU, req.Data.Qty))
		}
		return ReserveReply{Remaining: left}, err
	})
	participant.HandleCompensation(c, Release, func(ctx context.Context, tx pgx.Tx, req *participant.Request[ReleaseReq]) error {
		_, err := tx.Exec(ctx, "UPDATE "+e.table("stock")+" SET qty = qty + $2 WHERE sku = $1", req.Data.SKU, req.Data.Qty)
		return err
	})
}

// newClient returns a started client with the inventory handlers on a
// broker of its own.
func (e *env) newClient(mod func(*participant.Config), register func(*participant.Client)) *participant.Client {
	e.t.Helper()
	b := e.newBroker()
	cfg := e.config(b)
	if mod != nil {
		mod(&cfg)
	}
	c, err := participant.NewClient(cfg)
	require.NoError(e.t, err)
	if register == nil {
		inventory(e, c)
	} else {
		register(c)
	}
	e.start(c, b)
	return c
}

// message returns a saga message for the participant with a fresh id.
func newMessage(sagaID uuid.UUID, step string, kind message.Kind, typ string, data any) message.Message {
	payload, err := json.Marshal(data)
	if err != nil {
		panic(err)
	}
	return message.Message{
		Envelope: message.Envelope{
			Version: message.Version, MessageID: uuid.Must(uuid.NewV7()), Type: typ, Kind: kind, RoutingKey: typ,
			SagaID: sagaID, SagaType: "checkout", Step: step, StepIndex: 1, Attempt: 1, ReplyTo: orch,
			CreatedAt: time.Now().UTC(),
		},
		Payload: payload,
	}
}

func reserve(sagaID uuid.UUID, sku string, qty int) message.Message {
	return newMessage(sagaID, "reserve", message.KindCommand, Reserve.Name(), ReserveReq{SKU: sku, Qty: qty})
}

func release(sagaID uuid.UUID, sku string, qty int) message.Message {
	return newMessage(sagaID, "reserve", message.KindCompensation, Release.Name(), ReleaseReq{SKU: sku, Qty: qty})
}

// resend returns m with a new message id, as an orchestrator re-sends a
// step after a timeout.
func resend(m message.Message) message.Message {
	m.MessageID = uuid.Must(uuid.NewV7())
	m.Attempt++
	return m
}

func (e *env) publish(msgs ...message.Message) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	require.NoError(e.t, e.broker.Publish(ctx, msgs...))
}

// sink records every delivery of one queue by correlation id and message id.
type sink struct {
	mu     sync.Mutex
	byCorr map[string][]message.Message
	byID   map[uuid.UUID]int
}

func newSink(t *testing.T, b transport.Broker, spec transport.QueueSpec) *sink {
	t.Helper()
	s := &sink{byCorr: map[string][]message.Message{}, byID: map[uuid.UUID]int{}}
	require.NoError(t, b.Declare(context.Background(), spec))
	testkit.Run(t, func(ctx context.Context) error {
		return b.Subscribe(ctx, spec, transport.HandlerFunc(func(_ context.Context, d *transport.Delivery) transport.Outcome {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.byID[d.MessageID]++
			if s.byID[d.MessageID] == 1 {
				s.byCorr[d.CorrelationID] = append(s.byCorr[d.CorrelationID], d.Message)
			}
			return transport.Ack()
		}), &transport.SubscribeOpts{Concurrency: 1, Prefetch: 50})
	})
	return s
}

// wait returns the reply to the message id, waiting for it to arrive.
func (s *sink) wait(t *testing.T, id uuid.UUID) message.Message {
	t.Helper()
	var got message.Message
	testkit.WaitFor(t, waitFor, "the reply to message "+id.String(), func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		if ms := s.byCorr[id.String()]; len(ms) > 0 {
			got = ms[0]
			return true
		}
		return false
	})
	return got
}

func (s *sink) count(id uuid.UUID) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byCorr[id.String()])
}

// all returns every distinct message received.
func (s *sink) all() []message.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []message.Message
	for _, ms := range s.byCorr {
		out = append(out, ms...)
	}
	return out
}

func requireSuccess(t *testing.T, m message.Message) {
	t.Helper()
	require.Equal(t, message.KindReplySuccess, m.Kind, "reply payload: %s", m.Payload)
}

func requireFailure(t *testing.T, m message.Message, code string) saga.Failure {
	t.Helper()
	require.Equal(t, message.KindReplyFailure, m.Kind, "reply payload: %s", m.Payload)
	f, err := saga.DecodeFailure(m.Payload)
	require.NoError(t, err)
	require.Equal(t, code, f.Code, "failure: %+v", f)
	return f
}

// barrier returns the barrier marks of saga id by phase: their outcomes.
func (e *env) barrier(id uuid.UUID) map[message.Phase]driver.BarrierOutcome {
	e.t.Helper()
	rows, err := e.store.Pool.Query(context.Background(), "SELECT phase, outcome FROM "+e.table("sagabox_barrier")+" WHERE saga_id = $1", id)
	require.NoError(e.t, err)
	out := map[message.Phase]driver.BarrierOutcome{}
	for rows.Next() {
		var phase, outcome string
		require.NoError(e.t, rows.Scan(&phase, &outcome))
		out[message.Phase(phase)] = driver.BarrierOutcome(outcome)
	}
	require.NoError(e.t, rows.Err())
	return out
}
