// Package amqptest holds helpers for tests that need RabbitMQ: the broker
// URL, a unique namespace per test, a rabbitmq.Broker cleaned up with its
// topology, raw publishing and consuming, and a way to sever a test's own
// connection.
//
// The broker is read from TEST_AMQP_URL (default DefaultURL). A broker that
// cannot be reached fails the test with the command that starts it; it never
// skips.
package amqptest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/transport"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

// DefaultURL is the broker used when TEST_AMQP_URL is not set.
const DefaultURL = "amqp://guest:guest@127.0.0.1:5672/"

// StartCommand is how to start the broker the tests expect.
const StartCommand = "rabbitmq-server -detached"

// Timeout bounds every wait of this package's helpers.
const Timeout = 30 * time.Second

var (
	reachOnce sync.Once
	reachErr  error
)

// URL returns the test broker's URL. It fails t, saying how to start
// RabbitMQ, when the broker cannot be reached.
func URL(t testing.TB) string {
	t.Helper()
	u := os.Getenv("TEST_AMQP_URL")
	if u == "" {
		u = DefaultURL
	}
	reachOnce.Do(func() {
		conn, err := amqp.DialConfig(u, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
		if err != nil {
			reachErr = err
			return
		}
		_ = conn.Close()
	})
	if reachErr != nil {
		t.Fatalf("RabbitMQ is not reachable at TEST_AMQP_URL (%s): %v\nstart it with: %s",
			redact(u), reachErr, StartCommand)
	}
	return u
}

func redact(u string) string {
	if i := strings.LastIndex(u, "@"); i >= 0 {
		if j := strings.Index(u, "://"); j >= 0 && j < i {
			user := u[j+3 : i]
			if k := strings.Index(user, ":"); k >= 0 {
				return u[:j+3] + user[:k] + ":***" + u[i:]
			}
		}
	}
	return u
}

// Namespace returns a namespace unique to this call, "t-" and 12 hex digits.
func Namespace(t testing.TB) string {
	t.Helper()
	return "t-" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
}

// ConnectionName returns the connection name tests use for namespace ns.
// CloseConnections selects connections by it (a rabbitmq.Broker names its two
// connections "<name>.publish" and "<name>.consume").
func ConnectionName(ns string) string { return "sagabox-test-" + ns }

// Logger returns a logger writing to t.Log at level Warn and above. It stops
// writing once the test is over, so late log lines never panic.
func Logger(t testing.TB) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(w.stop)
	level := slog.LevelWarn
	if os.Getenv("TEST_LOG_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

type testWriter struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimSuffix(string(p), "\n"))
	}
	return len(p), nil
}

func (w *testWriter) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.done = true
}

// Config returns a rabbitmq.Config for the test broker with a fresh
// namespace, a connection name derived from it and a test logger.
func Config(t testing.TB) rabbitmq.Config {
	t.Helper()
	ns := Namespace(t)
	return rabbitmq.Config{
		URL:            URL(t),
		Namespace:      ns,
		ConnectionName: ConnectionName(ns),
		ReconnectMin:   50 * time.Millisecond,
		ReconnectMax:   time.Second,
		Logger:         Logger(t),
	}
}

// NewBroker connects a broker with cfg, filling its empty URL, Namespace,
// ConnectionName and Logger from Config(t). On cleanup it closes the broker
// and deletes its exchanges and every queue declared through it.
func NewBroker(t testing.TB, cfg rabbitmq.Config) *rabbitmq.Broker {
	t.Helper()
	def := Config(t)
	if cfg.URL == "" {
		cfg.URL = def.URL
	}
	if cfg.Namespace == "" {
		cfg.Namespace = def.Namespace
	}
	if cfg.ConnectionName == "" {
		cfg.ConnectionName = ConnectionName(cfg.Namespace)
	}
	if cfg.ReconnectMin == 0 && cfg.ReconnectMax == 0 {
		cfg.ReconnectMin, cfg.ReconnectMax = def.ReconnectMin, def.ReconnectMax
	}
	if cfg.Logger == nil {
		cfg.Logger = def.Logger
	}
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	b, err := rabbitmq.New(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = b.Close()
		DeleteTopology(t, b)
	})
	return b
}

// DeleteTopology deletes the exchanges of b's namespace and the queues (with
// their dead-letter and retry queues) declared through b.
func DeleteTopology(t testing.TB, b *rabbitmq.Broker) {
	t.Helper()
	if err := RemoveTopology(URL(t), b); err != nil {
		t.Errorf("amqptest: %v", err)
	}
}

// RemoveTopology is DeleteTopology on the broker at url, for code without a
// testing.TB (a runnable example).
func RemoveTopology(url string, b *rabbitmq.Broker) error {
	conn, err := amqp.Dial(url)
	if err != nil {
		return fmt.Errorf("delete topology: %w", err)
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("delete topology: %w", err)
	}
	defer func() { _ = ch.Close() }()
	for _, q := range b.DeclaredQueues() {
		names := []string{b.QueueName(q), b.DeadLetterQueueName(q)}
		for _, d := range rabbitmq.RetryDelays() {
			names = append(names, b.RetryQueueName(q, d))
		}
		for _, name := range names {
			if _, err := ch.QueueDelete(name, false, false, false); err != nil {
				return fmt.Errorf("delete queue %s: %w", name, err)
			}
		}
	}
	for _, x := range []string{transport.ExchangeCommands, transport.ExchangeReplies, transport.ExchangeEvents, rabbitmq.ExchangeDeadLetter} {
		if err := ch.ExchangeDelete(b.ExchangeName(x), false, false); err != nil {
			return fmt.Errorf("delete exchange %s: %w", b.ExchangeName(x), err)
		}
	}
	return nil
}

// Dial opens a raw connection to the test broker, closed on cleanup.
func Dial(t testing.TB) *amqp.Connection {
	t.Helper()
	conn, err := amqp.Dial(URL(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// PublishRaw publishes msg as it is to exchange with key, on a raw
// connection, and waits for the broker to confirm it. It fails t if the
// message is unroutable or not confirmed.
func PublishRaw(t testing.TB, exchange, key string, msg amqp.Publishing) {
	t.Helper()
	require.NoError(t, TryPublishRaw(Dial(t), exchange, key, msg))
}

// TryPublishRaw is PublishRaw on conn, returning the error.
func TryPublishRaw(conn *amqp.Connection, exchange, key string, msg amqp.Publishing) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }()
	if err := ch.Confirm(false); err != nil {
		return err
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	dc, err := ch.PublishWithDeferredConfirm(exchange, key, true, false, msg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	ok, err := dc.WaitContext(ctx)
	if err != nil {
		return err
	}
	select {
	case r := <-returns:
		return fmt.Errorf("amqptest: message returned: %s", r.ReplyText)
	default:
	}
	if !ok {
		return fmt.Errorf("amqptest: message nacked")
	}
	return nil
}

// Consume consumes queue (which must exist) with auto-ack on a raw
// connection until the test ends, and returns the deliveries.
func Consume(t testing.TB, queue string) <-chan amqp.Delivery {
	t.Helper()
	ch, err := Dial(t).Channel()
	require.NoError(t, err)
	ds, err := ch.Consume(queue, "", true, false, false, false, nil)
	require.NoError(t, err, "consume %s", queue)
	return ds
}

// Next returns the next delivery of ds, failing t after timeout.
func Next(t testing.TB, ds <-chan amqp.Delivery, timeout time.Duration) amqp.Delivery {
	t.Helper()
	select {
	case d, ok := <-ds:
		require.True(t, ok, "delivery channel closed")
		return d
	case <-time.After(timeout):
		t.Fatalf("amqptest: no message within %s", timeout)
		return amqp.Delivery{}
	}
}

// QueueLength returns the number of ready messages in queue, and -1 when
// the queue does not exist (yet).
func QueueLength(t testing.TB, queue string) int {
	t.Helper()
	ch, err := Dial(t).Channel()
	require.NoError(t, err)
	defer func() { _ = ch.Close() }()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	var amqpErr *amqp.Error
	if errors.As(err, &amqpErr) && amqpErr.Code == amqp.NotFound {
		return -1 // not declared yet: a client's Run declares it when it starts
	}
	require.NoError(t, err)
	return q.Messages
}

// CloseConnections force-closes, with rabbitmqctl close_connection, every
// connection whose client-provided name is name or starts with name and a
// dot (both connections of a rabbitmq.Broker with ConnectionName name:
// "<name>.publish" and "<name>.consume"), and returns how many it closed.
// Selecting by name leaves other tests' connections alone, including those
// of brokers named name+"-suffix".
func CloseConnections(t testing.TB, name string) int {
	t.Helper()
	out, err := exec.Command("rabbitmqctl", "-q", "list_connections", "--no-table-headers", "pid", "client_properties").CombinedOutput()
	require.NoError(t, err, "rabbitmqctl list_connections: %s", out)
	exact := fmt.Sprintf(`{"connection_name","%s"}`, name)
	prefix := fmt.Sprintf(`{"connection_name","%s.`, name)
	n := 0
	for line := range bytes.Lines(out) {
		pid, props, ok := strings.Cut(strings.TrimSpace(string(line)), "\t")
		if !ok || (!strings.Contains(props, exact) && !strings.Contains(props, prefix)) {
			continue
		}
		out, err := exec.Command("rabbitmqctl", "-q", "close_connection", pid, "closed by amqptest").CombinedOutput()
		require.NoError(t, err, "rabbitmqctl close_connection %s: %s", pid, out)
		n++
	}
	return n
}

// RestartBroker restarts the RabbitMQ application (rabbitmqctl stop_app,
// start_app). It disturbs every connection on the broker: use it only in
// tests that run alone (build tag fault).
func RestartBroker(t testing.TB) {
	t.Helper()
	for _, args := range [][]string{{"stop_app"}, {"start_app"}, {"await_startup"}} {
		out, err := exec.Command("rabbitmqctl", args...).CombinedOutput()
		require.NoError(t, err, "rabbitmqctl %s: %s", args[0], out)
	}
}
