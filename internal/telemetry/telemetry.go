// Package telemetry holds sagabox's OpenTelemetry instruments and the W3C
// trace-context plumbing that makes one saga one trace across services. The
// library uses only the OTel API; providers come from configuration and
// default to the global ones.
package telemetry

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/transport"
)

// InstrumentationName names sagabox's tracer and meter.
const InstrumentationName = "github.com/sagabox/sagabox"

// Attribute keys used on spans and metrics. High-cardinality ids go on spans
// only.
const (
	AttrSchema      = attribute.Key("sagabox.schema")
	AttrSagaType    = attribute.Key("sagabox.saga_type")
	AttrSagaID      = attribute.Key("sagabox.saga_id")
	AttrStep        = attribute.Key("sagabox.step")
	AttrStatus      = attribute.Key("sagabox.status")
	AttrKind        = attribute.Key("sagabox.message.kind")
	AttrInbox       = attribute.Key("sagabox.inbox.outcome")
	AttrReason      = attribute.Key("sagabox.dead_letter.reason")
	AttrMessageType = attribute.Key("sagabox.message.type")
	AttrPhase       = attribute.Key("sagabox.phase")
	AttrComponent   = attribute.Key("sagabox.component")
)

// Telemetry is the set of instruments one client uses.
type Telemetry struct {
	tracer trace.Tracer
	meter  metric.Meter

	published     metric.Int64Counter
	publishErrors metric.Int64Counter
	batchSize     metric.Int64Histogram
	duplicates    metric.Int64Counter
	deadLetters   metric.Int64Counter
	handled       metric.Int64Counter
	sagasStarted  metric.Int64Counter
	sagasFinished metric.Int64Counter
	stepLatency   metric.Float64Histogram
	sagaDuration  metric.Float64Histogram
	deadlines     metric.Int64Counter
	retries       metric.Int64Counter
}

// New returns instruments from tp and mp; nil providers mean the global ones.
func New(tp trace.TracerProvider, mp metric.MeterProvider) (*Telemetry, error) {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	t := &Telemetry{tracer: tp.Tracer(InstrumentationName), meter: mp.Meter(InstrumentationName)}
	var err error
	c := func(name, unit, desc string) metric.Int64Counter {
		if err != nil {
			return nil
		}
		var ctr metric.Int64Counter
		ctr, err = t.meter.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		return ctr
	}
	t.published = c("sagabox.relay.published", "{message}", "Messages published by the relay and confirmed by the broker.")
	t.publishErrors = c("sagabox.relay.publish_errors", "{message}", "Messages the relay could not publish (they are retried).")
	t.duplicates = c("sagabox.inbox.duplicates", "{message}", "Deliveries recognised as duplicates by the inbox and not applied again.")
	t.deadLetters = c("sagabox.dead_letters", "{message}", "Messages moved to a dead-letter queue, by reason.")
	t.handled = c("sagabox.inbox.handled", "{message}", "Deliveries handled, by inbox outcome.")
	t.sagasStarted = c("sagabox.sagas.started", "{saga}", "Sagas started.")
	t.sagasFinished = c("sagabox.sagas.finished", "{saga}", "Sagas that reached a terminal status (completed, compensated, failed).")
	t.deadlines = c("sagabox.sweeper.deadlines_fired", "{deadline}", "Step deadlines fired by the sweeper.")
	t.retries = c("sagabox.retries", "{attempt}", "Retries: commands re-sent after a timeout and handler attempts retried.")
	if err != nil {
		return nil, fmt.Errorf("telemetry: create counters: %w", err)
	}
	if t.batchSize, err = t.meter.Int64Histogram("sagabox.relay.batch_size", metric.WithUnit("{message}"),
		metric.WithDescription("Messages per relay batch."),
		metric.WithExplicitBucketBoundaries(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)); err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	secs := []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}
	if t.stepLatency, err = t.meter.Float64Histogram("sagabox.saga.step.duration", metric.WithUnit("s"),
		metric.WithDescription("Time from sending a step's command to applying its reply."),
		metric.WithExplicitBucketBoundaries(secs...)); err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	if t.sagaDuration, err = t.meter.Float64Histogram("sagabox.saga.duration", metric.WithUnit("s"),
		metric.WithDescription("Time from a saga's start to its terminal status."),
		metric.WithExplicitBucketBoundaries(secs...)); err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	return t, nil
}

// Tracer returns sagabox's tracer.
func (t *Telemetry) Tracer() trace.Tracer { return t.tracer }

// RegisterOutboxGauges reports the outbox backlog and the age of its oldest
// unpublished row for st at every collection. Unregister the returned
// registration when the client stops.
func (t *Telemetry) RegisterOutboxGauges(st *store.Store) (metric.Registration, error) {
	backlog, err := t.meter.Int64ObservableGauge("sagabox.outbox.backlog", metric.WithUnit("{message}"),
		metric.WithDescription("Unpublished outbox rows."))
	if err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	age, err := t.meter.Float64ObservableGauge("sagabox.outbox.oldest_age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest unpublished outbox row; 0 when none."))
	if err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	attrs := metric.WithAttributes(AttrSchema.String(st.Schema()))
	return t.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		stats, err := st.OutboxStats(ctx)
		if err != nil {
			return err
		}
		o.ObserveInt64(backlog, stats.Backlog, attrs)
		o.ObserveFloat64(age, stats.OldestAge.Seconds(), attrs)
		return nil
	}, backlog, age)
}

// Duplicate counts a delivery the inbox recognised as a duplicate.
func (t *Telemetry) Duplicate(ctx context.Context, schema, msgType string) {
	t.duplicates.Add(ctx, 1, metric.WithAttributes(AttrSchema.String(schema), AttrMessageType.String(msgType)))
}

// Handled counts a handled delivery by inbox outcome (new, duplicate,
// rejected, retry, dead-letter).
func (t *Telemetry) Handled(ctx context.Context, schema, msgType, outcome string) {
	t.handled.Add(ctx, 1, metric.WithAttributes(AttrSchema.String(schema), AttrMessageType.String(msgType), AttrInbox.String(outcome)))
}

// DeadLetter counts a dead-lettered message. reason must be a short, fixed
// class ("unknown_type", "undecodable", "oversized", "retries_exhausted"), not
// free text.
func (t *Telemetry) DeadLetter(ctx context.Context, schema, reason string) {
	t.deadLetters.Add(ctx, 1, metric.WithAttributes(AttrSchema.String(schema), AttrReason.String(reason)))
}

// SagaStarted counts a started saga.
func (t *Telemetry) SagaStarted(ctx context.Context, sagaType string) {
	t.sagasStarted.Add(ctx, 1, metric.WithAttributes(AttrSagaType.String(sagaType)))
}

// SagaFinished counts a saga that reached status and records its duration.
func (t *Telemetry) SagaFinished(ctx context.Context, sagaType, status string, d time.Duration) {
	attrs := metric.WithAttributes(AttrSagaType.String(sagaType), AttrStatus.String(status))
	t.sagasFinished.Add(ctx, 1, attrs)
	t.sagaDuration.Record(ctx, d.Seconds(), attrs)
}

// StepDone records the latency of one step phase.
func (t *Telemetry) StepDone(ctx context.Context, sagaType, step, phase string, d time.Duration) {
	t.stepLatency.Record(ctx, d.Seconds(), metric.WithAttributes(AttrSagaType.String(sagaType), AttrStep.String(step), AttrPhase.String(phase)))
}

// DeadlineFired counts a deadline fired by the sweeper.
func (t *Telemetry) DeadlineFired(ctx context.Context, sagaType string) {
	t.deadlines.Add(ctx, 1, metric.WithAttributes(AttrSagaType.String(sagaType)))
}

// Retry counts a retry by component ("orchestrator" re-sending a command,
// "participant" retrying a handler).
func (t *Telemetry) Retry(ctx context.Context, component, msgType string) {
	t.retries.Add(ctx, 1, metric.WithAttributes(AttrComponent.String(component), AttrMessageType.String(msgType)))
}

// propagator is W3C Trace Context: the envelope's traceparent/tracestate.
var propagator = propagation.TraceContext{}

// Inject returns the W3C trace context of ctx's span, to store in an outbox
// row. Both are empty when ctx carries no valid span.
func Inject(ctx context.Context) (traceparent, tracestate string) {
	carrier := propagation.MapCarrier{}
	propagator.Inject(ctx, carrier)
	return carrier.Get("traceparent"), carrier.Get("tracestate")
}

// Extract returns ctx with the remote span context carried by env.
func Extract(ctx context.Context, env *transport.Envelope) context.Context {
	if env.TraceParent == "" {
		return ctx
	}
	return propagator.Extract(ctx, propagation.MapCarrier{"traceparent": env.TraceParent, "tracestate": env.TraceState})
}

// MessageAttributes are the messaging semantic-convention attributes of m.
func MessageAttributes(env *transport.Envelope, operation string) []attribute.KeyValue {
	attrs := []attribute.KeyValue{
		attribute.String("messaging.system", "rabbitmq"),
		attribute.String("messaging.operation.type", operation),
		attribute.String("messaging.destination.name", env.Kind.Exchange()),
		attribute.String("messaging.rabbitmq.destination.routing_key", env.RoutingKey),
		attribute.String("messaging.message.id", env.MessageID.String()),
		AttrMessageType.String(env.Type),
		AttrKind.String(string(env.Kind)),
	}
	if env.CorrelationID != "" {
		attrs = append(attrs, attribute.String("messaging.message.conversation_id", env.CorrelationID))
	}
	if env.SagaType != "" {
		attrs = append(attrs, AttrSagaType.String(env.SagaType), AttrSagaID.String(env.SagaID.String()), AttrStep.String(env.Step))
	}
	return attrs
}

// StartPublish starts a producer span for m as a child of the span that wrote
// it, and rewrites m's trace context to the new span so that the consumer's
// span becomes its child.
func (t *Telemetry) StartPublish(ctx context.Context, m *transport.Message) trace.Span {
	ctx = Extract(ctx, &m.Envelope)
	ctx, span := t.tracer.Start(ctx, "send "+m.Type, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(MessageAttributes(&m.Envelope, "send")...))
	if span.SpanContext().IsValid() {
		m.TraceParent, m.TraceState = Inject(ctx)
	}
	return span
}

// EndPublish ends a producer span with the publish outcome.
func EndPublish(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// StartProcess starts a consumer span for a delivery, as a child of the
// producer span that sent it.
func (t *Telemetry) StartProcess(ctx context.Context, env *transport.Envelope, component string) (context.Context, trace.Span) {
	ctx = Extract(ctx, env)
	return t.tracer.Start(ctx, "process "+env.Type, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(append(MessageAttributes(env, "process"), AttrComponent.String(component))...))
}

// RelayObserver returns a relay observer that counts published messages,
// errors and batch sizes for schema.
func (t *Telemetry) RelayObserver(schema string) *RelayObserver {
	return &RelayObserver{t: t, attrs: metric.WithAttributes(AttrSchema.String(schema))}
}

// RelayObserver records relay batches.
type RelayObserver struct {
	t     *Telemetry
	attrs metric.MeasurementOption
}

// Published implements relay.Observer.
func (o *RelayObserver) Published(ctx context.Context, msgs []transport.Message, confirmed []bool, _ error, _ time.Duration) {
	ok := 0
	for _, c := range confirmed {
		if c {
			ok++
		}
	}
	o.t.batchSize.Record(ctx, int64(len(msgs)), o.attrs)
	o.t.published.Add(ctx, int64(ok), o.attrs)
	if failed := len(msgs) - ok; failed > 0 {
		o.t.publishErrors.Add(ctx, int64(failed), o.attrs)
	}
}
