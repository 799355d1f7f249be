package console_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/participant"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

// The checkout-like test saga: reserve stock, charge the card, ship. An
// order to "nowhere" is rejected by shipping, so the charge is refunded and
// then the stock released.
type Order struct {
	ID      string `json:"id"`
	Amount  int    `json:"amount"`
	Address string `json:"address"`
}

type OrderRef struct {
	OrderID string `json:"order_id"`
}

type ShipReq struct {
	OrderID string `json:"order_id"`
	Address string `json:"address"`
}

var (
	Reserve = saga.NewCommand[OrderRef, saga.None]("inventory.reserve")
	Release = saga.NewCommand[OrderRef, saga.None]("inventory.release")
	Charge  = saga.NewCommand[OrderRef, saga.None]("payment.charge")
	Refund  = saga.NewCommand[OrderRef, saga.None]("payment.refund")
	Ship    = saga.NewCommand[ShipReq, saga.None]("shipping.ship")
	// Hold goes to a queue nobody consumes: a saga that stays running.
	Hold = saga.NewCommand[OrderRef, saga.None]("warehouse.hold")
)

const nowhere = "nowhere"

func ref(o *Order) OrderRef { return OrderRef{OrderID: o.ID} }

// checkout is the checkout saga.
func checkout() *saga.Definition[Order] {
	return saga.MustNew("checkout", 1,
		saga.Step("reserve", saga.Invoke(Reserve, ref, nil), saga.Compensate(Release, ref), saga.WithTimeout[Order](time.Minute)),
		saga.Step("charge", saga.Invoke(Charge, ref, nil), saga.Compensate(Refund, ref), saga.WithTimeout[Order](time.Minute)),
		saga.Step("ship", saga.Invoke(Ship, func(o *Order) ShipReq { return ShipReq{OrderID: o.ID, Address: o.Address} }, nil),
			saga.WithTimeout[Order](time.Minute)),
	)
}

// holding is a saga whose second step waits (on a participant that never
// answers) long enough for an operator to act on it.
func holding() *saga.Definition[Order] {
	return saga.MustNew("holding", 2,
		saga.Step("reserve", saga.Invoke(Reserve, ref, nil), saga.Compensate(Release, ref), saga.WithTimeout[Order](time.Minute)),
		saga.Step("hold", saga.Invoke(Hold, ref, nil), saga.WithTimeout[Order](time.Hour)),
	)
}

// world is a test's orchestrator schema (sagas and messaging), a
// participant schema and, for running sagas, a broker namespace.
type world struct {
	t    *testing.T
	pool *pgxpool.Pool
	orch *dbtest.DB
	svc  *dbtest.DB
	// tracer records spans, so that sagas have a trace id.
	tracer *sdktrace.TracerProvider
}

func newWorld(t *testing.T) *world {
	t.Helper()
	pool := dbtest.Pool(t)
	tracer := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tracer.Shutdown(context.Background()) })
	return &world{t: t, pool: pool, orch: dbtest.StoreOnPool(t, pool), svc: dbtest.StoreOnPool(t, pool, store.LineMessaging), tracer: tracer}
}

// orchestrator returns an orchestrator client of the world's schema for
// the test definitions, with broker (nil: one that only starts and reads).
func (w *world) orchestrator(broker *rabbitmq.Broker) *orchestrator.Client {
	w.t.Helper()
	c, err := orchestrator.NewClient(orchestrator.Config{
		Pool: w.pool, Schema: w.orch.Store.Schema(), Service: "checkout", Broker: broker,
		Definitions:   []saga.Runner{checkout(), holding()},
		SweepInterval: 100 * time.Millisecond, StopTimeout: 10 * time.Second,
		Relay:          orchestrator.RelayConfig{PollInterval: 200 * time.Millisecond},
		Logger:         slog.New(slog.DiscardHandler),
		TracerProvider: w.tracer,
	})
	require.NoError(w.t, err)
	return c
}

// participant returns the participant serving every test command but Hold.
func (w *world) participant(broker *rabbitmq.Broker) *participant.Client {
	w.t.Helper()
	c, err := participant.NewClient(participant.Config{
		Pool: w.pool, Schema: w.svc.Store.Schema(), Service: "shop", Broker: broker, Workers: 2,
		Retry:  saga.RetryPolicy{InitialInterval: 10 * time.Millisecond, MaxAttempts: 1},
		Relay:  participant.RelayConfig{PollInterval: 200 * time.Millisecond},
		Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(w.t, err)
	ok := func(context.Context, pgx.Tx, *participant.Request[OrderRef]) (saga.None, error) {
		return saga.None{}, nil
	}
	undo := func(context.Context, pgx.Tx, *participant.Request[OrderRef]) error { return nil }
	participant.HandleCommand(c, Reserve, ok)
	participant.HandleCompensation(c, Release, undo)
	participant.HandleCommand(c, Charge, ok)
	participant.HandleCompensation(c, Refund, undo)
	participant.HandleCommand(c, Ship, func(_ context.Context, _ pgx.Tx, req *participant.Request[ShipReq]) (saga.None, error) {
		if req.Data.Address == nowhere {
			return saga.None{}, participant.Reject(errors.New("no such address"))
		}
		return saga.None{}, nil
	})
	return c
}

// broker returns a broker in a namespace of the test's own.
func (w *world) broker() *rabbitmq.Broker {
	w.t.Helper()
	return amqptest.NewBroker(w.t, amqptest.Config(w.t))
}

// start starts a saga of def in its own committed transaction.
func (w *world) start(c *orchestrator.Client, def *saga.Definition[Order], o Order, key string) *orchestrator.Started {
	w.t.Helper()
	ctx := context.Background()
	tx, err := w.pool.Begin(ctx)
	require.NoError(w.t, err)
	defer tx.Rollback(ctx)
	st, err := orchestrator.Start(ctx, c, tx, def, o, &orchestrator.StartOpts{StartKey: key})
	require.NoError(w.t, err)
	require.NoError(w.t, tx.Commit(ctx))
	c.Wake()
	return st
}

// waitStatus waits until saga id has status.
func waitStatus(t *testing.T, c *orchestrator.Client, st *orchestrator.Started, status saga.Status) {
	t.Helper()
	testkit.WaitFor(t, 60*time.Second, fmt.Sprintf("saga %s to be %s", st.ID, status), func() bool {
		s, err := c.Get(context.Background(), st.ID)
		require.NoError(t, err)
		return s.Status == status
	})
}
