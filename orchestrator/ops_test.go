package orchestrator_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

// TestUnknownDefinitionVersionIsDeadLettered: a reply for a saga whose
// definition version this orchestrator does not run is dead-lettered with
// a clear reason and recorded on the saga; the consumer keeps going.
func TestUnknownDefinitionVersionIsDeadLettered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	v1, v2 := orderSaga(1, time.Minute, 1), orderSaga(2, time.Minute, 1)
	testkit.Run(t, e.inventory(true).Run)
	testkit.Run(t, e.payment(true).Run)
	// A newer deployment started a v2 saga; the running orchestrator has v1 only.
	newer := e.newOrchestrator(e.orchConfig(v1, v2))
	c := e.runOrchestrator(e.orchConfig(v1))
	ctx, cancel := context.WithTimeout(context.Background(), amqptest.Timeout)
	defer cancel()
	require.NoError(t, e.broker.Declare(ctx, orchestratorQueue))
	dlq := amqptest.Consume(t, e.broker.DeadLetterQueueName("orders"))

	st2 := e.start(newer, v2, Order{ID: "v2", Qty: 1, Amount: 10, Address: "here"}, nil)
	d := amqptest.Next(t, dlq, amqptest.Timeout)
	reason, _ := d.Headers[rabbitmq.HeaderDeadLetterReason].(string)
	require.Contains(t, reason, "order v2")
	require.Contains(t, reason, st2.ID.String())

	s, err := c.Get(context.Background(), st2.ID)
	require.NoError(t, err)
	require.Equal(t, saga.StatusRunning, s.Status)
	require.Contains(t, s.LastError, "order v2")
	h, err := c.History(context.Background(), st2.ID)
	require.NoError(t, err)
	require.Equal(t, orchestrator.HistoryReplyDeadLettered, h[len(h)-1].Event)

	// The consumer keeps going.
	st1 := e.start(c, v1, Order{ID: "v1", Qty: 1, Amount: 10, Address: "here"}, nil)
	waitStatus(t, c, st1.ID, saga.StatusCompleted, 30*time.Second)
}

// TestOperatorRetryAndAbort: an operator retries the failed compensation
// of a failed saga and aborts a running one; both change the saga and are
// recorded with actor and reason.
func TestOperatorRetryAndAbort(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	def := orderSaga(1, time.Minute, 1)
	e.blackhole(Ship.Name()) // shipping never answers
	testkit.Run(t, e.inventory(false).Run)
	testkit.Run(t, e.payment(true).Run)
	c := e.runOrchestrator(e.orchConfig(def))
	ctx := context.Background()

	// Retry: the charge is declined and the release fails for good (the
	// participant gives up after one attempt): the saga is failed.
	e.failRelease.Store(true)
	failed := e.start(c, def, Order{ID: "retry", Qty: 1, Amount: declinedAmount, Address: "here"}, nil)
	s := waitStatus(t, c, failed.ID, saga.StatusFailed, 30*time.Second)
	require.Equal(t, saga.StepCompensationFailed, s.Steps[0].Status)
	require.NotEmpty(t, s.LastError)
	_, err := c.Abort(ctx, failed.ID, "bob", "too late")
	require.ErrorIs(t, err, saga.ErrInvalidTransition)

	e.failRelease.Store(false)
	s, err = c.Retry(ctx, failed.ID, "alice", "inventory database writable again")
	require.NoError(t, err)
	require.Equal(t, saga.StatusCompensating, s.Status)
	waitStatus(t, c, failed.ID, saga.StatusCompensated, 30*time.Second)
	e.checkBusiness(Order{ID: "retry"}, saga.StatusCompensated)
	requireEntry(t, c, failed.ID, saga.HistoryRetried, "alice", "inventory database writable again")

	// Abort: the saga waits on shipping.
	stuck := e.start(c, def, Order{ID: "abort", Qty: 1, Amount: 10, Address: "here"}, nil)
	testkit.WaitFor(t, 30*time.Second, "saga to wait on shipping", func() bool {
		s, err := c.Get(ctx, stuck.ID)
		require.NoError(t, err)
		return s.CurrentStep == 2
	})
	s, err = c.Abort(ctx, stuck.ID, "bob", "customer cancelled")
	require.NoError(t, err)
	require.Equal(t, saga.StatusCompensating, s.Status)
	s = waitStatus(t, c, stuck.ID, saga.StatusCompensated, 30*time.Second)
	require.Equal(t, saga.StepAborted, s.Steps[2].Status)
	require.Contains(t, s.LastError, "customer cancelled")
	e.checkBusiness(Order{ID: "abort"}, saga.StatusCompensated)
	requireEntry(t, c, stuck.ID, saga.HistoryCancelled, "bob", "customer cancelled")
	_, err = c.Retry(ctx, stuck.ID, "bob", "again")
	require.ErrorIs(t, err, saga.ErrInvalidTransition)

	_, err = c.Abort(ctx, [16]byte{1}, "bob", "nothing")
	require.ErrorIs(t, err, orchestrator.ErrNotFound)
}

func requireEntry(t *testing.T, c *orchestrator.Client, id [16]byte, ev saga.HistoryEvent, actor, reason string) {
	t.Helper()
	h, err := c.History(context.Background(), id)
	require.NoError(t, err)
	for _, en := range h {
		if en.Event == ev {
			require.Equal(t, actor, en.Actor)
			require.Equal(t, reason, en.Detail)
			return
		}
	}
	t.Fatalf("no %s entry in history %v", ev, h)
}

// TestListPagesStalestFirst lists sagas by status and age, one page at a
// time.
func TestListPagesStalestFirst(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	def := orderSaga(1, time.Minute, 1)
	clock := newFakeClock()
	cfg := e.orchConfig(def)
	cfg.Clock = clock.Now
	c := e.newOrchestrator(cfg)
	ctx := context.Background()
	var want []string
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		st := e.start(c, def, Order{ID: id, Qty: 1, Amount: 1, Address: "here"}, nil)
		want = append(want, st.ID.String())
		clock.Advance(time.Minute)
	}
	var got []string
	opts := &orchestrator.ListOpts{Statuses: []saga.Status{saga.StatusRunning}, Type: "order", Limit: 2}
	for {
		page, err := c.List(ctx, opts)
		require.NoError(t, err)
		for _, s := range page.Sagas {
			got = append(got, s.ID.String())
		}
		if page.Cursor == "" {
			break
		}
		opts.After = page.Cursor
	}
	require.Equal(t, want, got)

	page, err := c.List(ctx, &orchestrator.ListOpts{OlderThan: 3*time.Minute + time.Second})
	require.NoError(t, err)
	require.Len(t, page.Sagas, 2, "a and b were not updated for more than 3 minutes")
	page, err = c.List(ctx, &orchestrator.ListOpts{Statuses: []saga.Status{saga.StatusFailed}})
	require.NoError(t, err)
	require.Empty(t, page.Sagas)
	_, err = c.List(ctx, &orchestrator.ListOpts{After: "garbage"})
	require.ErrorContains(t, err, "ListOpts.After")
	_, err = c.Get(ctx, [16]byte{1})
	require.ErrorIs(t, err, orchestrator.ErrNotFound)
	_, err = c.History(ctx, [16]byte{1})
	require.ErrorIs(t, err, message.ErrNotFound)
}

// TestListFiltersByVersionStartKeyAndOverdue lists sagas by definition
// version, by start key (with and without a type) and those stuck past a
// deadline.
func TestListFiltersByVersionStartKeyAndOverdue(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	v1, v2 := orderSaga(1, time.Minute, 1), orderSaga(2, time.Minute, 1)
	clock := newFakeClock()
	cfg := e.orchConfig(v1, v2)
	cfg.Clock = clock.Now
	c := e.newOrchestrator(cfg)
	ctx := context.Background()
	a := e.start(c, v1, Order{ID: "a", Qty: 1, Amount: 1, Address: "here"}, &orchestrator.StartOpts{StartKey: "k-a"})
	clock.Advance(2 * time.Minute)
	b := e.start(c, v2, Order{ID: "b", Qty: 1, Amount: 1, Address: "here"}, &orchestrator.StartOpts{StartKey: "k-b"})
	ids := func(opts *orchestrator.ListOpts) []uuid.UUID {
		t.Helper()
		page, err := c.List(ctx, opts)
		require.NoError(t, err)
		var out []uuid.UUID
		for _, s := range page.Sagas {
			out = append(out, s.ID)
		}
		return out
	}
	require.Equal(t, []uuid.UUID{b.ID}, ids(&orchestrator.ListOpts{Version: 2}))
	require.Equal(t, []uuid.UUID{a.ID}, ids(&orchestrator.ListOpts{Type: "order", Version: 1}))
	require.Equal(t, []uuid.UUID{a.ID}, ids(&orchestrator.ListOpts{StartKey: "k-a"}))
	require.Equal(t, []uuid.UUID{b.ID}, ids(&orchestrator.ListOpts{Type: "order", StartKey: "k-b"}))
	require.Empty(t, ids(&orchestrator.ListOpts{Type: "other", StartKey: "k-b"}))
	require.Equal(t, []uuid.UUID{a.ID}, ids(&orchestrator.ListOpts{Overdue: true}), "a's first step is past its deadline, b's is not")
	require.Empty(t, ids(&orchestrator.ListOpts{Overdue: true, Statuses: []saga.Status{saga.StatusCompleted}}))
	_, err := c.List(ctx, &orchestrator.ListOpts{Version: -1})
	require.ErrorContains(t, err, "ListOpts.Version")
}

// TestRunRefusesUnmigratedSchema: Run names the command that migrates.
func TestRunRefusesUnmigratedSchema(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	st := dbtest.StoreOnPool(t, pool, store.LineMessaging) // no saga line
	c, err := orchestrator.NewClient(orchestrator.Config{
		Pool: pool, Schema: st.Schema(), Service: "orders", Broker: amqptest.NewBroker(t, rabbitmq.Config{}),
		Definitions: []saga.Runner{orderSaga(1, time.Minute, 1)}, Logger: amqptest.Logger(t),
	})
	require.NoError(t, err)
	err = c.Run(context.Background())
	require.ErrorIs(t, err, store.ErrSchemaOutdated)
	require.ErrorContains(t, err, "sagabox migrate up --schema "+st.Schema())
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	valid := func() orchestrator.Config {
		return orchestrator.Config{Pool: pool, Service: "orders", Broker: amqptest.NewBroker(t, rabbitmq.Config{})}
	}
	tests := []struct {
		name   string
		modify func(c *orchestrator.Config)
		want   string
	}{
		{"valid", func(*orchestrator.Config) {}, ""},
		{"no pool", func(c *orchestrator.Config) { c.Pool = nil }, "Pool is required"},
		{"no service", func(c *orchestrator.Config) { c.Service = " " }, "Service is required"},
		{"bad schema", func(c *orchestrator.Config) { c.Schema = "Bad-Schema" }, "Schema:"},
		{"prefetch", func(c *orchestrator.Config) { c.Workers, c.Prefetch = 4, 2 }, "Prefetch 2 is less than Workers 4"},
		{"sweep batch", func(c *orchestrator.Config) { c.SweepBatch = -1 }, "SweepBatch -1"},
		{"lease", func(c *orchestrator.Config) { c.Relay.Lease, c.Relay.PublishTimeout = time.Second, 2*time.Second }, "Relay.Lease"},
		{"retention", func(c *orchestrator.Config) { c.Retention.Sagas = -time.Hour }, "Retention.Sagas"},
		{"duplicate definition", func(c *orchestrator.Config) {
			c.Definitions = []saga.Runner{orderSaga(1, time.Minute, 1), orderSaga(1, time.Minute, 1)}
		}, "Definitions"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := valid()
			tt.modify(&cfg)
			_, err := orchestrator.NewClient(cfg)
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			require.True(t, strings.Contains(err.Error(), tt.want), "%v does not name %q", err, tt.want)
		})
	}
	// Without a broker a Client can inspect and operate, but not Run.
	noBroker, err := orchestrator.NewClient(orchestrator.Config{Pool: pool, Service: "orders",
		Definitions: []saga.Runner{orderSaga(1, time.Minute, 1)}})
	require.NoError(t, err)
	noBroker.Wake() // a no-op, not a panic
	require.ErrorContains(t, noBroker.Run(context.Background()), "Config.Broker is required to Run")

	d := orchestrator.Config{}.WithDefaults()
	require.Equal(t, orchestrator.DefaultWorkers, d.Workers)
	require.Equal(t, 2*orchestrator.DefaultWorkers, d.Prefetch)
	require.Equal(t, orchestrator.DefaultSweepInterval, d.SweepInterval)
	require.Equal(t, store.DefaultSchema, d.Schema)
	require.NotNil(t, d.Clock)
}
