package orchestrator_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/telemetry"
	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/internal/testkit/telemetrytest"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/participant"
	"github.com/sagabox/sagabox/saga"
)

// Nothing waits for ever unseen: a command no queue takes is reported when
// the orchestrator starts (log, gauge), a saga held by an unpublished
// command shows in a gauge, and a step's schedule-to-start timeout
// compensates it instead of letting it stall.

// logRecorder keeps the records logged through it (and passes them on).
type logRecorder struct {
	next slog.Handler
	mu   *sync.Mutex
	recs *[]slog.Record
}

func newLogRecorder(t *testing.T) *logRecorder {
	return &logRecorder{next: amqptest.Logger(t).Handler(), mu: &sync.Mutex{}, recs: &[]slog.Record{}}
}

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (r *logRecorder) Handle(ctx context.Context, rec slog.Record) error {
	r.mu.Lock()
	*r.recs = append(*r.recs, rec.Clone())
	r.mu.Unlock()
	return r.next.Handle(ctx, rec)
}

func (r *logRecorder) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &logRecorder{next: r.next.WithAttrs(attrs), mu: r.mu, recs: r.recs}
}

func (r *logRecorder) WithGroup(name string) slog.Handler {
	return &logRecorder{next: r.next.WithGroup(name), mu: r.mu, recs: r.recs}
}

// find returns the attributes of the first record at level whose message
// contains msg and whose attributes include want, and whether there is one.
func (r *logRecorder) find(level slog.Level, msg string, want map[string]string) (map[string]string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range *r.recs {
		if rec.Level != level || !strings.Contains(rec.Message, msg) {
			continue
		}
		attrs := map[string]string{}
		rec.Attrs(func(a slog.Attr) bool {
			attrs[a.Key] = a.Value.String()
			return true
		})
		ok := true
		for k, v := range want {
			ok = ok && attrs[k] == v
		}
		if ok {
			return attrs, true
		}
	}
	return nil, false
}

// A command no queue takes is reported when the orchestrator starts: one
// log line per step and phase sending it, naming the saga type, the step
// and the routing key, and the sagabox.commands.unroutable gauge. Once a
// queue takes it, the gauge says so.
func TestUnroutableCommandsReportedAtStart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	meter := telemetrytest.NewMeter(t)
	logs := newLogRecorder(t)
	def := orderSaga(1, time.Minute, 1)
	cfg := e.orchConfig(def)
	cfg.MeterProvider, cfg.Logger, cfg.RouteCheckInterval = meter.Provider, slog.New(logs), 100*time.Millisecond
	inv := e.inventory(true) // reserve, release, ship; payment is not deployed
	ctx, cancel := context.WithTimeout(context.Background(), amqptest.Timeout)
	defer cancel()
	require.NoError(t, e.broker.Declare(ctx, inv.QueueSpec()))
	testkit.Run(t, inv.Run)
	e.runOrchestrator(cfg)

	const noQueue = "no queue takes a command of a saga definition"
	testkit.WaitFor(t, 30*time.Second, "both payment commands reported", func() bool {
		_, charge := logs.find(slog.LevelWarn, noQueue, map[string]string{"routing_key": "payment.charge"})
		_, refund := logs.find(slog.LevelWarn, noQueue, map[string]string{"routing_key": "payment.refund"})
		return charge && refund
	})
	attrs, _ := logs.find(slog.LevelWarn, noQueue, map[string]string{"routing_key": "payment.charge"})
	require.Equal(t, map[string]string{"saga_type": "order", "version": "1", "step": "charge", "phase": "action", "routing_key": "payment.charge", "exchange": "commands"}, attrs)
	attrs, _ = logs.find(slog.LevelWarn, noQueue, map[string]string{"routing_key": "payment.refund"})
	require.Equal(t, "compensation", attrs["phase"])
	for _, routable := range []string{"inventory.reserve", "inventory.release", "shipping.ship"} {
		_, logged := logs.find(slog.LevelWarn, noQueue, map[string]string{"routing_key": routable})
		require.False(t, logged, "%s has a queue", routable)
	}
	unroutable := func(command string) float64 {
		v, ok := meter.Collect(t).Gauge(telemetry.MetricCommandsUnroutable, telemetry.AttrSagaType.String("order"), telemetry.AttrMessageType.String(command))
		require.True(t, ok, "a series for %s", command)
		return v
	}
	require.Equal(t, 1.0, unroutable("payment.charge"))
	require.Equal(t, 1.0, unroutable("payment.refund"))
	require.Equal(t, 0.0, unroutable("inventory.reserve"))

	// The payment service comes up: it declares its queue, the next check
	// finds it.
	testkit.Run(t, e.payment(true).Run)
	testkit.WaitFor(t, 30*time.Second, "the gauge clears", func() bool {
		return unroutable("payment.charge") == 0 && unroutable("payment.refund") == 0
	})
	_, logged := logs.find(slog.LevelInfo, "a queue now takes a command", map[string]string{"routing_key": "payment.charge", "step": "charge"})
	require.True(t, logged)
}

// shipWhenDeployed is the order saga whose ship step goes to a shipping
// service that is not deployed yet (the tests start it, or not), with the
// given options on the ship step.
func shipWhenDeployed(opts ...saga.StepOption[Order]) *saga.Definition[Order] {
	ref := func(o *Order) OrderRef { return OrderRef{OrderID: o.ID} }
	ship := append([]saga.StepOption[Order]{
		saga.Invoke(Ship, func(o *Order) ShipReq { return ShipReq{OrderID: o.ID, Address: o.Address} }, nil),
	}, opts...)
	return saga.MustNew("order", 1,
		saga.Step("reserve",
			saga.Invoke(Reserve, func(o *Order) ReserveReq { return ReserveReq{OrderID: o.ID, Qty: o.Qty} },
				func(o *Order, r ReserveReply) { o.ReservationID = r.ReservationID }),
			saga.Compensate(Release, ref),
			saga.WithTimeout[Order](time.Minute),
		),
		saga.Step("charge",
			saga.Invoke(Charge, func(o *Order) ChargeReq { return ChargeReq{OrderID: o.ID, Amount: o.Amount} },
				func(o *Order, r ChargeReply) { o.ChargeID = r.ChargeID }),
			saga.Compensate(Refund, ref),
			saga.WithTimeout[Order](time.Minute),
		),
		saga.Step("ship", ship...),
	)
}

// unseenEnv runs the inventory (without shipping) and payment services and
// an orchestrator of def on a fake clock with a meter; shipping is not
// deployed. mods change the orchestrator's configuration.
func unseenEnv(t *testing.T, def *saga.Definition[Order], mods ...func(*orchestrator.Config)) (*env, *orchestrator.Client, *fakeClock, *telemetrytest.Meter) {
	t.Helper()
	e := newEnv(t)
	clock := newFakeClock()
	meter := telemetrytest.NewMeter(t)
	cfg := e.orchConfig(def)
	cfg.Clock, cfg.MeterProvider = clock.Now, meter.Provider
	for _, mod := range mods {
		mod(&cfg)
	}
	for _, p := range []*participant.Client{e.inventory(false), e.payment(true)} {
		testkit.Run(t, p.Run)
	}
	return e, e.runOrchestrator(cfg), clock, meter
}

// waitAtShip waits until the saga's ship command waits in the outbox,
// unpublished: no queue takes it.
func (e *env) waitAtShip(c *orchestrator.Client, id uuid.UUID) {
	e.t.Helper()
	testkit.WaitFor(e.t, 30*time.Second, "the ship command retried as unroutable", func() bool {
		s, err := c.Get(context.Background(), id)
		require.NoError(e.t, err)
		return s.Steps[2].Status == saga.StepRunning &&
			e.count(`SELECT count(*) FROM %[1]s.sagabox_outbox WHERE type = 'shipping.ship' AND published_at IS NULL AND publish_attempts > 1`) == 1
	})
}

func unpublishedOverdue(t *testing.T, m *telemetrytest.Meter) float64 {
	t.Helper()
	v, ok := m.Collect(t).Gauge(telemetry.MetricSagasUnpublished, telemetry.AttrSagaType.String("order"))
	require.True(t, ok, "the gauge reports every saga type")
	return v
}

// With a schedule-to-start timeout, a saga whose command no queue takes
// compensates once the timeout passes, instead of stalling: the command is
// withdrawn, the steps before are undone.
func TestScheduleToStartCompensatesInsteadOfStalling(t *testing.T) {
	t.Parallel()
	def := shipWhenDeployed(saga.WithTimeout[Order](time.Minute), saga.WithScheduleToStartTimeout[Order](10*time.Minute))
	e, c, clock, meter := unseenEnv(t, def)
	o := Order{ID: "o-1", Qty: 1, Amount: 10, Address: "here"}
	st := e.start(c, def, o, nil)
	e.waitAtShip(c, st.ID)

	// Past the step's own timeout: it does not fire, the command is not
	// the participant's yet. The saga shows as waiting for it.
	clock.Advance(3 * time.Minute)
	testkit.WaitFor(t, 30*time.Second, "the saga counted as waiting for an unpublished message", func() bool {
		return unpublishedOverdue(t, meter) == 1
	})
	s, err := c.Get(context.Background(), st.ID)
	require.NoError(t, err)
	require.Equal(t, saga.StatusRunning, s.Status)
	require.Equal(t, saga.StepRunning, s.Steps[2].Status)

	clock.Advance(7 * time.Minute)
	s = waitStatus(t, c, st.ID, saga.StatusCompensated, 30*time.Second)
	require.Equal(t, saga.StepTimedOut, s.Steps[2].Status)
	require.Contains(t, s.LastError, `command "shipping.ship" not published within 10m0s (schedule-to-start timeout)`)
	e.checkBusiness(o, saga.StatusCompensated)
	require.Zero(t, e.count(`SELECT count(*) FROM %[1]s.sagabox_outbox WHERE type = 'shipping.ship'`), "the command was withdrawn: it goes nowhere, later")
	h, err := c.History(context.Background(), st.ID)
	require.NoError(t, err)
	var timedOut []string
	for _, entry := range h {
		if entry.Event == saga.HistoryTimedOut {
			timedOut = append(timedOut, entry.Step+": "+entry.Detail)
		}
	}
	require.Equal(t, []string{"ship: not published within 10m0s (schedule-to-start timeout)"}, timedOut)
	testkit.WaitFor(t, 30*time.Second, "the gauge clears", func() bool { return unpublishedOverdue(t, meter) == 0 })
}

// Without the timeout the saga waits for its command, for as long as it
// takes, and the gauge behind the alert shows it (the sweeper is not to
// blame: sagabox.sagas.overdue stays at 0). Once the service is deployed
// the saga completes.
func TestUnpublishedCommandWaitsAndShows(t *testing.T) {
	t.Parallel()
	def := shipWhenDeployed()
	e, c, clock, meter := unseenEnv(t, def)
	o := Order{ID: "o-1", Qty: 1, Amount: 10, Address: "here"}
	st := e.start(c, def, o, nil)
	e.waitAtShip(c, st.ID)
	require.Zero(t, unpublishedOverdue(t, meter), "not for long enough yet")

	clock.Advance(2 * time.Minute)
	testkit.WaitFor(t, 30*time.Second, "the saga counted as waiting for an unpublished message", func() bool {
		return unpublishedOverdue(t, meter) == 1
	})
	overdue, ok := meter.Collect(t).Gauge(telemetry.MetricSagasOverdue)
	require.True(t, ok)
	require.Zero(t, overdue, "the sweeper has nothing to fire")
	s, err := c.Get(context.Background(), st.ID)
	require.NoError(t, err)
	require.Equal(t, saga.StatusRunning, s.Status)

	shipping, err := newShipping(e)
	require.NoError(t, err)
	testkit.Run(t, shipping.Run)
	waitStatus(t, c, st.ID, saga.StatusCompleted, 30*time.Second)
	e.checkBusiness(o, saga.StatusCompleted)
	require.Zero(t, unpublishedOverdue(t, meter))
}

// A command published late, but within its schedule-to-start timeout, is
// not affected: the saga goes on as if it had gone out at once.
func TestScheduleToStartPublishedLateWithinTheTimeout(t *testing.T) {
	t.Parallel()
	def := shipWhenDeployed(saga.WithTimeout[Order](time.Hour), saga.WithScheduleToStartTimeout[Order](10*time.Minute))
	e, c, clock, _ := unseenEnv(t, def)
	o := Order{ID: "o-1", Qty: 1, Amount: 10, Address: "here"}
	st := e.start(c, def, o, nil)
	e.waitAtShip(c, st.ID)
	clock.Advance(9 * time.Minute)

	shipping, err := newShipping(e)
	require.NoError(t, err)
	testkit.Run(t, shipping.Run)
	s := waitStatus(t, c, st.ID, saga.StatusCompleted, 30*time.Second)
	require.Empty(t, s.LastError)
	e.checkBusiness(o, saga.StatusCompleted)
	h, err := c.History(context.Background(), st.ID)
	require.NoError(t, err)
	for _, entry := range h {
		require.NotEqual(t, saga.HistoryTimedOut, entry.Event, "nothing timed out")
	}
}

// Sagas stuck on a command no queue takes no longer hold the admission
// limit for ever: with a schedule-to-start timeout each leaves its place
// when it times out, and the saga queued behind it is admitted.
func TestScheduleToStartFreesTheAdmissionLimit(t *testing.T) {
	t.Parallel()
	def := shipWhenDeployed(saga.WithTimeout[Order](time.Minute), saga.WithScheduleToStartTimeout[Order](10*time.Minute))
	e, c, clock, _ := unseenEnv(t, def, func(cfg *orchestrator.Config) { cfg.Admission.MaxRunning = 1 })
	first := e.start(c, def, Order{ID: "o-1", Qty: 1, Amount: 10, Address: "here"}, nil)
	second := e.start(c, def, Order{ID: "o-2", Qty: 1, Amount: 10, Address: "here"}, nil)
	e.waitAtShip(c, first.ID)
	s, err := c.Get(context.Background(), second.ID)
	require.NoError(t, err)
	require.Equal(t, saga.StatusQueued, s.Status, "the limit is reached")

	clock.Advance(10 * time.Minute)
	waitStatus(t, c, first.ID, saga.StatusCompensated, 30*time.Second)
	e.waitAtShip(c, second.ID) // admitted: its ship command now waits
	clock.Advance(10 * time.Minute)
	waitStatus(t, c, second.ID, saga.StatusCompensated, 30*time.Second)
}
