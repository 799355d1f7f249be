package orchestrator_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sagabox/sagabox/internal/telemetry"
	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/internal/testkit/telemetrytest"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/participant"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store/driver"
)

// TestTelemetrySagaIsOneTraceAndMetricsCount runs three sagas through the
// orchestrator and two participants (inventory: reserve, release, ship;
// payment: charge, refund) sharing one tracer and one meter provider: one
// completes, one is compensated (charge declined), one fails (charge
// declined, then the release compensation keeps failing). Each saga is one
// trace whose spans chain across every outbox hop, and the metrics count
// exactly what happened.
func TestTelemetrySagaIsOneTraceAndMetricsCount(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	tp, rec := telemetrytest.NewTracer(t)
	meter := telemetrytest.NewMeter(t)
	e.participantMods = append(e.participantMods, func(c *participant.Config) {
		c.TracerProvider, c.MeterProvider = tp, meter.Provider
	})
	def := orderSaga(1, time.Minute, 1)
	cfg := e.orchConfig(def)
	cfg.TracerProvider, cfg.MeterProvider = tp, meter.Provider
	// The participants' queues exist before the first command is sent, so
	// that every message is published once (a failed publish and its retry
	// would be two send spans).
	for _, p := range []*participant.Client{e.inventory(true), e.payment(true)} {
		ctx, cancel := context.WithTimeout(context.Background(), amqptest.Timeout)
		require.NoError(t, e.broker.Declare(ctx, p.QueueSpec()))
		cancel()
		testkit.Run(t, p.Run)
	}
	c := e.runOrchestrator(cfg)

	completed := e.start(c, def, Order{ID: "ok", Qty: 1, Amount: 10, Address: "here"}, nil)
	compensated := e.start(c, def, Order{ID: "declined", Qty: 1, Amount: declinedAmount, Address: "here"}, nil)
	waitStatus(t, c, completed.ID, saga.StatusCompleted, 30*time.Second)
	waitStatus(t, c, compensated.ID, saga.StatusCompensated, 30*time.Second)
	e.failRelease.Store(true)
	failed := e.start(c, def, Order{ID: "stuck", Qty: 1, Amount: 2 * declinedAmount, Address: "here"}, nil)
	waitStatus(t, c, failed.ID, saga.StatusFailed, 30*time.Second)

	// Tracing: every span of a saga is in one trace; parents explicit.
	spans := waitTrace(t, rec, completed.ID, 13)
	start := spans.root(t, "start saga order")
	require.Equal(t, trace.SpanKindInternal, start.SpanKind())
	last := spans.requireHops(t, start,
		hop{"inventory.reserve", "participant"},
		hop{"payment.charge", "participant"},
		hop{"shipping.ship", "participant"},
	)
	require.Equal(t, string(saga.StatusCompleted), attr(last, telemetry.AttrStatus))

	spans = waitTrace(t, rec, compensated.ID, 13)
	start = spans.root(t, "start saga order")
	rejectedReply := spans.requireHops(t, start, hop{"inventory.reserve", "participant"}, hop{"payment.charge", "participant"})
	// The charge was rejected: a failure reply, whose processing sent the
	// reserve step's compensation (an event on that span) ...
	require.Equal(t, "process reply-failure payment.charge", rejectedReply.Name())
	chargeProcess := spans.byID(t, spans.byID(t, rejectedReply.Parent()).Parent())
	require.Equal(t, telemetry.OutcomeRejected.String(), attr(chargeProcess, telemetry.AttrOutcome))
	var compEvents []string
	for _, ev := range rejectedReply.Events() {
		if ev.Name == "compensation sent" {
			for _, kv := range ev.Attributes {
				if kv.Key == telemetry.AttrStep {
					compEvents = append(compEvents, kv.Value.AsString())
				}
			}
		}
	}
	require.Equal(t, []string{"reserve"}, compEvents)
	// ... which continues the same trace through the participant and back.
	sendComp := spans.child(t, rejectedReply, "send compensation inventory.release")
	require.Equal(t, trace.SpanKindProducer, sendComp.SpanKind())
	processComp := spans.child(t, sendComp, "process compensation inventory.release")
	require.Equal(t, "participant", attr(processComp, telemetry.AttrComponent))
	reply := spans.child(t, processComp, "send reply-success inventory.release")
	done := spans.child(t, reply, "process reply-success inventory.release")
	require.Equal(t, string(saga.StatusCompensated), attr(done, telemetry.AttrStatus))

	// Metrics.
	order := telemetry.AttrSagaType.String("order")
	orch := telemetry.AttrSchema.String(e.orch.Schema())
	inv := telemetry.AttrSchema.String(e.inv.Schema())
	pay := telemetry.AttrSchema.String(e.pay.Schema())
	var m telemetrytest.Snapshot
	testkit.WaitFor(t, 30*time.Second, "every outbox published", func() bool {
		m = meter.Collect(t)
		for _, schema := range []attribute.KeyValue{orch, inv, pay} {
			if v, ok := m.Gauge(telemetry.MetricOutboxBacklog, schema); !ok || v != 0 {
				return false
			}
		}
		return true
	})
	require.EqualValues(t, 3, m.Sum(telemetry.MetricSagasStarted, order))
	for _, status := range []saga.Status{saga.StatusCompleted, saga.StatusCompensated, saga.StatusFailed} {
		require.EqualValues(t, 1, m.Sum(telemetry.MetricSagasFinished, order, telemetry.AttrStatus.String(string(status))), "sagas %s", status)
	}
	require.EqualValues(t, 3, m.Count(telemetry.MetricSagaDuration, order))
	// Nine replies applied: 3 steps, reserve+charge+release twice.
	require.EqualValues(t, 9, m.Count(telemetry.MetricStepDuration, order))
	require.EqualValues(t, 9, m.Sum(telemetry.MetricMessagesHandled, orch,
		telemetry.AttrComponent.String("orchestrator"), telemetry.AttrOutcome.String(telemetry.OutcomeApplied.String())))
	require.EqualValues(t, 2, m.Sum(telemetry.MetricMessagesHandled, pay,
		telemetry.AttrComponent.String("participant"), telemetry.AttrOutcome.String(telemetry.OutcomeRejected.String())))
	require.EqualValues(t, 1, m.Sum(telemetry.MetricDeadLetters, inv,
		telemetry.AttrComponent.String("participant"), telemetry.AttrReason.String(telemetry.ReasonRetriesExhausted.String())))
	// Published by each relay: the orchestrator's 9 commands, the
	// inventory's 6 replies, the payment's 3.
	require.EqualValues(t, 9, m.Sum(telemetry.MetricRelayPublished, orch))
	require.EqualValues(t, 6, m.Sum(telemetry.MetricRelayPublished, inv))
	require.EqualValues(t, 3, m.Sum(telemetry.MetricRelayPublished, pay))
	require.Zero(t, m.Sum(telemetry.MetricRelayPublishErrors))
	require.NotZero(t, m.Count(telemetry.MetricRelayBatchSize, orch))
	overdue, ok := m.Gauge(telemetry.MetricSagasOverdue, orch)
	require.True(t, ok, "overdue gauge reported")
	require.Zero(t, overdue)
	age, ok := m.Gauge(telemetry.MetricOutboxOldestAge, orch)
	require.True(t, ok)
	require.Zero(t, age)
	open, ok := m.Gauge(telemetry.MetricSagasOpen, orch, order, telemetry.AttrStatus.String("failed"))
	require.True(t, ok, "open sagas gauge reported")
	require.EqualValues(t, 1, open, "the failed saga waits for an operator")
	open, _ = m.Gauge(telemetry.MetricSagasOpen, orch, order, telemetry.AttrStatus.String("running"))
	require.Zero(t, open)
	// The participants' handlers are timed, by outcome.
	require.NotZero(t, m.Count(telemetry.MetricHandlerDuration, inv, telemetry.AttrMessageType.String(Reserve.Name()),
		telemetry.AttrOutcome.String(telemetry.HandlerOK)))
	require.EqualValues(t, 2, m.Count(telemetry.MetricHandlerDuration, pay, telemetry.AttrOutcome.String(telemetry.HandlerRejected)))
	requireLowCardinality(t, m)
	require.Zero(t, e.errs.n.Load(), "errors logged: last %v", e.errs.last.Load())
}

// The counters alerts watch exist at zero from the start, so that an alert
// on their increase sees 0 rather than "no data"; the open-saga and
// pending-request gauges count from the database.
func TestTelemetryCountersStartAtZeroAndSagaGauges(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	meter := telemetrytest.NewMeter(t)
	def := orderSaga(1, time.Hour, 1)
	cfg := e.orchConfig(def)
	cfg.MeterProvider = meter.Provider
	c := e.runOrchestrator(cfg)
	order := telemetry.AttrSagaType.String("order")
	orch := telemetry.AttrSchema.String(e.orch.Schema())

	// Nothing happened yet: every counter is there, at zero.
	var m telemetrytest.Snapshot
	testkit.WaitFor(t, 30*time.Second, "the gauges reported", func() bool {
		m = meter.Collect(t)
		_, ok := m.Gauge(telemetry.MetricOperatorPending, orch)
		return ok
	})
	for _, name := range []string{
		telemetry.MetricDeadLetters, telemetry.MetricInboxDuplicates, telemetry.MetricRetries,
		telemetry.MetricRelayPublishErrors, telemetry.MetricRelayPublished, telemetry.MetricDeadlinesFired,
		telemetry.MetricSagasStarted, telemetry.MetricSagasFinished,
	} {
		require.True(t, m.Has(name), "%s exists before its first event", name)
		require.Zero(t, m.Sum(name), name)
	}
	require.True(t, m.Has(telemetry.MetricSagasFinished))
	require.Zero(t, m.Sum(telemetry.MetricSagasFinished, order, telemetry.AttrStatus.String("failed")))

	// One running saga (no participant answers), and a pending request for
	// a saga of a definition this orchestrator does not run (so it stays
	// pending).
	e.start(c, def, Order{ID: "o-1", Qty: 1, Amount: 10, Address: "here"}, nil)
	ctx := context.Background()
	other := driver.SagaRecord{ID: uuid.New(), Type: "other", Version: 1, Status: "running", Data: []byte(`{}`), Steps: []byte(`[]`), Phase: "action"}
	require.NoError(t, e.orch.InTx(ctx, func(tx pgx.Tx) error {
		_, err := e.orch.SagaStart(ctx, tx, &driver.SagaStart{Saga: other}, time.Now())
		return err
	}))
	_, err := e.orch.OperationRequest(ctx, driver.NewOperation{SagaID: other.ID, Action: "retry", Actor: "alice", Reason: "pending", Params: nil})
	require.NoError(t, err)
	testkit.WaitFor(t, 30*time.Second, "the running saga counted", func() bool {
		m = meter.Collect(t)
		v, _ := m.Gauge(telemetry.MetricSagasOpen, orch, order, telemetry.AttrStatus.String("running"))
		return v == 1
	})
	for _, status := range []string{"compensating", "failed"} {
		v, ok := m.Gauge(telemetry.MetricSagasOpen, orch, order, telemetry.AttrStatus.String(status))
		require.True(t, ok, "status %s reported at zero", status)
		require.Zero(t, v)
	}
	v, ok := m.Gauge(telemetry.MetricOperatorPending, orch)
	require.True(t, ok)
	require.EqualValues(t, 1, v)
}

// requireLowCardinality fails if a metric carries an id attribute.
func requireLowCardinality(t *testing.T, m telemetrytest.Snapshot) {
	t.Helper()
	for _, name := range m.Names() {
		for _, k := range m.Attributes(name) {
			require.NotContains(t, []attribute.Key{telemetry.AttrSagaID, "messaging.message.id", "messaging.message.conversation_id"}, k,
				"metric %s carries a high-cardinality attribute", name)
		}
	}
}

// spanSet is the ended spans of one trace.
type spanSet []sdktrace.ReadOnlySpan

// waitTrace waits until the trace of saga id (found by its start span) has
// n ended spans, and returns them.
func waitTrace(t *testing.T, rec *tracetest.SpanRecorder, id uuid.UUID, n int) spanSet {
	t.Helper()
	var out spanSet
	testkit.WaitFor(t, 30*time.Second, fmt.Sprintf("%d spans in the trace of saga %s", n, id), func() bool {
		ended := rec.Ended()
		var tid trace.TraceID
		for _, s := range ended {
			if strings.HasPrefix(s.Name(), "start saga ") && attr(s, telemetry.AttrSagaID) == id.String() {
				tid = s.SpanContext().TraceID()
			}
		}
		if !tid.IsValid() {
			return false
		}
		out = out[:0]
		for _, s := range ended {
			if s.SpanContext().TraceID() == tid {
				out = append(out, s)
			}
		}
		return len(out) >= n
	})
	require.Len(t, out, n, "spans: %v", out.names())
	return out
}

func (s spanSet) names() []string {
	var out []string
	for _, sp := range s {
		out = append(out, sp.Name())
	}
	return out
}

// root returns the one span named name, which must have no parent.
func (s spanSet) root(t *testing.T, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, sp := range s {
		if sp.Name() == name {
			found = append(found, sp)
		}
	}
	require.Len(t, found, 1, "spans named %q", name)
	require.False(t, found[0].Parent().IsValid(), "%q is the root", name)
	return found[0]
}

func (s spanSet) byID(t *testing.T, sc trace.SpanContext) sdktrace.ReadOnlySpan {
	t.Helper()
	for _, sp := range s {
		if sp.SpanContext().SpanID() == sc.SpanID() {
			return sp
		}
	}
	t.Fatalf("no span %s in the trace", sc.SpanID())
	return nil
}

// child returns the one child of parent named name.
func (s spanSet) child(t *testing.T, parent sdktrace.ReadOnlySpan, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, sp := range s {
		if sp.Parent().SpanID() == parent.SpanContext().SpanID() && sp.Name() == name {
			found = append(found, sp)
		}
	}
	require.Len(t, found, 1, "children of %q named %q; trace: %v", parent.Name(), name, s.names())
	return found[0]
}

// hop is one command round trip: sent by the orchestrator, processed by a
// participant, answered, the answer processed by the orchestrator.
type hop struct {
	typ, component string
}

// requireHops follows the hops from parent: send command (producer, child
// of parent) → process command (consumer, at the participant, inbox new) →
// send reply → process reply (consumer, at the orchestrator) → next hop's
// send command, and so on. It returns the last reply's process span. A
// hop's reply may be a success or a failure.
func (s spanSet) requireHops(t *testing.T, parent sdktrace.ReadOnlySpan, hops ...hop) sdktrace.ReadOnlySpan {
	t.Helper()
	for _, h := range hops {
		send := s.child(t, parent, "send command "+h.typ)
		require.Equal(t, trace.SpanKindProducer, send.SpanKind())
		require.Equal(t, "rabbitmq", attr(send, "messaging.system"))
		require.Equal(t, "send", attr(send, "messaging.operation.type"))
		process := s.child(t, send, "process command "+h.typ)
		require.Equal(t, trace.SpanKindConsumer, process.SpanKind())
		require.Equal(t, h.component, attr(process, telemetry.AttrComponent))
		require.Equal(t, telemetry.InboxNew.String(), attr(process, telemetry.AttrInbox))
		require.Equal(t, attr(send, "messaging.message.id"), attr(process, "messaging.message.id"))
		var reply sdktrace.ReadOnlySpan
		for _, kind := range []string{"reply-success", "reply-failure"} {
			for _, sp := range s {
				if sp.Parent().SpanID() == process.SpanContext().SpanID() && sp.Name() == "send "+kind+" "+h.typ {
					require.Nil(t, reply, "one reply to %s", h.typ)
					reply = sp
				}
			}
		}
		require.NotNil(t, reply, "reply to %s sent in the participant's span; trace: %v", h.typ, s.names())
		require.Equal(t, trace.SpanKindProducer, reply.SpanKind())
		parent = s.child(t, reply, strings.Replace(reply.Name(), "send ", "process ", 1))
		require.Equal(t, "orchestrator", attr(parent, telemetry.AttrComponent))
		require.Equal(t, telemetry.InboxNew.String(), attr(parent, telemetry.AttrInbox))
	}
	return parent
}

// attr returns the string form of span attribute key, "" when absent.
func attr(s sdktrace.ReadOnlySpan, key attribute.Key) string {
	for _, kv := range s.Attributes() {
		if kv.Key == key {
			return kv.Value.String()
		}
	}
	return ""
}

// TestTelemetryNoPasswordInLogsOrErrors gives the orchestrator a pool whose
// URL holds a password and points at a closed port: Run, Start and the
// operator actions fail, and neither their errors nor the logs contain the
// password.
func TestTelemetryNoPasswordInLogsOrErrors(t *testing.T) {
	t.Parallel()
	const secret = "s3cr3t-pw"
	logs := &testkit.Buffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	pool, err := pgxpool.New(context.Background(), "postgres://u:"+secret+"@127.0.0.1:1/x?connect_timeout=5")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	def := orderSaga(1, time.Minute, 1)
	c, err := orchestrator.NewClient(orchestrator.Config{
		Pool: pool, Service: "orders", Broker: amqptest.NewBroker(t, amqptest.Config(t)), Definitions: []saga.Runner{def}, Logger: logger,
	})
	require.NoError(t, err)

	// Run waits for the database (logging why) rather than failing: it
	// returns nil once stopped.
	runCtx, stopRun := context.WithTimeout(context.Background(), 3*time.Second)
	defer stopRun()
	require.NoError(t, c.Run(runCtx))
	require.Contains(t, logs.String(), "127.0.0.1", "the wait's log says where it failed")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs []error
	_, err = c.Retry(ctx, uuid.New(), "ops", "retry")
	errs = append(errs, err)
	_, err = c.Abort(ctx, uuid.New(), "ops", "abort")
	errs = append(errs, err)
	_, err = c.Get(ctx, uuid.New())
	errs = append(errs, err)
	_, err = c.List(ctx, nil)
	errs = append(errs, err)
	_, err = c.Sweep(ctx)
	errs = append(errs, err)
	for i, err := range errs {
		require.Error(t, err, "call %d", i)
		require.NotContains(t, err.Error(), secret)
		require.Contains(t, err.Error(), "127.0.0.1", "the error still says where it failed")
	}
	require.NotContains(t, logs.String(), secret)
}

// A deadline fired by the sweeper belongs to the saga's trace: its span is a
// child of the span that started the saga, so the re-sent command and the
// compensations it sends stay in one trace too.
func TestTelemetryDeadlineJoinsTheSagaTrace(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	tp, rec := telemetrytest.NewTracer(t)
	def := orderSaga(1, 10*time.Second, 1)
	e.blackhole(Reserve.Name(), Release.Name())
	clock := newFakeClock()
	cfg := e.orchConfig(def)
	cfg.Clock, cfg.TracerProvider = clock.Now, tp
	c := e.runOrchestrator(cfg)

	st := e.start(c, def, Order{ID: "slow", Qty: 1, Amount: 10, Address: "here"}, nil)
	testkit.WaitFor(t, 30*time.Second, "reserve sent", func() bool {
		s, err := c.Get(context.Background(), st.ID)
		require.NoError(t, err)
		return s.Steps[0].Status == saga.StepRunning
	})
	clock.Advance(11 * time.Second) // reserve times out: compensate it
	testkit.WaitFor(t, 30*time.Second, "the reserve step's own compensation", func() bool {
		s, err := c.Get(context.Background(), st.ID)
		require.NoError(t, err)
		return s.Status == saga.StatusCompensating
	})

	var start, deadline sdktrace.ReadOnlySpan
	testkit.WaitFor(t, 30*time.Second, "the deadline span", func() bool {
		for _, s := range rec.Ended() {
			switch s.Name() {
			case "start saga order":
				start = s
			case "saga deadline order":
				deadline = s
			}
		}
		return start != nil && deadline != nil
	})
	require.Equal(t, start.SpanContext().TraceID(), deadline.SpanContext().TraceID(), "one trace per saga")
	require.Equal(t, start.SpanContext().SpanID(), deadline.Parent().SpanID())
	sends := 0
	testkit.WaitFor(t, 30*time.Second, "the compensation's send span", func() bool {
		sends = 0
		for _, s := range rec.Ended() {
			if s.Name() == "send compensation inventory.release" && s.Parent().SpanID() == deadline.SpanContext().SpanID() {
				sends++
			}
		}
		return sends == 1
	})
}

// An outside event sent without a trace of its own (a webhook handler
// that traces nothing) continues the saga's trace: the command it moves
// the saga to is sent in it.
func TestTelemetryOutsideEventJoinsTheSagaTrace(t *testing.T) {
	t.Parallel()
	e := newEventEnv(t)
	tp, rec := telemetrytest.NewTracer(t)
	def := paidOrderSaga(time.Hour)
	testkit.Run(t, e.inventory(true).Run)
	cfg := e.orchConfig(def)
	cfg.TracerProvider = tp
	c := e.runOrchestrator(cfg)
	st := e.start(c, def, Order{ID: "traced", Qty: 1, Address: "here"}, nil)
	testkit.WaitFor(t, 30*time.Second, "the saga to wait for the payment", func() bool {
		s, err := c.Get(context.Background(), st.ID)
		require.NoError(t, err)
		return s.Steps[1].Status == saga.StepWaitingEvent
	})
	e.send(c, orchestrator.SagaRef{ID: st.ID}, "evt-1", "pay-1", false)

	var start, event sdktrace.ReadOnlySpan
	testkit.WaitFor(t, 30*time.Second, "the event's span", func() bool {
		for _, s := range rec.Ended() {
			switch s.Name() {
			case "start saga paid-order":
				start = s
			case "saga event paid-order":
				event = s
			}
		}
		return start != nil && event != nil
	})
	require.Equal(t, start.SpanContext().TraceID(), event.SpanContext().TraceID(), "one trace per saga")
	testkit.WaitFor(t, 30*time.Second, "the ship command's send span in the saga's trace", func() bool {
		for _, s := range rec.Ended() {
			if s.Name() == "send command shipping.ship" {
				return s.SpanContext().TraceID() == start.SpanContext().TraceID()
			}
		}
		return false
	})
}
