package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/internal/testkit/servers"
	"github.com/sagabox/sagabox/transport"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

func TestMain(m *testing.M) {
	testkit.WrapTestMain(m)
}

// services are the example's services: each has a schema and a queue.
var services = []string{"orders", "inventory", "payment", "shipping", "loyalty"}

var summaryLine = regexp.MustCompile(`(?m)^checkout: (\d+) sagas, (\d+) completed, (\d+) compensated, (\d+) failed, (\d+) still running$`)

// isolated returns flags that keep a run's schemas and queues to itself, and
// removes them when the test ends.
func isolated(t *testing.T) []string {
	t.Helper()
	pool := dbtest.Pool(t)
	prefix := dbtest.SchemaName(t) + "_"
	for _, svc := range services {
		dbtest.DropSchemaOnCleanup(t, pool, prefix+svc)
	}
	return append([]string{"-database-url", dbtest.URL(), "-schema-prefix", prefix}, isolatedQueues(t)...)
}

// isolatedQueues returns flags that keep a run's queues to itself, and
// removes them when the test ends.
func isolatedQueues(t *testing.T) []string {
	t.Helper()
	cfg := amqptest.Config(t)
	t.Cleanup(func() {
		// Declare the example's queues through a test broker so that its
		// cleanup deletes them with the namespace's exchanges.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		b, err := rabbitmq.New(ctx, cfg)
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		for _, svc := range services {
			_ = b.Declare(ctx, transport.QueueSpec{Name: svc})
		}
		_ = b.Close()
		amqptest.DeleteTopology(t, b)
	})
	return []string{"-amqp-url", amqptest.URL(t), "-namespace", cfg.Namespace}
}

type summary struct{ sagas, completed, compensated, failed, running int }

func parseSummary(t *testing.T, out string) summary {
	t.Helper()
	m := summaryLine.FindStringSubmatch(out)
	require.NotNil(t, m, "no summary line in output:\n%s", out)
	n := make([]int, 5)
	for i := range n {
		n[i], _ = strconv.Atoi(m[i+1])
	}
	return summary{n[0], n[1], n[2], n[3], n[4]}
}

// The example end to end in one process: happy and compensation paths (a
// rejection by each of inventory, payment and shipping, and a payment
// confirmation that never comes), and the business invariants it audits.
func TestCheckoutEndToEnd(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	args := append(isolated(t), "-orders", "30", "-fail-rate", "0.5", "-run-id", "e2e"+dbtest.SchemaName(t)[2:8])
	code := run(context.Background(), args, &out, &errOut)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out.String(), errOut.String())

	s := parseSummary(t, out.String())
	require.Equal(t, 30, s.sagas)
	require.Positive(t, s.completed, "happy path")
	require.Positive(t, s.compensated, "compensation path")
	require.Zero(t, s.failed)
	require.Zero(t, s.running)
	require.Contains(t, out.String(), "timeline of a completed saga")
	require.Contains(t, out.String(), "timeline of a compensated saga")
	require.Contains(t, out.String(), "step-rejected")
	require.Contains(t, out.String(), "compensation-sent")
	// The payment provider's confirmation: received by the webhook and
	// consumed by the waiting step, or (for the account on hold) never sent,
	// so that the wait times out and the charge is refunded.
	require.Contains(t, out.String(), "await-payment-confirmation  event-received")
	require.Contains(t, out.String(), "await-payment-confirmation  timed-out")
	require.Contains(t, out.String(), "payment.refund")
	// Loyalty points beside shipping: revoked when shipping rejects.
	require.Contains(t, out.String(), "award-points")
	require.Regexp(t, `loyalty: \d+ points awarded for \d+ completed orders; [1-9]\d* awards revoked`, out.String())
	require.Regexp(t, `payment confirmations: the provider confirmed (\d+) charges in \d+ webhook calls \([1-9]\d* recognised as redeliveries here\); (\d+) recorded`, out.String())
	require.Contains(t, out.String(), "invariants: OK")
}

// freeAddr returns a local address no one listens on now, for a service
// that other processes must find at a known address.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// Running the example twice against the same schemas and queues works: setup
// is idempotent.
func TestCheckoutRerun(t *testing.T) {
	t.Parallel()
	args := isolated(t)
	for i := range 2 {
		var out, errOut bytes.Buffer
		code := run(context.Background(), append(args, "-orders", "4", "-fail-rate", "0.5"), &out, &errOut)
		require.Equal(t, 0, code, "run %d stdout:\n%s\nstderr:\n%s", i, out.String(), errOut.String())
		require.Equal(t, 4, parseSummary(t, out.String()).sagas)
	}
}

func TestCheckoutUnreachableServices(t *testing.T) {
	t.Parallel()
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		var out, errOut bytes.Buffer
		code := run(context.Background(), []string{"-database-url", "postgres://postgres:s3cret@127.0.0.1:1/x"}, &out, &errOut)
		require.Equal(t, 1, code)
		msg := errOut.String()
		require.Contains(t, msg, "PostgreSQL is unreachable at 127.0.0.1:1")
		require.Contains(t, msg, "pg_ctlcluster")
		require.NotContains(t, msg, "s3cret")
	})
	t.Run("rabbitmq", func(t *testing.T) {
		t.Parallel()
		var out, errOut bytes.Buffer
		code := run(context.Background(), []string{"-database-url", dbtest.URL(), "-amqp-url", "amqp://guest:s3cret@127.0.0.1:1/"}, &out, &errOut)
		require.Equal(t, 1, code)
		msg := errOut.String()
		require.Contains(t, msg, "cannot connect to RabbitMQ at 127.0.0.1:1")
		require.Contains(t, msg, "rabbitmq-server -detached")
		require.NotContains(t, msg, "s3cret")
	})
	t.Run("bad flag", func(t *testing.T) {
		t.Parallel()
		var out, errOut bytes.Buffer
		require.Equal(t, 2, run(context.Background(), []string{"-service", "billing"}, &out, &errOut))
		require.Contains(t, errOut.String(), `-service "billing"`)
	})
}

// The services run as separate processes; inventory is killed with SIGKILL
// while sagas are in flight and started again. Every saga still ends, as
// planned, and the invariants hold.
func TestCheckoutSurvivesKilledParticipant(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "checkout")
	build := exec.Command("go", "build", "-o", bin, ".")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	runID := "kill" + dbtest.SchemaName(t)[2:8]
	webhook := freeAddr(t)
	common := append(isolated(t), "-run-id", runID, "-orders", "40", "-fail-rate", "0.3",
		"-webhook-addr", webhook, "-webhook-url", "http://"+webhook+"/webhooks/payment")
	start := func(service string) (*exec.Cmd, *testkit.Buffer) {
		var buf testkit.Buffer
		cmd := exec.Command(bin, append(append([]string{}, common...), "-service", service)...)
		cmd.Stdout, cmd.Stderr = &buf, &buf
		require.NoError(t, cmd.Start())
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_, _ = cmd.Process.Wait()
		})
		require.Eventually(t, func() bool { return strings.Contains(buf.String(), "service running") },
			60*time.Second, 20*time.Millisecond, "%s did not start:\n%s", service, buf.String())
		return cmd, &buf
	}
	inventory, _ := start("inventory")
	start("payment")
	start("shipping")
	start("loyalty")

	var ordersOut testkit.Buffer
	orders := exec.Command(bin, append(append([]string{}, common...), "-service", "orders")...)
	orders.Stdout, orders.Stderr = &ordersOut, &ordersOut
	require.NoError(t, orders.Start())
	done := make(chan error, 1)
	go func() { done <- orders.Wait() }()

	// Kill inventory once sagas are in flight: it has reserved stock for
	// some orders.
	pool := dbtest.Pool(t)
	prefix := common[3]
	require.Eventually(t, func() bool {
		var n int
		err := pool.QueryRow(context.Background(),
			fmt.Sprintf(`SELECT count(*) FROM %q.reservation`, prefix+"inventory")).Scan(&n)
		return err == nil && n > 0
	}, 60*time.Second, 2*time.Millisecond, "no reservation made:\n%s", ordersOut.String())
	require.NoError(t, inventory.Process.Kill())
	_, _ = inventory.Process.Wait()
	start("inventory")

	select {
	case err := <-done:
		require.NoError(t, err, "orders failed:\n%s", ordersOut.String())
	case <-time.After(3 * time.Minute):
		_ = orders.Process.Kill()
		t.Fatalf("orders did not finish:\n%s", ordersOut.String())
	}
	s := parseSummary(t, ordersOut.String())
	require.Equal(t, summary{sagas: 40, completed: s.completed, compensated: 40 - s.completed}, s, ordersOut.String())
	require.Contains(t, ordersOut.String(), "invariants: OK")
}

// notifyWriter copies writes to buf and reports each write on ch.
type notifyWriter struct {
	buf *testkit.Buffer
	ch  chan struct{}
}

func (w notifyWriter) Write(p []byte) (int, error) {
	n, err := w.buf.Write(p)
	select {
	case w.ch <- struct{}{}:
	default:
	}
	return n, err
}

// The example shows its telemetry: one saga's trace across the services
// (-trace) and Prometheus metrics while it runs (-metrics-addr).
func TestCheckoutShowsTraceAndMetrics(t *testing.T) {
	t.Parallel()
	var out testkit.Buffer
	w := notifyWriter{buf: &out, ch: make(chan struct{}, 1)}
	args := append(isolated(t), "-orders", "80", "-fail-rate", "0", "-trace", "-metrics-addr", "127.0.0.1:0")
	done := make(chan int, 1)
	go func() { done <- run(context.Background(), args, w, io.Discard) }()

	addr := regexp.MustCompile(`metrics at (http://\S+/metrics)`)
	var scraped string
	for scraped == "" {
		select {
		case code := <-done:
			t.Fatalf("the example ended (exit %d) before its metrics were scraped:\n%s", code, out.String())
		case <-w.ch:
		}
		m := addr.FindStringSubmatch(out.String())
		if m == nil || !strings.Contains(out.String(), "placing") {
			continue
		}
		resp, err := http.Get(m[1])
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		require.NoError(t, err)
		if strings.Contains(string(body), "sagabox_sagas_started") {
			scraped = string(body)
		}
	}
	require.Equal(t, 0, <-done, out.String())
	require.Contains(t, scraped, `saga_type="checkout"`)

	trace := out.String()[strings.Index(out.String(), "trace "):]
	for _, want := range []string{"start saga checkout", "send command inventory.reserve", "process command inventory.reserve",
		"component=participant", "process reply-success shipping.create", "component=orchestrator"} {
		require.Contains(t, trace, want)
	}
}

// The whole example rides through a crash and restart of its database
// (a private cluster, stopped with -m immediate while sagas are in flight):
// the orders service's own loops and every client wait for it, and every
// saga still ends as planned.
func TestCheckoutSurvivesDatabaseRestart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	pg, err := servers.StartPostgres(ctx, servers.PostgresOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, pg.Close()) })
	pool, err := pgxpool.New(ctx, pg.URL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	var out, errOut testkit.Buffer
	// The payment confirmations wait out the restart too (the webhook
	// fails meanwhile and the provider calls again): a wait long enough for
	// that, so that only the planned ones time out.
	args := append([]string{"-database-url", pg.URL(), "-orders", "40", "-fail-rate", "0.3", "-run-id", "dbrestart",
		"-confirm-timeout", "15s"}, isolatedQueues(t)...)
	done := make(chan int, 1)
	go func() { done <- run(ctx, args, &out, &errOut) }()

	require.Eventually(t, func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM inventory.reservation`).Scan(&n)
		return err == nil && n > 0
	}, 2*time.Minute, 5*time.Millisecond, "no reservation made:\n%s\n%s", out.String(), errOut.String())
	require.NoError(t, pg.Restart(ctx, "immediate"))

	select {
	case code := <-done:
		require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out.String(), errOut.String())
	case <-ctx.Done():
		t.Fatalf("the example did not finish:\n%s\n%s", out.String(), errOut.String())
	}
	s := parseSummary(t, out.String())
	require.Equal(t, summary{sagas: 40, completed: s.completed, compensated: 40 - s.completed}, s, out.String())
	require.Contains(t, out.String(), "invariants: OK")
	// The restart was seen (by the orders loops, a client or a relay,
	// whichever was talking to the database then) and waited out.
	require.Regexp(t, lostDatabase, errOut.String(), "the restart was seen and waited out")
}

// lostDatabase matches what the example's processes log when the database
// goes away under them.
var lostDatabase = regexp.MustCompile(`unreachable|failed to connect|connection reset|unexpected EOF|57P0[123]|SQLSTATE 08`)

var flowLine = regexp.MustCompile(`(?m)^flow control: (\d+) of (\d+) sagas waited for admission .*; step time-outs: (\d+)$`)

// TestCheckoutBurstIsAdmittedWithoutTimeouts: a burst of orders placed
// faster than they complete waits for admission instead of piling commands
// up in front of the participants: the sagas beyond the limit are queued,
// admitted as others end, and no step times out. (The documented run is
// 5,000 orders with the default limit; this one scales it down for CI.)
func TestCheckoutBurstIsAdmittedWithoutTimeouts(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	args := append(isolated(t), "-orders", "600", "-placers", "8", "-max-running", "50", "-fail-rate", "0.3",
		"-timeout", "5m", "-run-id", "burst"+dbtest.SchemaName(t)[2:8])
	code := run(context.Background(), args, &out, &errOut)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out.String(), errOut.String())
	s := parseSummary(t, out.String())
	require.Equal(t, summary{sagas: 600, completed: s.completed, compensated: 600 - s.completed}, s)
	m := flowLine.FindStringSubmatch(out.String())
	require.NotNil(t, m, "no flow control line:\n%s", out.String())
	waited, _ := strconv.Atoi(m[1])
	require.Positive(t, waited, "the burst went past the limit: %s", m[0])
	require.Equal(t, "0", m[3], "no step timed out: %s", m[0])
	require.Contains(t, out.String(), "invariants: OK")
}

// With -place=false the orders service runs its orchestrator only, as a
// further instance next to the one that places the orders: it places
// nothing and runs until stopped.
func TestCheckoutFurtherOrdersInstance(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out testkit.Buffer
	args := append(isolated(t), "-service", "orders", "-place=false", "-orders", "5", "-webhook-addr", "127.0.0.1:0")
	done := make(chan int, 1)
	go func() { done <- run(ctx, args, &out, io.Discard) }()
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "orders service running") },
		60*time.Second, 20*time.Millisecond, out.String())
	require.NotContains(t, out.String(), "placing")
	cancel()
	require.Equal(t, 0, <-done, out.String())

	var errOut bytes.Buffer
	require.Equal(t, 2, run(context.Background(), []string{"-rate", "-1"}, io.Discard, &errOut))
	require.Contains(t, errOut.String(), "-rate")
}

// The example runs with every service's relay in log mode (-relay-mode
// log) on a private cluster with wal_level = logical: every saga ends as
// planned and the business invariants hold.
func TestCheckoutInLogRelayMode(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	pg, err := servers.StartPostgres(ctx, servers.PostgresOptions{Settings: map[string]string{"wal_level": "logical"}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, pg.Close()) })

	var out, errOut testkit.Buffer
	args := append([]string{"-database-url", pg.URL(), "-orders", "30", "-fail-rate", "0.3", "-run-id", "logmode", "-relay-mode", "log"}, isolatedQueues(t)...)
	code := run(ctx, args, &out, &errOut)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out.String(), errOut.String())
	s := parseSummary(t, out.String())
	require.Equal(t, summary{sagas: 30, completed: s.completed, compensated: 30 - s.completed}, s, out.String())
	require.Contains(t, out.String(), "invariants: OK")

	pool, err := pgxpool.New(ctx, pg.URL())
	require.NoError(t, err)
	defer pool.Close()
	var slots int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'sagabox_%'`).Scan(&slots))
	require.Equal(t, len(services), slots, "one slot per service")
}
