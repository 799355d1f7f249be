package orchestrator_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/participant"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/transport"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

// The test saga: reserve stock, charge the card, ship.
type Order struct {
	ID            string `json:"id"`
	Qty           int    `json:"qty"`
	Amount        int    `json:"amount"`
	Address       string `json:"address"`
	ReservationID string `json:"reservation_id,omitempty"`
	ChargeID      string `json:"charge_id,omitempty"`
}

type ReserveReq struct {
	OrderID string `json:"order_id"`
	Qty     int    `json:"qty"`
}
type ReserveReply struct {
	ReservationID string `json:"reservation_id"`
}
type OrderRef struct {
	OrderID string `json:"order_id"`
}
type ChargeReq struct {
	OrderID string `json:"order_id"`
	Amount  int    `json:"amount"`
}
type ChargeReply struct {
	ChargeID string `json:"charge_id"`
}
type ShipReq struct {
	OrderID string `json:"order_id"`
	Address string `json:"address"`
}

var (
	Reserve = saga.NewCommand[ReserveReq, ReserveReply]("inventory.reserve")
	Release = saga.NewCommand[OrderRef, saga.None]("inventory.release")
	Charge  = saga.NewCommand[ChargeReq, ChargeReply]("payment.charge")
	Refund  = saga.NewCommand[OrderRef, saga.None]("payment.refund")
	Ship    = saga.NewCommand[ShipReq, saga.None]("shipping.ship")
)

// declinedAmount and nowhere make the payment and shipping participants
// reject.
const (
	declinedAmount = 13
	nowhere        = "nowhere"
)

// orderSaga builds the order saga at version with timeout on every step
// and chargeAttempts attempts for the charge.
func orderSaga(version int, timeout time.Duration, chargeAttempts int) *saga.Definition[Order] {
	ref := func(o *Order) OrderRef { return OrderRef{OrderID: o.ID} }
	return saga.MustNew("order", version,
		saga.Step("reserve",
			saga.Invoke(Reserve, func(o *Order) ReserveReq { return ReserveReq{OrderID: o.ID, Qty: o.Qty} },
				func(o *Order, r ReserveReply) { o.ReservationID = r.ReservationID }),
			saga.Compensate(Release, ref),
			saga.WithTimeout[Order](timeout),
		),
		saga.Step("charge",
			saga.Invoke(Charge, func(o *Order) ChargeReq { return ChargeReq{OrderID: o.ID, Amount: o.Amount} },
				func(o *Order, r ChargeReply) { o.ChargeID = r.ChargeID }),
			saga.Compensate(Refund, ref),
			saga.WithTimeout[Order](timeout),
			saga.WithRetry[Order](saga.RetryPolicy{MaxAttempts: chargeAttempts, InitialInterval: time.Second}),
		),
		saga.Step("ship",
			saga.Invoke(Ship, func(o *Order) ShipReq { return ShipReq{OrderID: o.ID, Address: o.Address} }, nil),
			saga.WithTimeout[Order](timeout),
		),
	)
}

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// env is one test's world: an orchestrator schema, two participant schemas
// with business tables, and a broker namespace.
type env struct {
	t      *testing.T
	pool   *pgxpool.Pool
	orch   *dbtest.DB
	inv    *dbtest.DB
	pay    *dbtest.DB
	broker *rabbitmq.Broker
	ns     string // the broker's namespace
	errs   *errorCounter

	// failRelease makes the inventory's release compensation fail.
	failRelease atomic.Bool

	// participantMods change the configuration of the participants created
	// after they are set (e.g. telemetry providers).
	participantMods []func(*participant.Config)
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvOnPool(t, dbtest.Pool(t))
}

// newEnvOnPool is newEnv on pool.
func newEnvOnPool(t *testing.T, pool *pgxpool.Pool) *env {
	t.Helper()
	bcfg := amqptest.Config(t)
	e := &env{
		t:      t,
		pool:   pool,
		orch:   dbtest.StoreOnPool(t, pool),
		inv:    dbtest.StoreOnPool(t, pool, store.LineMessaging),
		pay:    dbtest.StoreOnPool(t, pool, store.LineMessaging),
		broker: amqptest.NewBroker(t, bcfg),
		ns:     bcfg.Namespace,
		errs:   &errorCounter{},
	}
	ctx := context.Background()
	_, err := pool.Exec(ctx, fmt.Sprintf(`
		CREATE TABLE %[1]s.reservations (order_id text PRIMARY KEY, qty int NOT NULL, released bool NOT NULL DEFAULT false);
		CREATE TABLE %[1]s.shipments (order_id text PRIMARY KEY, address text NOT NULL);
		CREATE TABLE %[2]s.charges (order_id text PRIMARY KEY, amount int NOT NULL, refunded bool NOT NULL DEFAULT false);`,
		pgx.Identifier{e.inv.Schema()}.Sanitize(), pgx.Identifier{e.pay.Schema()}.Sanitize()))
	require.NoError(t, err)
	return e
}

// orchConfig is the orchestrator configuration of the tests.
func (e *env) orchConfig(defs ...saga.Runner) orchestrator.Config {
	return orchestrator.Config{
		Pool:          e.pool,
		Schema:        e.orch.Schema(),
		Service:       "orders",
		Broker:        e.broker,
		Definitions:   defs,
		SweepInterval: 50 * time.Millisecond,
		StopTimeout:   10 * time.Second,
		Relay:         orchestrator.RelayConfig{PollInterval: 200 * time.Millisecond},
		Logger:        slog.New(e.errs.wrap(amqptest.Logger(e.t).Handler())),
	}
}

// newOrchestrator returns a client for cfg, not running.
func (e *env) newOrchestrator(cfg orchestrator.Config) *orchestrator.Client {
	e.t.Helper()
	c, err := orchestrator.NewClient(cfg)
	require.NoError(e.t, err)
	return c
}

// runOrchestrator creates a client for cfg and runs it until the test ends.
func (e *env) runOrchestrator(cfg orchestrator.Config) *orchestrator.Client {
	e.t.Helper()
	c := e.newOrchestrator(cfg)
	testkit.Run(e.t, c.Run)
	return c
}

// participantConfig is the configuration of the tests' participants.
func (e *env) participantConfig(st *dbtest.DB, service string) participant.Config {
	cfg := participant.Config{
		Pool: e.pool, Schema: st.Schema(), Service: service, Broker: e.broker, Workers: 3,
		Retry:  saga.RetryPolicy{InitialInterval: 10 * time.Millisecond, MaxAttempts: 1},
		Relay:  participant.RelayConfig{PollInterval: 200 * time.Millisecond},
		Logger: amqptest.Logger(e.t),
	}
	for _, mod := range e.participantMods {
		mod(&cfg)
	}
	return cfg
}

// inventory handles reserve and release on queue "inventory" and, with
// ship, shipping on the same participant.
func (e *env) inventory(ship bool) *participant.Client {
	e.t.Helper()
	c, err := participant.NewClient(e.participantConfig(e.inv, "inventory"))
	require.NoError(e.t, err)
	q := func(sql string) string { return fmt.Sprintf(sql, pgx.Identifier{e.inv.Schema()}.Sanitize()) }
	participant.HandleCommand(c, Reserve, func(ctx context.Context, tx pgx.Tx, req *participant.Request[ReserveReq]) (ReserveReply, error) {
		_, err := tx.Exec(ctx, q(`INSERT INTO %s.reservations (order_id, qty) VALUES ($1, $2)`), req.Data.OrderID, req.Data.Qty)
		return ReserveReply{ReservationID: "r-" + req.Data.OrderID}, err
	})
	participant.HandleCompensation(c, Release, func(ctx context.Context, tx pgx.Tx, req *participant.Request[OrderRef]) error {
		if e.failRelease.Load() {
			return errors.New("inventory database is read-only")
		}
		_, err := tx.Exec(ctx, q(`UPDATE %s.reservations SET released = true WHERE order_id = $1`), req.Data.OrderID)
		return err
	})
	if ship {
		e.handleShip(c)
	}
	return c
}

// orchestratorQueue is the reply queue of the tests' orchestrators.
var orchestratorQueue = transport.QueueSpec{Name: "orders", Replies: true}

// newShipping returns a participant serving only shipping, on queue
// "shipping" (in the inventory's schema).
func newShipping(e *env) (*participant.Client, error) {
	c, err := participant.NewClient(e.participantConfig(e.inv, "shipping"))
	if err != nil {
		return nil, err
	}
	e.handleShip(c)
	return c, nil
}

func (e *env) handleShip(c *participant.Client) {
	q := func(sql string) string { return fmt.Sprintf(sql, pgx.Identifier{e.inv.Schema()}.Sanitize()) }
	participant.HandleCommand(c, Ship, func(ctx context.Context, tx pgx.Tx, req *participant.Request[ShipReq]) (saga.None, error) {
		if req.Data.Address == nowhere {
			return saga.None{}, participant.Reject(errors.New("no such address"))
		}
		_, err := tx.Exec(ctx, q(`INSERT INTO %s.shipments (order_id, address) VALUES ($1, $2)`), req.Data.OrderID, req.Data.Address)
		return saga.None{}, err
	})
}

// payment handles charge (unless charge is false) and refund on queue
// "payment".
func (e *env) payment(charge bool) *participant.Client {
	e.t.Helper()
	c, err := participant.NewClient(e.participantConfig(e.pay, "payment"))
	require.NoError(e.t, err)
	q := func(sql string) string { return fmt.Sprintf(sql, pgx.Identifier{e.pay.Schema()}.Sanitize()) }
	if charge {
		participant.HandleCommand(c, Charge, func(ctx context.Context, tx pgx.Tx, req *participant.Request[ChargeReq]) (ChargeReply, error) {
			if req.Data.Amount%declinedAmount == 0 {
				return ChargeReply{}, participant.RejectWithCode("declined", errors.New("card declined"))
			}
			_, err := tx.Exec(ctx, q(`INSERT INTO %s.charges (order_id, amount) VALUES ($1, $2)`), req.Data.OrderID, req.Data.Amount)
			return ChargeReply{ChargeID: "c-" + req.Data.OrderID}, err
		})
	}
	participant.HandleCompensation(c, Refund, func(ctx context.Context, tx pgx.Tx, req *participant.Request[OrderRef]) error {
		_, err := tx.Exec(ctx, q(`UPDATE %s.charges SET refunded = true WHERE order_id = $1`), req.Data.OrderID)
		return err
	})
	return c
}

// blackhole declares a queue that receives commands and is never consumed:
// a participant that never answers.
func (e *env) blackhole(commands ...string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), amqptest.Timeout)
	defer cancel()
	require.NoError(e.t, e.broker.Declare(ctx, transport.QueueSpec{Name: "blackhole", Commands: commands}))
}

// start starts one order saga in its own committed transaction.
func (e *env) start(c *orchestrator.Client, def *saga.Definition[Order], o Order, opts *orchestrator.StartOpts) *orchestrator.Started {
	e.t.Helper()
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	require.NoError(e.t, err)
	defer tx.Rollback(ctx)
	st, err := orchestrator.Start(ctx, c, tx, def, o, opts)
	require.NoError(e.t, err)
	require.NoError(e.t, tx.Commit(ctx))
	c.Wake()
	return st
}

// count runs a count query with the schema names substituted (%[1]s
// orchestrator, %[2]s inventory, %[3]s payment).
func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	q := fmt.Sprintf(sql, pgx.Identifier{e.orch.Schema()}.Sanitize(), pgx.Identifier{e.inv.Schema()}.Sanitize(), pgx.Identifier{e.pay.Schema()}.Sanitize())
	require.NoError(e.t, e.pool.QueryRow(context.Background(), q, args...).Scan(&n))
	return n
}

// waitSettled waits until no saga is running or compensating, and n sagas
// exist.
func (e *env) waitSettled(n int, timeout time.Duration) {
	e.t.Helper()
	testkit.WaitFor(e.t, timeout, fmt.Sprintf("%d sagas to settle", n), func() bool {
		return e.count(`SELECT count(*) FROM %[1]s.sagabox_saga WHERE status NOT IN ('running', 'compensating')`) == n
	})
}

// waitStatus waits until saga id has status.
func waitStatus(t *testing.T, c *orchestrator.Client, id uuid.UUID, status saga.Status, timeout time.Duration) *orchestrator.Saga {
	t.Helper()
	var s *orchestrator.Saga
	testkit.WaitFor(t, timeout, fmt.Sprintf("saga %s to be %s", id, status), func() bool {
		var err error
		s, err = c.Get(context.Background(), id)
		require.NoError(t, err)
		return s.Status == status
	})
	return s
}

// checkBusiness checks that the business state of order o matches its
// saga's terminal status.
func (e *env) checkBusiness(o Order, status saga.Status) {
	e.t.Helper()
	held := e.count(`SELECT count(*) FROM %[2]s.reservations WHERE order_id = $1 AND NOT released`, o.ID)
	charged := e.count(`SELECT count(*) FROM %[3]s.charges WHERE order_id = $1 AND NOT refunded`, o.ID)
	shipped := e.count(`SELECT count(*) FROM %[2]s.shipments WHERE order_id = $1`, o.ID)
	switch status {
	case saga.StatusCompleted:
		require.Equal(e.t, []int{1, 1, 1}, []int{held, charged, shipped}, "order %s completed: reservation held, charge kept, shipped", o.ID)
	case saga.StatusCompensated:
		require.Equal(e.t, []int{0, 0, 0}, []int{held, charged, shipped}, "order %s compensated: reservation released, charge refunded, not shipped", o.ID)
	default:
		e.t.Fatalf("order %s: unexpected status %s", o.ID, status)
	}
}

// expected returns the terminal status order o must reach.
func expected(o Order) saga.Status {
	if o.Amount%declinedAmount == 0 || o.Address == nowhere {
		return saga.StatusCompensated
	}
	return saga.StatusCompleted
}

// errorCounter counts log records at level Error and above.
type errorCounter struct {
	n    atomic.Int64
	last atomic.Value
}

func (c *errorCounter) wrap(h slog.Handler) slog.Handler { return &countingHandler{Handler: h, c: c} }

type countingHandler struct {
	slog.Handler
	c *errorCounter
}

func (h *countingHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelError {
		h.c.n.Add(1)
		h.c.last.Store(r.Message)
	}
	return h.Handler.Handle(ctx, r)
}

func (h *countingHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &countingHandler{Handler: h.Handler.WithAttrs(attrs), c: h.c}
}

func (h *countingHandler) WithGroup(name string) slog.Handler {
	return &countingHandler{Handler: h.Handler.WithGroup(name), c: h.c}
}
