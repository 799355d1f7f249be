package participant_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/sagabox/sagabox/internal/telemetry"
	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/internal/testkit/telemetrytest"
	"github.com/sagabox/sagabox/participant"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/transport"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

// TestTelemetryDuplicatesDeadLettersRetriesAndSpans: a command published
// four times (one message id) is applied once and counted as three
// duplicates; a command that does not decode is dead-lettered and counted by
// reason class; a command whose handler fails once is counted as one retry.
// Every delivery gets a consumer span, a child of the sender's span, with
// its inbox outcome; the reply continues the trace from the span of the
// delivery that applied the command.
func TestTelemetryDuplicatesDeadLettersRetriesAndSpans(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.setStock("apple", 10)
	e.setStock("flaky", 10)
	tp, rec := telemetrytest.NewTracer(t)
	meter := telemetrytest.NewMeter(t)
	var handlerSpans sync.Map // message id -> span context seen by the handler
	e.newClient(func(c *participant.Config) {
		c.TracerProvider, c.MeterProvider = tp, meter.Provider
	}, func(c *participant.Client) {
		participant.HandleCommand(c, Reserve, func(ctx context.Context, tx pgx.Tx, req *participant.Request[ReserveReq]) (ReserveReply, error) {
			handlerSpans.Store(req.MessageID, trace.SpanContextFromContext(ctx))
			if req.Data.SKU == "flaky" && req.DeliveryAttempt == 1 {
				return ReserveReply{}, errors.New("flaky dependency")
			}
			var left int
			err := tx.QueryRow(ctx, "UPDATE "+e.table("stock")+" SET qty = qty - $2 WHERE sku = $1 RETURNING qty", req.Data.SKU, req.Data.Qty).Scan(&left)
			return ReserveReply{Remaining: left}, err
		})
	})

	// The sender's span: the command carries its trace context.
	ctx, sender := tp.Tracer("test").Start(context.Background(), "sender")
	cmd := reserve(uuid.New(), "apple", 1)
	cmd.TraceParent = traceParent(ctx)
	sender.End()
	bad := reserve(uuid.New(), "apple", 1)
	bad.Payload = []byte(`{"sku":"apple","qty":1,"colour":"red"}`)
	flaky := reserve(uuid.New(), "flaky", 1)
	const dups = 3
	e.publish(cmd, cmd, cmd, cmd, bad, flaky)

	reply := e.replies.wait(t, cmd.MessageID)
	requireSuccess(t, reply)
	requireFailure(t, e.replies.wait(t, bad.MessageID), saga.CodeInvalidPayload)
	requireSuccess(t, e.replies.wait(t, flaky.MessageID))
	schema := telemetry.AttrSchema.String(e.store.Schema())
	var m telemetrytest.Snapshot
	testkit.WaitFor(t, waitFor, "duplicates counted", func() bool {
		m = meter.Collect(t)
		return m.Sum(telemetry.MetricInboxDuplicates, schema) >= dups
	})
	require.Equal(t, 3, e.duplicates(cmd.MessageID), "the inbox saw the duplicates too")
	require.EqualValues(t, dups, m.Sum(telemetry.MetricInboxDuplicates, schema, telemetry.AttrMessageType.String(Reserve.Name())))
	outcome := func(o telemetry.Outcome) int64 {
		return m.Sum(telemetry.MetricMessagesHandled, schema, telemetry.AttrComponent.String("participant"), telemetry.AttrOutcome.String(o.String()))
	}
	require.EqualValues(t, dups, outcome(telemetry.OutcomeDuplicate))
	require.EqualValues(t, 2, outcome(telemetry.OutcomeApplied))
	require.EqualValues(t, 1, outcome(telemetry.OutcomeRetry))
	require.EqualValues(t, 1, outcome(telemetry.OutcomeDeadLetter))
	require.EqualValues(t, 1, m.Sum(telemetry.MetricDeadLetters, schema, telemetry.AttrReason.String(telemetry.ReasonInvalidPayload.String())))
	require.EqualValues(t, 1, m.Sum(telemetry.MetricDeadLetters))
	require.EqualValues(t, 1, m.Sum(telemetry.MetricRetries, telemetry.AttrComponent.String("participant"),
		telemetry.AttrCause.String(telemetry.CauseHandler.String()), telemetry.AttrMessageType.String(Reserve.Name())))
	require.EqualValues(t, 1, m.Sum(telemetry.MetricRetries))
	require.EqualValues(t, 3, m.Sum(telemetry.MetricRelayPublished, schema), "three replies")

	// Spans: four deliveries of cmd, children of the sender's span, one new
	// and three duplicates.
	var processed []sdktrace.ReadOnlySpan
	testkit.WaitFor(t, waitFor, "four consumer spans", func() bool {
		processed = processed[:0]
		for _, s := range rec.Ended() {
			if s.Parent().SpanID() == sender.SpanContext().SpanID() {
				processed = append(processed, s)
			}
		}
		return len(processed) == dups+1
	})
	var applied sdktrace.ReadOnlySpan
	inbox := map[string]int{}
	for _, s := range processed {
		require.Equal(t, "process command inventory.reserve", s.Name())
		require.Equal(t, trace.SpanKindConsumer, s.SpanKind())
		require.Equal(t, sender.SpanContext().TraceID(), s.SpanContext().TraceID())
		got := spanAttr(s, telemetry.AttrInbox)
		inbox[got]++
		if got == telemetry.InboxNew.String() {
			applied = s
		}
		require.Equal(t, cmd.MessageID.String(), spanAttr(s, "messaging.message.id"))
		require.Equal(t, cmd.SagaID.String(), spanAttr(s, telemetry.AttrSagaID))
	}
	require.Equal(t, map[string]int{telemetry.InboxNew.String(): 1, telemetry.InboxDuplicate.String(): dups}, inbox)
	seen, ok := handlerSpans.Load(cmd.MessageID)
	require.True(t, ok)
	require.Equal(t, applied.SpanContext(), seen, "the handler's ctx carries the consumer span")

	// The reply was written in the consumer span and published in a
	// producer span that is its child; the reply carries the producer span.
	replySC := spanContextOf(reply.TraceParent)
	require.Equal(t, sender.SpanContext().TraceID(), replySC.TraceID())
	var send sdktrace.ReadOnlySpan
	testkit.WaitFor(t, waitFor, "the reply's producer span", func() bool {
		for _, s := range rec.Ended() {
			if s.SpanContext().SpanID() == replySC.SpanID() {
				send = s
				return true
			}
		}
		return false
	})
	require.Equal(t, "send reply-success inventory.reserve", send.Name())
	require.Equal(t, trace.SpanKindProducer, send.SpanKind())
	require.Equal(t, applied.SpanContext().SpanID(), send.Parent().SpanID())

	// The dead-lettered delivery's span says why.
	for _, s := range rec.Ended() {
		if spanAttr(s, "messaging.message.id") == bad.MessageID.String() && s.SpanKind() == trace.SpanKindConsumer {
			require.Equal(t, codes.Error, s.Status().Code)
			require.Equal(t, telemetry.ReasonInvalidPayload.String(), spanAttr(s, telemetry.AttrReason))
			require.Equal(t, telemetry.OutcomeDeadLetter.String(), spanAttr(s, telemetry.AttrOutcome))
		}
	}
}

// TestTelemetryOutboxBacklogFollowsBrokerOutage: while the participant's
// broker is unreachable, messages written to its outbox pile up and the
// backlog gauge (and the oldest row's age) rise, and the relay counts its
// failed publishes; once the broker is back the relay drains the outbox and
// the gauge falls to zero.
func TestTelemetryOutboxBacklogFollowsBrokerOutage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const event = "inventory.restocked"
	events := newSink(t, e.broker, transport.QueueSpec{Name: "audit", Events: []string{event}})
	amqpProxy := newProxy(t, amqpHost(t))
	b := amqptest.NewBroker(t, rabbitmq.Config{URL: "amqp://guest:guest@" + amqpProxy.Addr() + "/", Namespace: e.ns,
		ConnectionName: amqptest.ConnectionName(e.ns) + "-proxied"})
	meter := telemetrytest.NewMeter(t)
	cfg := e.config(b)
	cfg.MeterProvider = meter.Provider
	c, err := participant.NewClient(cfg)
	require.NoError(t, err)
	inventory(e, c)
	stop := e.start(c, b)

	schema := telemetry.AttrSchema.String(e.store.Schema())
	backlog := func(m telemetrytest.Snapshot) float64 {
		v, ok := m.Gauge(telemetry.MetricOutboxBacklog, schema)
		if !ok {
			return -1
		}
		return v
	}
	testkit.WaitFor(t, waitFor, "backlog gauge reported once the participant runs", func() bool { return backlog(meter.Collect(t)) == 0 })

	amqpProxy.Cut()
	const n = 5
	tx, err := e.store.Pool.Begin(context.Background())
	require.NoError(t, err)
	for i := range n {
		ev, err := participant.NewEvent(event, map[string]int{"n": i})
		require.NoError(t, err)
		require.NoError(t, c.Publish(context.Background(), tx, ev))
	}
	require.NoError(t, tx.Commit(context.Background()))
	c.Wake()

	var m telemetrytest.Snapshot
	testkit.WaitFor(t, waitFor, fmt.Sprintf("backlog of %d and failed publishes while the broker is unreachable", n), func() bool {
		m = meter.Collect(t)
		return backlog(m) == n && m.Sum(telemetry.MetricRelayPublishErrors, schema) > 0
	})
	age, ok := m.Gauge(telemetry.MetricOutboxOldestAge, schema)
	require.True(t, ok)
	require.Positive(t, age)
	require.Zero(t, m.Sum(telemetry.MetricRelayPublished, schema))
	require.Empty(t, events.all())

	amqpProxy.Restore()
	testkit.WaitFor(t, waitFor, "backlog drained once the broker is back", func() bool {
		m = meter.Collect(t)
		return backlog(m) == 0
	})
	age, _ = m.Gauge(telemetry.MetricOutboxOldestAge, schema)
	require.Zero(t, age)
	require.EqualValues(t, n, m.Sum(telemetry.MetricRelayPublished, schema))
	testkit.WaitFor(t, waitFor, fmt.Sprintf("%d events delivered", n), func() bool { return len(events.all()) == n })

	// Stopped, the participant no longer reports its gauges.
	require.NoError(t, stop())
	_, ok = meter.Collect(t).Gauge(telemetry.MetricOutboxBacklog, schema)
	require.False(t, ok, "gauges unregistered on stop")
}

// TestTelemetryNoPasswordInLogsOrErrors: connection URLs with a password,
// for Postgres and RabbitMQ, never show up in errors or logs: not when a
// constructor or Run fails to connect, and not while a running participant
// loses and regains both servers (handler transactions, relay claims, the
// relay's LISTEN connection and the broker's reconnects all fail and log).
func TestTelemetryNoPasswordInLogsOrErrors(t *testing.T) {
	t.Parallel()
	const secret = "s3cr3t-pw"
	logs := &testkit.Buffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	noSecret := func(err error) {
		t.Helper()
		require.Error(t, err)
		require.NotContains(t, err.Error(), secret)
	}

	// Unreachable servers.
	_, err := rabbitmq.New(ctx, rabbitmq.Config{URL: "amqp://u:" + secret + "@127.0.0.1:1/", Logger: logger})
	noSecret(err)
	require.Contains(t, err.Error(), "127.0.0.1:1", "the error says where")
	badPool, err := pgxpool.New(ctx, "postgres://u:"+secret+"@127.0.0.1:1/x")
	require.NoError(t, err)
	t.Cleanup(badPool.Close)
	e := newEnv(t)
	cfg := e.config(e.newBroker())
	cfg.Pool, cfg.Logger = badPool, logger
	c, err := participant.NewClient(cfg)
	require.NoError(t, err)
	inventory(e, c)
	// Run waits for the database, logging why, rather than failing.
	runCtx, stopRun := context.WithTimeout(ctx, 3*time.Second)
	require.NoError(t, c.Run(runCtx))
	stopRun()
	require.Contains(t, logs.String(), "127.0.0.1:1", "the wait's log says where")

	// A running participant whose servers go away and come back, reached
	// with passwords through proxies.
	pgProxy, pgURL := postgresWithPassword(t, secret)
	amqpProxy := newProxy(t, amqpHost(t))
	user := rabbitUser(t, secret)
	pool, err := pgxpool.New(ctx, pgURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b := amqptest.NewBroker(t, rabbitmq.Config{
		URL: "amqp://" + user + ":" + secret + "@" + amqpProxy.Addr() + "/", Namespace: e.ns, ConnectionName: amqptest.ConnectionName(e.ns) + "-pw",
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: 500 * time.Millisecond, Logger: logger,
	})
	cfg = e.config(b)
	cfg.Pool, cfg.Logger = pool, logger
	cfg.Relay.Listen = true
	cfg.Retry.MaximumInterval = 200 * time.Millisecond
	cfg.Retry.MaxAttempts = 100
	e.setStock("apple", 10)
	c, err = participant.NewClient(cfg)
	require.NoError(t, err)
	inventory(e, c)
	stop := e.start(c, b)
	first := reserve(uuid.New(), "apple", 1)
	e.publish(first)
	requireSuccess(t, e.replies.wait(t, first.MessageID))

	waitLog := func(what string) {
		t.Helper()
		testkit.WaitFor(t, waitFor, fmt.Sprintf("log %q", what), func() bool { return strings.Contains(logs.String(), what) })
	}
	pgProxy.Cut()
	during := reserve(uuid.New(), "apple", 1)
	e.publish(during)
	waitLog("cannot process message")
	waitLog("relay claim failed")
	waitLog("relay listener lost its connection")
	amqpProxy.Cut()
	waitLog("rabbitmq connection lost")
	waitLog("rabbitmq reconnect failed")
	pgProxy.Restore()
	amqpProxy.Restore()
	requireSuccess(t, e.replies.wait(t, during.MessageID))
	require.NoError(t, stop())

	out := logs.String()
	require.NotContains(t, out, secret)
	require.Contains(t, out, "***", "the broker's URL is logged redacted")
}

// amqpHost returns the host:port of the test broker.
func amqpHost(t *testing.T) string {
	t.Helper()
	u, err := url.Parse(amqptest.URL(t))
	require.NoError(t, err)
	return u.Host
}

// postgresWithPassword returns a proxy to the test database and a URL that
// reaches it through the proxy with password in it. The test server trusts
// local connections, so any password is accepted.
func postgresWithPassword(t *testing.T, password string) (*proxy, string) {
	t.Helper()
	cfg, err := pgx.ParseConfig(dbtest.URL())
	require.NoError(t, err)
	p := newProxy(t, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	u := url.URL{Scheme: "postgres", User: url.UserPassword(cfg.User, password), Host: p.Addr(), Path: "/" + cfg.Database}
	return p, u.String()
}

// rabbitUser creates a RabbitMQ user with password and full rights on the
// default vhost, deleted when the test ends, and returns its name.
func rabbitUser(t *testing.T, password string) string {
	t.Helper()
	name := "sagabox-" + amqptest.Namespace(t)
	ctl := func(args ...string) error {
		out, err := exec.Command("rabbitmqctl", append([]string{"-q"}, args...)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("rabbitmqctl %s: %w: %s", args[0], err, out)
		}
		return nil
	}
	require.NoError(t, ctl("add_user", name, password))
	t.Cleanup(func() { require.NoError(t, ctl("delete_user", name)) })
	require.NoError(t, ctl("set_permissions", "-p", "/", name, ".*", ".*", ".*"))
	return name
}

func traceParent(ctx context.Context) string {
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, c)
	return c.Get("traceparent")
}

func spanContextOf(traceparent string) trace.SpanContext {
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": traceparent})
	return trace.SpanContextFromContext(ctx)
}

func spanAttr(s sdktrace.ReadOnlySpan, key attribute.Key) string {
	for _, kv := range s.Attributes() {
		if kv.Key == key {
			return kv.Value.String()
		}
	}
	return ""
}
