package telemetry_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/sagabox/sagabox/internal/telemetry"
	"github.com/sagabox/sagabox/internal/testkit/telemetrytest"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/transport"
)

func TestMain(m *testing.M) { testkit.WrapTestMain(m) }

func command() message.Message {
	return message.Message{Envelope: message.Envelope{
		MessageID: uuid.New(), Type: "inventory.reserve", Kind: message.KindCommand, RoutingKey: "inventory.reserve",
		SagaID: uuid.New(), SagaType: "order", Step: "reserve", Attempt: 1, ReplyTo: "orders",
	}}
}

// TestTraceContextCrossesTheOutbox: the writer's span context stored in a
// message becomes the parent of the producer span, which the message then
// carries to become the parent of the consumer span.
func TestTraceContextCrossesTheOutbox(t *testing.T) {
	t.Parallel()
	tp, rec := telemetrytest.NewTracer(t)
	tel, err := telemetry.New(tp, telemetrytest.NewMeter(t).Provider)
	require.NoError(t, err)

	ctx, writer := tp.Tracer("test").Start(context.Background(), "writer")
	m := command()
	m.TraceParent, m.TraceState = telemetry.Inject(ctx)
	writer.End()
	require.NotEmpty(t, m.TraceParent)

	// The relay runs in a context of its own.
	send := tel.StartPublish(context.Background(), &m)
	telemetry.EndPublish(send, nil)
	require.Equal(t, writer.SpanContext().SpanID(), spanParent(t, rec.Ended(), send.SpanContext()).SpanID())
	require.Equal(t, writer.SpanContext().TraceID(), send.SpanContext().TraceID())

	ctx, process := tel.StartProcess(context.Background(), &m.Envelope, "participant")
	process.End()
	require.Equal(t, send.SpanContext().SpanID(), spanParent(t, rec.Ended(), process.SpanContext()).SpanID())
	require.Equal(t, process.SpanContext(), trace.SpanContextFromContext(ctx))

	var names []string
	for _, s := range rec.Ended() {
		names = append(names, s.Name())
	}
	require.Equal(t, []string{"writer", "send command inventory.reserve", "process command inventory.reserve"}, names)
	require.Equal(t, trace.SpanKindProducer, rec.Ended()[1].SpanKind())
	require.Equal(t, trace.SpanKindConsumer, rec.Ended()[2].SpanKind())
}

func spanParent(t *testing.T, spans []sdktrace.ReadOnlySpan, sc trace.SpanContext) trace.SpanContext {
	t.Helper()
	for _, s := range spans {
		if s.SpanContext().SpanID() == sc.SpanID() {
			return s.Parent()
		}
	}
	t.Fatalf("span %s not ended", sc.SpanID())
	return trace.SpanContext{}
}

// TestPublishWithoutTracingKeepsTheWritersContext: with a no-op tracer the
// message keeps the trace context it was written with.
func TestPublishWithoutTracingKeepsTheWritersContext(t *testing.T) {
	t.Parallel()
	tel, err := telemetry.New(noop.NewTracerProvider(), nil)
	require.NoError(t, err)
	m := command()
	m.TraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	telemetry.EndPublish(tel.StartPublish(context.Background(), &m), errors.New("down"))
	require.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", m.TraceParent)
}

// fakePublisher confirms every message but those it is told to fail.
type fakePublisher struct{ fail map[int]bool }

func (p fakePublisher) Publish(_ context.Context, msgs ...message.Message) error {
	failed := map[int]error{}
	for i := range msgs {
		if p.fail[i] {
			failed[i] = errors.New("nacked")
		}
	}
	if len(failed) == 0 {
		return nil
	}
	return &transport.PublishError{Failed: failed}
}

// TestPublisherCounts: the publisher decorator counts confirmed messages as
// published and the others as errors, and records each batch's size and
// time.
func TestPublisherCounts(t *testing.T) {
	t.Parallel()
	meter := telemetrytest.NewMeter(t)
	tel, err := telemetry.New(nil, meter.Provider)
	require.NoError(t, err)
	msgs := []message.Message{command(), command(), command()}
	err = tel.Publisher("svc", fakePublisher{fail: map[int]bool{1: true}}).Publish(context.Background(), msgs...)
	require.Error(t, err)
	require.NoError(t, tel.Publisher("svc", fakePublisher{}).Publish(context.Background(), msgs[:1]...))

	m := meter.Collect(t)
	schema := telemetry.AttrSchema.String("svc")
	require.EqualValues(t, 3, m.Sum(telemetry.MetricRelayPublished, schema))
	require.EqualValues(t, 1, m.Sum(telemetry.MetricRelayPublishErrors, schema))
	require.EqualValues(t, 2, m.Count(telemetry.MetricRelayBatchSize, schema))
	require.EqualValues(t, 2, m.Count(telemetry.MetricRelayPublishDuration, schema))
	require.Equal(t, "s", m.Unit(telemetry.MetricRelayPublishDuration))
}
