// Package telemetry holds sagabox's OpenTelemetry instruments and the W3C
// trace-context plumbing that makes one saga one trace across services. The
// library uses only the OTel API; providers come from configuration and
// default to the global ones.
//
// Cardinality: metric attributes are bounded sets (schema, saga type, step,
// message type, status, outcome, reason class). Saga and message ids go on
// spans only.
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

	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store/driver"
	"github.com/sagabox/sagabox/transport"
)

// InstrumentationName names sagabox's tracer and meter.
const InstrumentationName = "github.com/sagabox/sagabox"

// Attribute keys used on spans and metrics. High-cardinality ids (saga id,
// message id) go on spans only.
const (
	AttrSchema      = attribute.Key("sagabox.schema")
	AttrSlot        = attribute.Key("sagabox.slot")
	AttrSagaType    = attribute.Key("sagabox.saga_type")
	AttrSagaID      = attribute.Key("sagabox.saga_id")
	AttrSagaVersion = attribute.Key("sagabox.saga_version")
	AttrStep        = attribute.Key("sagabox.step")
	AttrStatus      = attribute.Key("sagabox.status")
	AttrKind        = attribute.Key("sagabox.message.kind")
	AttrMessageType = attribute.Key("sagabox.message.type")
	AttrAttempt     = attribute.Key("sagabox.attempt")
	AttrInbox       = attribute.Key("sagabox.inbox.outcome")
	AttrOutcome     = attribute.Key("sagabox.outcome")
	AttrReason      = attribute.Key("sagabox.dead_letter.reason")
	AttrPhase       = attribute.Key("sagabox.phase")
	AttrComponent   = attribute.Key("sagabox.component")
	AttrCause       = attribute.Key("sagabox.retry.cause")
	AttrActor       = attribute.Key("sagabox.actor")
	// AttrBatchCount is the OpenTelemetry messaging convention's size of
	// the batch a delivery was applied in, on deliveries applied in a
	// batch (group commit).
	AttrBatchCount = attribute.Key("messaging.batch.message_count")
)

// InboxOutcome is whether the inbox saw a message for the first time; its
// label is the value of AttrInbox on consumer spans.
type InboxOutcome uint8

// Inbox outcomes.
const (
	InboxNew InboxOutcome = iota + 1
	InboxDuplicate
)

// String returns the outcome's label.
func (o InboxOutcome) String() string { return label(o, "new", "duplicate") }

// Outcome is what handling a delivery did; its label is the value of
// AttrOutcome on sagabox.messages.handled. The engine and the clients
// branch on Outcome values, never on labels.
type Outcome uint8

// Handling outcomes.
const (
	OutcomeApplied     Outcome = iota + 1 // new message, handled
	OutcomeRejected                       // new command, rejected by its handler (business "no")
	OutcomeDuplicate                      // already in the inbox, not applied again
	OutcomeRetry                          // not applied this time, will be delivered again
	OutcomeDeadLetter                     // moved to the dead-letter queue
	OutcomeIgnored                        // orchestrator: stale reply, recorded in history only
	OutcomeUnknownSaga                    // orchestrator: reply for a saga that does not exist here
)

// String returns the outcome's label.
func (o Outcome) String() string {
	return label(o, "applied", "rejected", "duplicate", "retry", "dead_letter", "ignored", "unknown_saga")
}

// Reason is the class of why a message was dead-lettered; its label is the
// value of AttrReason. Free text goes to logs and to the dead-lettered
// message, never to a metric.
type Reason uint8

// Dead-letter reason classes.
const (
	ReasonUnknownType Reason = iota + 1
	ReasonInvalidPayload
	ReasonPayloadTooLarge
	ReasonUnexpectedKind
	ReasonRetriesExhausted
	ReasonUnknownDefinition
	ReasonInvalidInstance
	// ReasonUnroutable: an outbox row (a reply, an event) no queue takes,
	// given up on by the relay (sagabox.outbox.dead).
	ReasonUnroutable
)

// String returns the reason's label.
func (r Reason) String() string {
	return label(r, "unknown_type", "invalid_payload", "payload_too_large", "unexpected_kind",
		"retries_exhausted", "unknown_definition", "invalid_instance", "unroutable")
}

// Cause is why a delivery is retried; its label is the value of AttrCause.
type Cause uint8

// Retry causes.
const (
	CauseHandler  Cause = iota + 1 // the handler failed transiently
	CauseDatabase                  // Postgres was unreachable
	CauseTimeout                   // the orchestrator re-sent a command after its step timed out
	CauseOperator                  // an operator asked for a retry
	CauseShutdown                  // the client stopped before the delivery was done
)

// String returns the cause's label.
func (c Cause) String() string {
	return label(c, "handler", "database", "timeout", "operator", "shutdown")
}

// label returns the label of v, the n-th (from 1) of labels; "" for the
// zero value and values out of range.
func label[T ~uint8](v T, labels ...string) string {
	if v == 0 || int(v) > len(labels) {
		return ""
	}
	return labels[v-1]
}

// Telemetry is the set of instruments one client uses.
type Telemetry struct {
	tracer trace.Tracer
	meter  metric.Meter

	published       metric.Int64Counter
	publishErrors   metric.Int64Counter
	batchSize       metric.Int64Histogram
	publishDuration metric.Float64Histogram
	duplicates      metric.Int64Counter
	deadLetters     metric.Int64Counter
	handled         metric.Int64Counter
	sagasStarted    metric.Int64Counter
	sagasFinished   metric.Int64Counter
	stepLatency     metric.Float64Histogram
	sagaDuration    metric.Float64Histogram
	admissionWait   metric.Float64Histogram
	deadlines       metric.Int64Counter
	retries         metric.Int64Counter

	handlerDuration metric.Float64Histogram

	backlog   metric.Int64ObservableGauge
	oldestAge metric.Float64ObservableGauge
	dead      metric.Int64ObservableGauge
	overdue   metric.Int64ObservableGauge
	held      metric.Int64ObservableGauge
	routes    metric.Int64ObservableGauge
	queued    metric.Int64ObservableGauge
	queueAge  metric.Float64ObservableGauge
	open      metric.Int64ObservableGauge
	requests  metric.Int64ObservableGauge
	slotLag   metric.Int64ObservableGauge
	slotUp    metric.Int64ObservableGauge
}

// Metric names, documented in docs/operations.md.
const (
	MetricRelayPublished       = "sagabox.relay.published"
	MetricRelayPublishErrors   = "sagabox.relay.publish_errors"
	MetricRelayBatchSize       = "sagabox.relay.batch_size"
	MetricRelayPublishDuration = "sagabox.relay.publish.duration"
	MetricOutboxBacklog        = "sagabox.outbox.backlog"
	MetricOutboxOldestAge      = "sagabox.outbox.oldest_age"
	MetricOutboxDead           = "sagabox.outbox.dead"
	MetricRelaySlotLag         = "sagabox.relay.slot.lag"
	MetricRelaySlotActive      = "sagabox.relay.slot.active"
	MetricInboxDuplicates      = "sagabox.inbox.duplicates"
	MetricMessagesHandled      = "sagabox.messages.handled"
	MetricDeadLetters          = "sagabox.dead_letters"
	MetricRetries              = "sagabox.retries"
	MetricSagasStarted         = "sagabox.sagas.started"
	MetricSagasFinished        = "sagabox.sagas.finished"
	MetricSagasOverdue         = "sagabox.sagas.overdue"
	MetricSagasUnpublished     = "sagabox.sagas.unpublished_overdue"
	MetricCommandsUnroutable   = "sagabox.commands.unroutable"
	MetricStepDuration         = "sagabox.saga.step.duration"
	MetricSagaDuration         = "sagabox.saga.duration"
	MetricAdmissionWait        = "sagabox.saga.admission_wait"
	MetricSagasQueued          = "sagabox.sagas.queued"
	MetricQueuedOldestAge      = "sagabox.sagas.queued.oldest_age"
	MetricDeadlinesFired       = "sagabox.sweeper.deadlines_fired"
	MetricSagasOpen            = "sagabox.sagas.open"
	MetricOperatorPending      = "sagabox.operator_requests.pending"
	MetricHandlerDuration      = "sagabox.handler.duration"
)

// MetricNames lists every metric sagabox exports (its own and the RabbitMQ
// adapter's sagabox.dead_letters), for tools and tests that check
// dashboards and alert rules against them.
var MetricNames = []string{
	MetricRelayPublished, MetricRelayPublishErrors, MetricRelayBatchSize, MetricRelayPublishDuration,
	MetricOutboxBacklog, MetricOutboxOldestAge, MetricOutboxDead, MetricInboxDuplicates, MetricMessagesHandled,
	MetricDeadLetters, MetricRetries, MetricSagasStarted, MetricSagasFinished, MetricSagasOverdue,
	MetricStepDuration, MetricSagaDuration, MetricDeadlinesFired, MetricSagasOpen, MetricOperatorPending,
	MetricHandlerDuration, MetricAdmissionWait, MetricSagasQueued, MetricQueuedOldestAge,
	MetricRelaySlotLag, MetricRelaySlotActive, MetricSagasUnpublished, MetricCommandsUnroutable,
}

// Handler outcomes (AttrOutcome on sagabox.handler.duration).
const (
	HandlerOK       = "ok"       // the handler returned without error
	HandlerRejected = "rejected" // a command's handler rejected it (participant.Reject)
	HandlerError    = "error"    // the handler failed (or panicked); the delivery is retried
)

// OpenStatuses are the statuses of sagabox.sagas.open: sagas not finished.
var OpenStatuses = []string{"running", "compensating", "failed"}

// finishedStatuses are the terminal statuses of sagabox.sagas.finished.
var finishedStatuses = []string{"completed", "compensated", "failed", "terminated"}

// deadLetterReasons are the reason classes a client's engine counts.
var deadLetterReasons = []Reason{
	ReasonUnknownType, ReasonInvalidPayload, ReasonPayloadTooLarge, ReasonUnexpectedKind,
	ReasonRetriesExhausted, ReasonUnknownDefinition, ReasonInvalidInstance,
}

// retryCauses are the retry causes a client counts.
var retryCauses = []Cause{CauseHandler, CauseDatabase, CauseTimeout, CauseOperator, CauseShutdown}

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
	t.published = c(MetricRelayPublished, "{message}", "Messages published by the relay and confirmed by the broker.")
	t.publishErrors = c(MetricRelayPublishErrors, "{message}", "Messages the relay could not publish (they stay in the outbox and are retried).")
	t.duplicates = c(MetricInboxDuplicates, "{message}", "Deliveries recognised as duplicates by the inbox and not applied again.")
	t.deadLetters = c(MetricDeadLetters, "{message}", "Messages moved to a dead-letter queue, by reason class.")
	t.handled = c(MetricMessagesHandled, "{message}", "Deliveries handled, by outcome.")
	t.sagasStarted = c(MetricSagasStarted, "{saga}", "Sagas started.")
	t.sagasFinished = c(MetricSagasFinished, "{saga}", "Sagas that reached a terminal status (completed, compensated, failed).")
	t.deadlines = c(MetricDeadlinesFired, "{deadline}", "Step deadlines fired by the sweeper.")
	t.retries = c(MetricRetries, "{attempt}", "Retries: commands re-sent after a timeout or by an operator, and deliveries retried by a participant.")
	if err != nil {
		return nil, fmt.Errorf("telemetry: create counters: %w", err)
	}
	if t.batchSize, err = t.meter.Int64Histogram(MetricRelayBatchSize, metric.WithUnit("{message}"),
		metric.WithDescription("Messages per relay batch."),
		metric.WithExplicitBucketBoundaries(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)); err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	if t.publishDuration, err = t.meter.Float64Histogram(MetricRelayPublishDuration, metric.WithUnit("s"),
		metric.WithDescription("Time to publish one relay batch and receive the broker's confirms."),
		metric.WithExplicitBucketBoundaries(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20)); err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	secs := []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}
	if t.stepLatency, err = t.meter.Float64Histogram(MetricStepDuration, metric.WithUnit("s"),
		metric.WithDescription("Time from sending a step's command (or compensation) to applying its reply."),
		metric.WithExplicitBucketBoundaries(secs...)); err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	if t.sagaDuration, err = t.meter.Float64Histogram(MetricSagaDuration, metric.WithUnit("s"),
		metric.WithDescription("Time from a saga's start to its terminal status."),
		metric.WithExplicitBucketBoundaries(secs...)); err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	if t.admissionWait, err = t.meter.Float64Histogram(MetricAdmissionWait, metric.WithUnit("s"),
		metric.WithDescription("Time a saga waited for admission (flow control) before its first step ran; 0 for a saga started at once."),
		metric.WithExplicitBucketBoundaries(secs...)); err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	if t.queued, err = t.meter.Int64ObservableGauge(MetricSagasQueued, metric.WithUnit("{saga}"),
		metric.WithDescription("Sagas waiting for admission (flow control), by type.")); err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	if t.queueAge, err = t.meter.Float64ObservableGauge(MetricQueuedOldestAge, metric.WithUnit("s"),
		metric.WithDescription("How long the longest-waiting queued saga of a type has waited for admission.")); err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	if t.handlerDuration, err = t.meter.Float64Histogram(MetricHandlerDuration, metric.WithUnit("s"),
		metric.WithDescription("Time a participant's handler took for one delivery (in the delivery's transaction), by message type and outcome."),
		metric.WithExplicitBucketBoundaries(secs...)); err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	if t.open, err = t.meter.Int64ObservableGauge(MetricSagasOpen, metric.WithUnit("{saga}"),
		metric.WithDescription("Sagas not finished, by type and status: running, compensating, or failed (waiting for an operator).")); err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	if t.requests, err = t.meter.Int64ObservableGauge(MetricOperatorPending, metric.WithUnit("{request}"),
		metric.WithDescription("Operator requests (retry, abort) recorded by the CLI and not yet applied or withdrawn.")); err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	if t.backlog, err = t.meter.Int64ObservableGauge(MetricOutboxBacklog, metric.WithUnit("{message}"),
		metric.WithDescription("Unpublished outbox rows.")); err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	if t.oldestAge, err = t.meter.Float64ObservableGauge(MetricOutboxOldestAge, metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest unpublished outbox row; 0 when none.")); err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	if t.dead, err = t.meter.Int64ObservableGauge(MetricOutboxDead, metric.WithUnit("{message}"),
		metric.WithDescription("Outbox rows the relay gave up on (a reply or event no queue takes), by reason; kept until an operator retries or deletes them.")); err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	if t.overdue, err = t.meter.Int64ObservableGauge(MetricSagasOverdue, metric.WithUnit("{saga}"),
		metric.WithDescription("Running or compensating sagas whose deadline passed more than a grace period ago and that the sweeper would fire (it is not keeping up or not running); those held by an unpublished message are sagabox.sagas.unpublished_overdue.")); err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	if t.held, err = t.meter.Int64ObservableGauge(MetricSagasUnpublished, metric.WithUnit("{saga}"),
		metric.WithDescription("Running or compensating sagas, by type, that have waited more than a grace period for a command or compensation still unpublished, past their deadline or without one: no deadline fires while it is unpublished (a queue missing, the broker or the relay down).")); err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	if t.routes, err = t.meter.Int64ObservableGauge(MetricCommandsUnroutable, metric.WithUnit("{command}"),
		metric.WithDescription("1 for a command (or compensation) of a saga type that no queue takes, as last checked (at start, then until a queue takes it); 0 once one does.")); err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	if t.slotLag, err = t.meter.Int64ObservableGauge(MetricRelaySlotLag, metric.WithUnit("By"),
		metric.WithDescription("Write-ahead log the relay's replication slot (log mode) holds behind the server's position: what a forgotten or stuck slot keeps on disk.")); err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	if t.slotUp, err = t.meter.Int64ObservableGauge(MetricRelaySlotActive, metric.WithUnit("{reader}"),
		metric.WithDescription("1 when a relay reads the replication slot (log mode), 0 when none does.")); err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	return t, nil
}

// RegisterSlotGauges reports, at every collection, the lag in bytes of
// the replication slot of a relay in log mode and whether a reader holds
// it. Unregister the returned registration when the client stops.
func (t *Telemetry) RegisterSlotGauges(st driver.Executor, slot, publication string) (metric.Registration, error) {
	attrs := metric.WithAttributes(AttrSchema.String(st.Schema()), AttrSlot.String(slot))
	reg, err := t.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, gaugeTimeout)
		defer cancel()
		ls, err := st.OutboxLogStatus(ctx, slot, publication)
		if err != nil || !ls.SlotExists {
			return err
		}
		o.ObserveInt64(t.slotLag, ls.LagBytes, attrs)
		active := int64(0)
		if ls.Active {
			active = 1
		}
		o.ObserveInt64(t.slotUp, active, attrs)
		return nil
	}, t.slotLag, t.slotUp)
	if err != nil {
		return nil, fmt.Errorf("telemetry: register replication slot gauges: %w", err)
	}
	return reg, nil
}

// Tracer returns sagabox's tracer.
func (t *Telemetry) Tracer() trace.Tracer { return t.tracer }

// gaugeTimeout bounds the queries of one gauge collection.
const gaugeTimeout = 5 * time.Second

// RegisterOutboxGauges reports the outbox backlog and the age of its oldest
// unpublished row for st at every collection. Unregister the returned
// registration when the client stops.
func (t *Telemetry) RegisterOutboxGauges(st driver.Executor) (metric.Registration, error) {
	attrs := metric.WithAttributes(AttrSchema.String(st.Schema()))
	reg, err := t.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, gaugeTimeout)
		defer cancel()
		stats, err := st.OutboxStats(ctx)
		if err != nil {
			return err
		}
		o.ObserveInt64(t.backlog, stats.Backlog, attrs)
		o.ObserveFloat64(t.oldestAge, stats.OldestAge.Seconds(), attrs)
		o.ObserveInt64(t.dead, stats.Dead, metric.WithAttributes(AttrSchema.String(st.Schema()), AttrReason.String(ReasonUnroutable.String())))
		return nil
	}, t.backlog, t.oldestAge, t.dead)
	if err != nil {
		return nil, fmt.Errorf("telemetry: register outbox gauges: %w", err)
	}
	return reg, nil
}

// RegisterOverdueGauge reports, at every collection, how many running or
// compensating sagas of st have a deadline before now() - grace.
func (t *Telemetry) RegisterOverdueGauge(st driver.Executor, grace time.Duration, now func() time.Time) (metric.Registration, error) {
	attrs := metric.WithAttributes(AttrSchema.String(st.Schema()))
	reg, err := t.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, gaugeTimeout)
		defer cancel()
		n, err := st.SagaCountOverdue(ctx, now().Add(-grace))
		if err != nil {
			return err
		}
		o.ObserveInt64(t.overdue, n, attrs)
		return nil
	}, t.overdue)
	if err != nil {
		return nil, fmt.Errorf("telemetry: register overdue saga gauge: %w", err)
	}
	return reg, nil
}

// RegisterUnpublishedGauge reports, at every collection, for each of
// sagaTypes, how many running or compensating sagas of st have waited
// since before now() - grace for a command or compensation still
// unpublished, past their deadline or without one
// (sagabox.sagas.unpublished_overdue, zeros included).
func (t *Telemetry) RegisterUnpublishedGauge(st driver.Executor, sagaTypes []string, grace time.Duration, now func() time.Time) (metric.Registration, error) {
	schema := AttrSchema.String(st.Schema())
	reg, err := t.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, gaugeTimeout)
		defer cancel()
		counts, err := st.SagaCountUnpublishedOverdue(ctx, now().Add(-grace))
		if err != nil {
			return err
		}
		n := make(map[string]int64, len(counts))
		for _, c := range counts {
			n[c.Type] = c.Count
		}
		for _, typ := range sagaTypes {
			o.ObserveInt64(t.held, n[typ], metric.WithAttributes(schema, AttrSagaType.String(typ)))
		}
		return nil
	}, t.held)
	if err != nil {
		return nil, fmt.Errorf("telemetry: register unpublished saga gauge: %w", err)
	}
	return reg, nil
}

// Route is a command of a saga type and whether a queue takes it, as last
// checked.
type Route struct {
	SagaType string
	Command  string
	Routable bool
}

// RegisterRouteGauge reports, at every collection, each route routes
// returns (sagabox.commands.unroutable): 1 for a command no queue takes, 0
// for one a queue takes.
func (t *Telemetry) RegisterRouteGauge(schema string, routes func() []Route) (metric.Registration, error) {
	s := AttrSchema.String(schema)
	reg, err := t.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for _, r := range routes() {
			v := int64(1)
			if r.Routable {
				v = 0
			}
			o.ObserveInt64(t.routes, v, metric.WithAttributes(s, AttrSagaType.String(r.SagaType), AttrMessageType.String(r.Command)))
		}
		return nil
	}, t.routes)
	if err != nil {
		return nil, fmt.Errorf("telemetry: register route gauge: %w", err)
	}
	return reg, nil
}

// RegisterSagaGauges reports, at every collection, the sagas of st of the
// given types that are running, compensating or failed
// (sagabox.sagas.open, every type and status reported, zeros included), and
// the pending operator requests (sagabox.operator_requests.pending). Both
// come from counts over indexes: the open sagas' range of the (type,
// status) index and the pending requests' partial index.
func (t *Telemetry) RegisterSagaGauges(st driver.Executor, sagaTypes []string) (metric.Registration, error) {
	schema := AttrSchema.String(st.Schema())
	reg, err := t.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, gaugeTimeout)
		defer cancel()
		counts, err := st.SagaCountOpen(ctx, sagaTypes)
		if err != nil {
			return err
		}
		n := map[[2]string]int64{}
		for _, c := range counts {
			n[[2]string{c.Type, c.Status}] = c.Count
		}
		for _, typ := range sagaTypes {
			for _, status := range OpenStatuses {
				o.ObserveInt64(t.open, n[[2]string{typ, status}], metric.WithAttributes(schema, AttrSagaType.String(typ), AttrStatus.String(status)))
			}
		}
		pending, err := st.OperationCountPending(ctx)
		if err != nil {
			return err
		}
		o.ObserveInt64(t.requests, pending, metric.WithAttributes(schema))
		return nil
	}, t.open, t.requests)
	if err != nil {
		return nil, fmt.Errorf("telemetry: register saga gauges: %w", err)
	}
	return reg, nil
}

// ZeroDeliveryCounters adds zero to the counters of one component's
// deliveries and relay for schema, with every reason class and cause, so
// that their series exist from the start: an alert on their increase sees
// 0, not "no data", until the first event.
func (t *Telemetry) ZeroDeliveryCounters(ctx context.Context, component, schema string) {
	s := AttrSchema.String(schema)
	t.published.Add(ctx, 0, metric.WithAttributes(s))
	t.publishErrors.Add(ctx, 0, metric.WithAttributes(s))
	t.duplicates.Add(ctx, 0, metric.WithAttributes(s))
	for _, r := range deadLetterReasons {
		t.deadLetters.Add(ctx, 0, metric.WithAttributes(s, AttrComponent.String(component), AttrReason.String(r.String())))
	}
	for _, c := range retryCauses {
		t.retries.Add(ctx, 0, metric.WithAttributes(AttrComponent.String(component), AttrCause.String(c.String())))
	}
}

// ZeroSagaCounters adds zero to the saga counters of each saga type (each
// terminal status of sagabox.sagas.finished), for the same reason as
// ZeroDeliveryCounters.
func (t *Telemetry) ZeroSagaCounters(ctx context.Context, sagaTypes []string) {
	for _, typ := range sagaTypes {
		a := AttrSagaType.String(typ)
		t.sagasStarted.Add(ctx, 0, metric.WithAttributes(a))
		t.deadlines.Add(ctx, 0, metric.WithAttributes(a))
		for _, status := range finishedStatuses {
			t.sagasFinished.Add(ctx, 0, metric.WithAttributes(a, AttrStatus.String(status)))
		}
	}
}

// HandlerDone records how long a participant's handler took for a message
// of msgType and kind, and its outcome (a Handler constant).
func (t *Telemetry) HandlerDone(ctx context.Context, schema, msgType, kind, outcome string, d time.Duration) {
	t.handlerDuration.Record(ctx, max(d, 0).Seconds(), metric.WithAttributes(AttrSchema.String(schema),
		AttrMessageType.String(msgType), AttrKind.String(kind), AttrOutcome.String(outcome)))
}

// Duplicate counts a delivery the inbox recognised as a duplicate.
func (t *Telemetry) Duplicate(ctx context.Context, schema, msgType string) {
	t.duplicates.Add(ctx, 1, metric.WithAttributes(AttrSchema.String(schema), AttrMessageType.String(msgType)))
}

// Handled counts a handled delivery by outcome.
func (t *Telemetry) Handled(ctx context.Context, schema, component, msgType string, outcome Outcome) {
	t.handled.Add(ctx, 1, metric.WithAttributes(AttrSchema.String(schema), AttrComponent.String(component),
		AttrMessageType.String(msgType), AttrOutcome.String(outcome.String())))
}

// DeadLetter counts a dead-lettered message by its reason's class.
func (t *Telemetry) DeadLetter(ctx context.Context, schema, component string, reason Reason) {
	t.deadLetters.Add(ctx, 1, metric.WithAttributes(AttrSchema.String(schema), AttrComponent.String(component), AttrReason.String(reason.String())))
}

// SagaStarted counts a started saga.
func (t *Telemetry) SagaStarted(ctx context.Context, sagaType string) {
	t.sagasStarted.Add(ctx, 1, metric.WithAttributes(AttrSagaType.String(sagaType)))
}

// SagaAdmitted records how long a saga of sagaType waited for admission.
func (t *Telemetry) SagaAdmitted(ctx context.Context, sagaType string, wait time.Duration) {
	t.admissionWait.Record(ctx, max(wait, 0).Seconds(), metric.WithAttributes(AttrSagaType.String(sagaType)))
}

// RegisterQueuedGauges reports, at every collection, the sagas of st waiting
// for admission and the wait of the oldest, per type (no series for a type
// with none queued).
func (t *Telemetry) RegisterQueuedGauges(st driver.Executor, now func() time.Time) (metric.Registration, error) {
	reg, err := t.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, gaugeTimeout)
		defer cancel()
		counts, err := st.SagaQueued(ctx)
		if err != nil {
			return err
		}
		for _, q := range counts {
			attrs := metric.WithAttributes(AttrSchema.String(st.Schema()), AttrSagaType.String(q.Type))
			o.ObserveInt64(t.queued, q.Count, attrs)
			o.ObserveFloat64(t.queueAge, max(now().Sub(q.Oldest), 0).Seconds(), attrs)
		}
		return nil
	}, t.queued, t.queueAge)
	if err != nil {
		return nil, fmt.Errorf("telemetry: register queued saga gauges: %w", err)
	}
	return reg, nil
}

// SagaFinished counts a saga that reached status and records its duration.
func (t *Telemetry) SagaFinished(ctx context.Context, sagaType, status string, d time.Duration) {
	attrs := metric.WithAttributes(AttrSagaType.String(sagaType), AttrStatus.String(status))
	t.sagasFinished.Add(ctx, 1, attrs)
	t.sagaDuration.Record(ctx, max(d, 0).Seconds(), attrs)
}

// StepDone records the latency of one step phase.
func (t *Telemetry) StepDone(ctx context.Context, sagaType, step, phase string, d time.Duration) {
	t.stepLatency.Record(ctx, max(d, 0).Seconds(), metric.WithAttributes(AttrSagaType.String(sagaType), AttrStep.String(step), AttrPhase.String(phase)))
}

// DeadlineFired counts a deadline fired by the sweeper.
func (t *Telemetry) DeadlineFired(ctx context.Context, sagaType string) {
	t.deadlines.Add(ctx, 1, metric.WithAttributes(AttrSagaType.String(sagaType)))
}

// Retry counts a retry by component ("orchestrator" re-sending a command,
// "participant" retrying a delivery) and cause.
func (t *Telemetry) Retry(ctx context.Context, component, msgType string, cause Cause) {
	t.retries.Add(ctx, 1, metric.WithAttributes(AttrComponent.String(component), AttrMessageType.String(msgType), AttrCause.String(cause.String())))
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

// ExtractParent returns ctx with the remote span context of a stored W3C
// trace context as its parent, unless ctx already carries a valid span or
// traceparent is empty.
func ExtractParent(ctx context.Context, traceparent, tracestate string) context.Context {
	if traceparent == "" || trace.SpanContextFromContext(ctx).IsValid() {
		return ctx
	}
	return propagator.Extract(ctx, propagation.MapCarrier{"traceparent": traceparent, "tracestate": tracestate})
}

// Extract returns ctx with the remote span context carried by env.
func Extract(ctx context.Context, env *message.Envelope) context.Context {
	if env.TraceParent == "" {
		return ctx
	}
	return propagator.Extract(ctx, propagation.MapCarrier{"traceparent": env.TraceParent, "tracestate": env.TraceState})
}

// SpanName is the name of a messaging span: operation, kind and type, e.g.
// "send command inventory.reserve" or "process reply-success
// inventory.reserve". Every part is low-cardinality.
func SpanName(operation string, env *message.Envelope) string {
	return operation + " " + string(env.Kind) + " " + env.Type
}

// MessageAttributes are the messaging semantic-convention attributes of env
// for operation ("send" or "process"), plus sagabox's own.
func MessageAttributes(env *message.Envelope, operation string) []attribute.KeyValue {
	opName := operation
	if operation == "send" {
		opName = "publish"
	}
	attrs := []attribute.KeyValue{
		attribute.String("messaging.system", "rabbitmq"),
		attribute.String("messaging.operation.type", operation),
		attribute.String("messaging.operation.name", opName),
		attribute.String("messaging.destination.name", transport.Exchange(env.Kind)),
		attribute.String("messaging.rabbitmq.destination.routing_key", env.RoutingKey),
		attribute.String("messaging.message.id", env.MessageID.String()),
		AttrMessageType.String(env.Type),
		AttrKind.String(string(env.Kind)),
	}
	if env.CorrelationID != "" {
		attrs = append(attrs, attribute.String("messaging.message.conversation_id", env.CorrelationID))
	}
	if env.SagaType != "" {
		attrs = append(attrs, AttrSagaType.String(env.SagaType), AttrSagaID.String(env.SagaID.String()),
			AttrStep.String(env.Step), AttrAttempt.Int(env.Attempt))
	}
	return attrs
}

// StartPublish starts a producer span for m as a child of the span that wrote
// it (m's stored trace context; ctx's span when m has none), and rewrites m's
// trace context to the new span so that the consumer's span becomes its
// child. m's trace context is left alone when the span is not valid (no
// tracing configured), so the writer's context still travels.
func (t *Telemetry) StartPublish(ctx context.Context, m *message.Message) trace.Span {
	ctx = Extract(ctx, &m.Envelope)
	ctx, span := t.tracer.Start(ctx, SpanName("send", &m.Envelope), trace.WithSpanKind(trace.SpanKindProducer))
	if span.IsRecording() {
		// Built only for a span that records: with tracing off, a message
		// costs no attribute work.
		span.SetAttributes(MessageAttributes(&m.Envelope, "send")...)
	}
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
// producer span that sent it. component is "participant" or
// "orchestrator".
func (t *Telemetry) StartProcess(ctx context.Context, env *message.Envelope, component string) (context.Context, trace.Span) {
	ctx = Extract(ctx, env)
	ctx, span := t.tracer.Start(ctx, SpanName("process", env), trace.WithSpanKind(trace.SpanKindConsumer))
	if span.IsRecording() {
		span.SetAttributes(append(MessageAttributes(env, "process"), AttrComponent.String(component))...)
	}
	return ctx, span
}

// Fail marks span as failed with err.
func Fail(span trace.Span, err error) {
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
}

// Handled is what became of one delivery: its outcome and why, for the
// delivery's consumer span and the metrics.
type Handled struct {
	// Outcome is what handling the delivery did.
	Outcome Outcome
	// Inbox is InboxNew or InboxDuplicate once the inbox saw the message;
	// empty before.
	Inbox InboxOutcome
	// Reason is the dead-letter reason class of a delivery dead-lettered.
	Reason Reason
	// Cause is the retry cause of a delivery retried.
	Cause Cause
	// Err is the failure behind a retry or a dead letter.
	Err error
	// Attrs are more attributes for the span (a saga's status after a
	// reply).
	Attrs []attribute.KeyValue
}

// ConsumeFunc handles one delivery and says what became of it.
type ConsumeFunc func(ctx context.Context, d *transport.Delivery) (transport.Outcome, Handled)

// Consume returns h as the handler of one component's deliveries: each runs
// in a consumer span (see Begin) and is counted once h returns.
func (t *Telemetry) Consume(component, schema string, h ConsumeFunc) func(ctx context.Context, d *transport.Delivery) transport.Outcome {
	return func(ctx context.Context, d *transport.Delivery) transport.Outcome {
		ctx, end := t.Begin(ctx, component, schema, d)
		out, res := h(ctx, d)
		end(res)
		return out
	}
}

// Begin starts the consumer span of one delivery of a component, a child of
// the producer span that sent the message, and returns the context to
// handle it in and the function that, given what became of it, counts it
// (sagabox.messages.handled by outcome; duplicates, dead letters and retries
// with their reason) and ends the span.
func (t *Telemetry) Begin(ctx context.Context, component, schema string, d *transport.Delivery) (context.Context, func(Handled)) {
	ctx, span := t.StartProcess(ctx, &d.Envelope, component)
	return ctx, func(res Handled) {
		if span.IsRecording() {
			span.SetAttributes(AttrSchema.String(schema), AttrOutcome.String(res.Outcome.String()))
			if res.Inbox != 0 {
				span.SetAttributes(AttrInbox.String(res.Inbox.String()))
			}
			if res.Reason != 0 {
				span.SetAttributes(AttrReason.String(res.Reason.String()))
			}
			if res.Cause != 0 {
				span.SetAttributes(AttrCause.String(res.Cause.String()))
			}
			span.SetAttributes(res.Attrs...)
			if res.Err != nil {
				Fail(span, res.Err)
			}
		}
		span.End()
		if res.Inbox == InboxDuplicate {
			t.Duplicate(ctx, schema, d.Type)
		}
		switch res.Outcome {
		case OutcomeDeadLetter:
			t.DeadLetter(ctx, schema, component, res.Reason)
		case OutcomeRetry:
			t.Retry(ctx, component, d.Type, res.Cause)
		}
		t.Handled(ctx, schema, component, d.Type, res.Outcome)
	}
}

// Publisher returns pub with every message it publishes traced and counted:
// each gets a producer span, a child of the span that wrote it, whose
// context the message then carries (so that the consumer's span is the
// producer span's child), and each batch is counted for schema (messages
// published and not confirmed, batch size, time to confirm).
func (t *Telemetry) Publisher(schema string, pub transport.Publisher) transport.Publisher {
	return &publisher{t: t, pub: pub, attrs: metric.WithAttributes(AttrSchema.String(schema))}
}

type publisher struct {
	t     *Telemetry
	pub   transport.Publisher
	attrs metric.MeasurementOption
}

// Unavailable implements transport.Availability for a publisher that
// knows whether it is connected, and reports it always available
// otherwise.
func (p *publisher) Unavailable() time.Time {
	if a, ok := p.pub.(transport.Availability); ok {
		return a.Unavailable()
	}
	return time.Time{}
}

func (p *publisher) Publish(ctx context.Context, msgs ...message.Message) error {
	spans := make([]trace.Span, len(msgs))
	for i := range msgs {
		spans[i] = p.t.StartPublish(ctx, &msgs[i])
	}
	start := time.Now()
	err := p.pub.Publish(ctx, msgs...)
	elapsed := time.Since(start)
	confirmed := transport.Confirmed(len(msgs), err)
	ok := 0
	for i, span := range spans {
		var spanErr error
		if confirmed[i] {
			ok++
		} else {
			spanErr = fmt.Errorf("not confirmed: %w", err)
		}
		EndPublish(span, spanErr)
	}
	p.t.batchSize.Record(ctx, int64(len(msgs)), p.attrs)
	p.t.publishDuration.Record(ctx, elapsed.Seconds(), p.attrs)
	p.t.published.Add(ctx, int64(ok), p.attrs)
	if failed := len(msgs) - ok; failed > 0 {
		p.t.publishErrors.Add(ctx, int64(failed), p.attrs)
	}
	return err
}
