package main

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/examples/checkout/contract"
	"github.com/sagabox/sagabox/examples/checkout/inventory"
	"github.com/sagabox/sagabox/examples/checkout/loyalty"
	"github.com/sagabox/sagabox/examples/checkout/orders"
	"github.com/sagabox/sagabox/examples/checkout/payment"
	"github.com/sagabox/sagabox/examples/checkout/shipping"
	"github.com/sagabox/sagabox/faulttest"
	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/participant"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/transport"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

// The checkout services' fixed names in a fault run: one widget everyone
// buys, one SKU that is sold out, one customer who can pay, one who cannot,
// and one whose charges the provider never confirms.
const (
	faultWidget  = "widget"
	faultSoldOut = "gadget"
	faultRich    = "alice"
	faultBroke   = "bob"
	faultHeld    = "carol"
)

// faultOrder is the input of one checkout saga of a fault run.
type faultOrder struct {
	orders.Order
	want saga.Status
}

// checkoutFaults is the checkout example as a faulttest scenario: its real
// saga definition and participants, on schemas and queues of the test's
// own. pay registers the payment participant's handlers (the real one's,
// or a deliberately wrong one).
type checkoutFaults struct {
	pool                     *pgxpool.Pool
	rmq                      rabbitmq.Config
	ord                      *orders.Service
	inv                      *inventory.Service
	pay                      *payment.Service
	ship                     *shipping.Service
	loy                      *loyalty.Service
	widgetStock, richBalance int64
	heldBalance              int64
	provider                 *payment.Provider
	// webhook is the orders service's payment webhook, set up once the
	// schemas are migrated (Setup).
	webhook                     atomic.Pointer[http.Handler]
	register                    func(c *participant.Client)
	extraSetup                  func(ctx context.Context, pool *pgxpool.Pool) error
	extraInvariants             []faulttest.Invariant[faultOrder]
	participantRetryInitialWait time.Duration
}

func newCheckoutFaults(t *testing.T) *checkoutFaults {
	t.Helper()
	pool := dbtest.PoolWith(t, func(c *pgxpool.Config) { c.MaxConns = 8 })
	prefix := dbtest.SchemaName(t) + "_"
	for _, svc := range services {
		dbtest.DropSchemaOnCleanup(t, pool, prefix+svc)
	}
	cf := &checkoutFaults{
		pool: pool,
		rmq:  amqptest.Config(t),
		ord:  orders.New(orders.Config{Schema: prefix + contract.ServiceOrders}),
		inv:  inventory.New(prefix + contract.ServiceInventory),
		pay:  payment.New(prefix + contract.ServicePayment),
		ship: shipping.New(prefix + contract.ServiceShipping),
		loy:  loyalty.New(prefix + contract.ServiceLoyalty),
	}
	// The orders service's webhook, where the provider confirms charges.
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := cf.webhook.Load()
		if h == nil {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		(*h).ServeHTTP(w, r)
	})}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(ln)
	}()
	// The payment service charges through the example's outside provider.
	provider, err := payment.StartProvider(t.Context(), pool, cf.pay, payment.ProviderConfig{
		WebhookURLs: []string{"http://" + ln.Addr().String() + orders.WebhookPath},
	})
	require.NoError(t, err)
	cf.provider = provider
	t.Cleanup(func() {
		_ = provider.Close()
		_ = srv.Close()
		<-served
	})
	cf.pay.UseProvider(provider.URL())
	cf.register = cf.pay.Register
	cf.rmq.Logger = nil
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		b, err := rabbitmq.New(ctx, cf.rmq)
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
	return cf
}

func (cf *checkoutFaults) scenario(sagas int, seed uint64, faults *faulttest.Faults) faulttest.Scenario[faultOrder] {
	retry := saga.RetryPolicy{InitialInterval: cf.participantRetryInitialWait}
	part := func(svc, schema string, register func(*participant.Client)) faulttest.Participant {
		return faulttest.Participant{
			Config:   participant.Config{Schema: schema, Service: svc, Retry: retry},
			Register: register,
		}
	}
	return faulttest.Scenario[faultOrder]{
		Pool: cf.pool,
		Dial: func(ctx context.Context, name string) (transport.Broker, error) {
			cfg := cf.rmq
			cfg.ConnectionName = cf.rmq.ConnectionName + "." + name
			return rabbitmq.New(ctx, cfg)
		},
		Orchestrator: faulttest.Orchestrator{Config: orchestrator.Config{
			Schema: cf.ord.Schema(), Service: contract.ServiceOrders, Definitions: []saga.Runner{cf.ord.Saga},
		}},
		Participants: []faulttest.Participant{
			part(contract.ServiceInventory, cf.inv.Schema(), cf.inv.Register),
			part(contract.ServicePayment, cf.pay.Schema(), cf.register),
			part(contract.ServiceShipping, cf.ship.Schema(), cf.ship.Register),
			part(contract.ServiceLoyalty, cf.loy.Schema(), cf.loy.Register),
		},
		Migrate: true,
		Sagas:   sagas,
		Seed:    seed,
		Faults:  faults,
		Timeout: 3 * time.Minute,
		Input:   cf.input,
		Setup:   cf.setup,
		Start: func(ctx context.Context, c *orchestrator.Client, in faultOrder) (uuid.UUID, error) {
			started, err := cf.ord.Place(ctx, cf.pool, c, in.Order)
			if err != nil {
				return uuid.Nil, err
			}
			return started.ID, nil
		},
		Plan:       func(in faultOrder) saga.Status { return in.want },
		Invariants: append(cf.invariants(), cf.extraInvariants...),
	}
}

// input draws an order: most complete; some are refused by payment (the
// stock is released), some by inventory (nothing to undo), some are charged
// but never confirmed by the provider (the wait times out: refund and
// release), and some by shipping (points revoked, refund and release).
func (cf *checkoutFaults) input(rng *rand.Rand, i int) faultOrder {
	o := faultOrder{Order: orders.Order{
		ID: fmt.Sprintf("order-%03d", i), Customer: faultRich, SKU: faultWidget,
		Qty: 1 + rng.IntN(3), AmountCents: int64(500 + 100*rng.IntN(50)), Address: "1 Saga Street",
	}, want: saga.StatusCompleted}
	switch p := rng.Float64(); {
	case p < 0.08:
		o.Customer, o.want = faultBroke, saga.StatusCompensated
	case p < 0.16:
		o.SKU, o.want = faultSoldOut, saga.StatusCompensated
	case p < 0.24:
		o.Customer, o.want = faultHeld, saga.StatusCompensated
	case p < 0.32:
		o.Address, o.want = contract.Undeliverable, saga.StatusCompensated
	}
	return o
}

// setup creates the tables and stocks and funds exactly what the inputs
// need.
func (cf *checkoutFaults) setup(ctx context.Context, pool *pgxpool.Pool, inputs []faultOrder) error {
	for _, f := range []func(context.Context, *pgxpool.Pool) error{cf.ord.Setup, cf.inv.Setup, cf.pay.Setup, cf.ship.Setup, cf.loy.Setup} {
		if err := f(ctx, pool); err != nil {
			return err
		}
	}
	cf.widgetStock, cf.richBalance, cf.heldBalance = 0, 0, 0
	for _, in := range inputs {
		if in.SKU == faultWidget {
			cf.widgetStock += int64(in.Qty)
		}
		switch {
		case in.want == saga.StatusCompleted, in.Address == contract.Undeliverable:
			cf.richBalance += in.AmountCents
		case in.Customer == faultHeld:
			cf.heldBalance += in.AmountCents
		}
	}
	for _, err := range []error{
		cf.inv.Stock(ctx, pool, faultWidget, int(cf.widgetStock)),
		cf.inv.Stock(ctx, pool, faultSoldOut, 0),
		cf.pay.Account(ctx, pool, faultRich, cf.richBalance),
		cf.pay.Account(ctx, pool, faultBroke, 0),
		cf.pay.Account(ctx, pool, faultHeld, cf.heldBalance),
		cf.pay.HoldConfirmations(ctx, pool, faultHeld),
	} {
		if err != nil {
			return err
		}
	}
	// The webhook sends the confirmations with a client of its own, as the
	// orders service's handler does: a running orchestrator is not needed
	// for SendEvent.
	orch, err := orchestrator.NewClient(orchestrator.Config{
		Pool: pool, Schema: cf.ord.Schema(), Service: contract.ServiceOrders, Definitions: []saga.Runner{cf.ord.Saga},
	})
	if err != nil {
		return err
	}
	h := cf.ord.Webhook(pool, orch, nil)
	cf.webhook.Store(&h)
	if cf.extraSetup != nil {
		return cf.extraSetup(ctx, pool)
	}
	return nil
}

// count runs a count query; {schema} names are replaced by the services'.
func (cf *checkoutFaults) count(ctx context.Context, pool *pgxpool.Pool, query string, args ...any) (int64, error) {
	query = strings.NewReplacer(
		"{orders}", pgx.Identifier{cf.ord.Schema()}.Sanitize(), "{inventory}", pgx.Identifier{cf.inv.Schema()}.Sanitize(),
		"{payment}", pgx.Identifier{cf.pay.Schema()}.Sanitize(), "{shipping}", pgx.Identifier{cf.ship.Schema()}.Sanitize(),
		"{loyalty}", pgx.Identifier{cf.loy.Schema()}.Sanitize(),
	).Replace(query)
	var n int64
	if err := pool.QueryRow(ctx, query, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("audit query: %w", err)
	}
	return n, nil
}

// invariants are the checkout's business invariants, per order and over
// the whole run.
func (cf *checkoutFaults) invariants() []faulttest.Invariant[faultOrder] {
	perOrder := func(name, query string, want func(r faulttest.Result[faultOrder]) int64) faulttest.Invariant[faultOrder] {
		return faulttest.Invariant[faultOrder]{Name: name,
			CheckSaga: func(ctx context.Context, pool *pgxpool.Pool, r faulttest.Result[faultOrder]) error {
				n, err := cf.count(ctx, pool, query, r.Input.ID)
				if err != nil {
					return err
				}
				if w := want(r); n != w {
					return fmt.Errorf("order %s: %d, want %d", r.Input.ID, n, w)
				}
				return nil
			}}
	}
	ifCompleted := func(v int64) func(r faulttest.Result[faultOrder]) int64 {
		return func(r faulttest.Result[faultOrder]) int64 {
			if r.Status == saga.StatusCompleted {
				return v
			}
			return 0
		}
	}
	qtyIfCompleted := func(r faulttest.Result[faultOrder]) int64 { return ifCompleted(int64(r.Input.Qty))(r) }
	pointsIfCompleted := func(r faulttest.Result[faultOrder]) int64 {
		return ifCompleted(contract.PointsFor(r.Input.AmountCents))(r)
	}
	amountIfCompleted := func(r faulttest.Result[faultOrder]) int64 { return ifCompleted(r.Input.AmountCents)(r) }
	return []faulttest.Invariant[faultOrder]{
		perOrder("stock is held for an order if and only if it completed",
			`SELECT coalesce(sum(qty), 0) FROM {inventory}.reservation WHERE order_id = $1 AND NOT released`, qtyIfCompleted),
		perOrder("an order is charged if and only if it completed",
			`SELECT coalesce(sum(amount_cents), 0) FROM {payment}.charge WHERE order_id = $1 AND NOT refunded`, amountIfCompleted),
		perOrder("an order is shipped (and not cancelled) if and only if it completed",
			`SELECT count(*) FROM {shipping}.shipment WHERE order_id = $1 AND NOT cancelled`, ifCompleted(1)),
		perOrder("an order keeps its loyalty points if and only if it completed",
			`SELECT coalesce(sum(points), 0) FROM {loyalty}.award WHERE order_id = $1 AND NOT revoked`, pointsIfCompleted),
		perOrder("an order is confirmed if and only if it completed",
			`SELECT count(*) FROM {orders}.orders WHERE id = $1 AND status = 'confirmed'`, ifCompleted(1)),
		{Name: "a completed order has one payment confirmation, recorded once however often it was delivered",
			CheckSaga: func(ctx context.Context, pool *pgxpool.Pool, r faulttest.Result[faultOrder]) error {
				recorded, err := cf.count(ctx, pool, `SELECT payment_confirmations::bigint FROM {orders}.orders WHERE id = $1`, r.Input.ID)
				if err != nil {
					return err
				}
				made, err := cf.count(ctx, pool, `SELECT count(*) FROM {payment}.provider_webhook WHERE reference = $1`, r.Input.ID)
				switch {
				case err != nil:
					return err
				case recorded > made, r.Status == saga.StatusCompleted && (made != 1 || recorded != 1),
					// Shipping rejects an undeliverable order after its
					// charge was confirmed.
					r.Status == saga.StatusCompensated && r.Input.Address == contract.Undeliverable && !r.TimedOut && (made != 1 || recorded != 1),
					// A saga compensated by an injected timeout may get its
					// confirmation after: recorded, and ignored by the saga.
					r.Status == saga.StatusCompensated && r.Input.Address != contract.Undeliverable && !r.TimedOut && recorded != 0:
					return fmt.Errorf("order %s (%s): the provider confirmed %d charges, the orders service recorded %d", r.Input.ID, r.Status, made, recorded)
				}
				return nil
			}},
		{Name: "stock taken = stock of completed orders", Check: func(ctx context.Context, pool *pgxpool.Pool, rs []faulttest.Result[faultOrder]) error {
			available, err := cf.count(ctx, pool, `SELECT available::bigint FROM {inventory}.stock WHERE sku = $1`, faultWidget)
			if err != nil {
				return err
			}
			var bought int64
			for _, r := range rs {
				bought += qtyIfCompleted(r)
			}
			if taken := cf.widgetStock - available; taken != bought {
				return fmt.Errorf("%d of %s taken from stock, completed orders bought %d", taken, faultWidget, bought)
			}
			return nil
		}},
		{Name: "points held = points of completed orders", Check: func(ctx context.Context, pool *pgxpool.Pool, rs []faulttest.Result[faultOrder]) error {
			held, err := cf.count(ctx, pool, `SELECT coalesce(sum(points), 0) FROM {loyalty}.member`)
			if err != nil {
				return err
			}
			var earned int64
			for _, r := range rs {
				earned += pointsIfCompleted(r)
			}
			if held != earned {
				return fmt.Errorf("customers hold %d loyalty points, completed orders earned %d", held, earned)
			}
			return nil
		}},
		{Name: "money taken = price of completed orders", Check: func(ctx context.Context, pool *pgxpool.Pool, rs []faulttest.Result[faultOrder]) error {
			balance, err := cf.count(ctx, pool, `SELECT balance_cents FROM {payment}.account WHERE customer = $1`, faultRich)
			if err != nil {
				return err
			}
			var paid int64
			for _, r := range rs {
				if r.Input.Customer == faultRich {
					paid += amountIfCompleted(r)
				}
			}
			if taken := cf.richBalance - balance; taken != paid {
				return fmt.Errorf("%d cents taken from %s, completed orders cost %d", taken, faultRich, paid)
			}
			held, err := cf.count(ctx, pool, `SELECT balance_cents FROM {payment}.account WHERE customer = $1`, faultHeld)
			if err != nil {
				return err
			}
			if held != cf.heldBalance {
				return fmt.Errorf("%s, whose charges are never confirmed, has %d cents, not the %d seeded", faultHeld, held, cf.heldBalance)
			}
			return nil
		}},
	}
}

// The checkout example under every kind of fault the kit injects: its
// sagas end as planned and its business invariants hold. The short run is
// part of every `go test`; FAULTTEST_LONG=1 runs the long one.
func TestCheckoutUnderFaults(t *testing.T) {
	t.Parallel()
	cf := newCheckoutFaults(t)
	sagas, timeout := 30, 3*time.Minute
	faults := faulttest.DefaultFaults()
	// Six rounds exhaust the checkout steps' three attempts (each timeout
	// and each backoff takes a round): the sagas in
	// flight compensate, and their steps' replies arrive after that.
	faults.TimeoutRounds = 6
	if os.Getenv("FAULTTEST_LONG") != "" {
		timeout = 15 * time.Minute
		sagas = 300
		faults = faulttest.Faults{
			Duplicate: 0.3, DelayedDuplicate: 0.3, LostConfirm: 0.2, LostAck: 0.3, Hold: 0.3,
			KillEvery: 20 * time.Millisecond, Restarts: 12, Timeouts: 4, TimeoutRounds: 6, Window: 30 * time.Second,
		}
	}
	sc := cf.scenario(sagas, 0, &faults)
	sc.Timeout = timeout
	rep := faulttest.Run(t, sc)
	require.Equal(t, sagas, rep.Sagas)
	require.Positive(t, rep.Outcomes[saga.StatusCompleted])
	require.Positive(t, rep.Outcomes[saga.StatusCompensated])
	require.Positive(t, rep.FaultCount())
}

// wrongPayment is a payment service with one of two bugs that only
// at-least-once delivery exposes.
type wrongPayment struct {
	cf *checkoutFaults
	// outsideTx debits the account on a connection of its own instead of
	// the delivery's transaction: a delivery rolled back after it (an
	// aborted transaction, a crash) and run again debits twice.
	outsideTx bool
	// sideEffectThenRetry calls the card gateway (a non-idempotent
	// external call, recorded in a table) before the work that can fail
	// with a retryable error: the retry calls the gateway again.
	sideEffectThenRetry bool
}

func (w *wrongPayment) sql(q string) string {
	return strings.ReplaceAll(q, "payment.", pgx.Identifier{w.cf.pay.Schema()}.Sanitize()+".")
}

func (w *wrongPayment) register(c *participant.Client) {
	participant.HandleCommand(c, contract.Charge, w.charge)
	participant.HandleCompensation(c, contract.Refund, w.refund)
}

func (w *wrongPayment) setup(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, w.sql(`CREATE TABLE IF NOT EXISTS payment.gateway_call (order_id text NOT NULL, at timestamptz NOT NULL DEFAULT now())`))
	return err
}

// flaky reports whether the gateway answers "try again" for an order's first
// attempt: a third of the orders, by a hash of the id.
func flaky(orderID string) bool {
	h := fnv.New32a()
	_, _ = h.Write([]byte(orderID))
	return h.Sum32()%3 == 0
}

func (w *wrongPayment) charge(ctx context.Context, tx pgx.Tx, req *participant.Request[contract.ChargePayment]) (contract.PaymentCharged, error) {
	if w.sideEffectThenRetry {
		if _, err := w.cf.pool.Exec(ctx, w.sql(`INSERT INTO payment.gateway_call (order_id) VALUES ($1)`), req.Data.OrderID); err != nil {
			return contract.PaymentCharged{}, err
		}
		if req.DeliveryAttempt == 1 && flaky(req.Data.OrderID) {
			return contract.PaymentCharged{}, errors.New("gateway: timeout, try again")
		}
	}
	update := `UPDATE payment.account SET balance_cents = balance_cents - $2 WHERE customer = $1 AND balance_cents >= $2`
	var affected int64
	if w.outsideTx {
		tag, err := w.cf.pool.Exec(ctx, w.sql(update), req.Data.Customer, req.Data.AmountCents)
		if err != nil {
			return contract.PaymentCharged{}, err
		}
		affected = tag.RowsAffected()
		// On its first attempt, the rest of the handler's work takes a while
		// (as a call to another service would): the delivery's transaction
		// is open, idle, meanwhile, which is when a lost connection rolls it
		// back. On a quiet machine the window would otherwise be too short
		// for 20 sagas to hit it.
		if req.DeliveryAttempt == 1 {
			time.Sleep(25 * time.Millisecond)
		}
	} else {
		tag, err := tx.Exec(ctx, w.sql(update), req.Data.Customer, req.Data.AmountCents)
		if err != nil {
			return contract.PaymentCharged{}, err
		}
		affected = tag.RowsAffected()
	}
	if affected == 0 {
		return contract.PaymentCharged{}, participant.RejectWithCode("insufficient_funds", errors.New("cannot pay"))
	}
	if _, err := tx.Exec(ctx, w.sql(`INSERT INTO payment.charge (order_id, customer, amount_cents) VALUES ($1, $2, $3)`),
		req.Data.OrderID, req.Data.Customer, req.Data.AmountCents); err != nil {
		return contract.PaymentCharged{}, err
	}
	// The provider confirms the charge (its webhook delivery picks this up).
	if _, err := tx.Exec(ctx, w.sql(`INSERT INTO payment.provider_webhook (event_id, charge_id, reference, confirmed_at, next_at)
		VALUES ($1, $1, $2, now(), now()) ON CONFLICT (event_id) DO NOTHING`), "evt-ch-"+req.Data.OrderID, req.Data.OrderID); err != nil {
		return contract.PaymentCharged{}, err
	}
	return contract.PaymentCharged{ChargeID: "ch-" + req.Data.OrderID}, nil
}

func (w *wrongPayment) refund(ctx context.Context, tx pgx.Tx, req *participant.Request[contract.RefundPayment]) error {
	var customer string
	var amount int64
	err := tx.QueryRow(ctx, w.sql(`UPDATE payment.charge SET refunded = true
		WHERE order_id = $1 AND NOT refunded RETURNING customer, amount_cents`), req.Data.OrderID).Scan(&customer, &amount)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, w.sql(`UPDATE payment.account SET balance_cents = balance_cents + $2 WHERE customer = $1`), customer, amount)
	return err
}

// runWrong runs the checkout with a wrong payment participant: the kit must
// report the violation of invariant, and the same seed must report it again.
func runWrong(t *testing.T, w func(cf *checkoutFaults) *wrongPayment, invariant string, faults faulttest.Faults) {
	t.Helper()
	var seed uint64
	for i := range 2 {
		cf := newCheckoutFaults(t)
		wp := w(cf)
		cf.register, cf.extraSetup = wp.register, wp.setup
		cf.extraInvariants = []faulttest.Invariant[faultOrder]{{
			Name: "the card gateway is called at most once per order",
			CheckSaga: func(ctx context.Context, pool *pgxpool.Pool, r faulttest.Result[faultOrder]) error {
				n, err := cf.count(ctx, pool, `SELECT count(*) FROM {payment}.gateway_call WHERE order_id = $1`, r.Input.ID)
				if err != nil {
					return err
				}
				if n > 1 {
					return fmt.Errorf("order %s: the gateway was called %d times", r.Input.ID, n)
				}
				return nil
			},
		}}
		cf.participantRetryInitialWait = 100 * time.Millisecond
		rep, err := faulttest.Execute(t.Context(), cf.scenario(20, seed, &faults))
		require.NoError(t, err)
		t.Logf("run %d:\n%s", i+1, rep)
		require.True(t, rep.Failed(), "the kit missed the bug (seed %d)", rep.Seed)
		v := rep.Violated(invariant)
		require.NotNil(t, v, "the kit reports %q (seed %d)", invariant, rep.Seed)
		require.Contains(t, rep.String(), fmt.Sprintf("%s=%d", faulttest.SeedEnv, rep.Seed), "the report says how to repeat the run")
		if i == 0 {
			seed = rep.Seed
		} else {
			require.Equal(t, seed, rep.Seed)
		}
	}
}

// A participant that writes its effect on a connection of its own, outside
// the delivery's transaction, passes a plain run; under the kit, a delivery
// rolled back after that write (its connection killed) and delivered again
// debits the customer twice,
// and the kit says so, again with the same seed.
func TestFaultKitCatchesWriteOutsideTransaction(t *testing.T) {
	t.Parallel()
	faults := faulttest.Faults{KillEvery: 50 * time.Millisecond, LostAck: 0.1, Duplicate: 0.1}
	runWrong(t, func(cf *checkoutFaults) *wrongPayment { return &wrongPayment{cf: cf, outsideTx: true} },
		"money taken = price of completed orders", faults)
}

// A participant that calls a non-idempotent external service before work
// that fails with a retryable error calls it again on the retry; the kit
// reports the order, with its timeline, and the same seed reports it again.
func TestFaultKitCatchesSideEffectBeforeRetryableError(t *testing.T) {
	t.Parallel()
	faults := faulttest.Faults{Duplicate: 0.2, LostAck: 0.2, Hold: 0.2}
	runWrong(t, func(cf *checkoutFaults) *wrongPayment { return &wrongPayment{cf: cf, sideEffectThenRetry: true} },
		"the card gateway is called at most once per order", faults)
}
