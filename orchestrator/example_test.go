package orchestrator_test

import (
	"context"
	"errors"
	"log"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

// Checkout is the data of the example saga.
type Checkout struct {
	OrderID string `json:"order_id"`
	Amount  int    `json:"amount"`
}

// CheckoutSaga charges an order and refunds it if a later step fails.
var CheckoutSaga = saga.MustNew("checkout", 1,
	saga.Step("charge",
		saga.Invoke(Charge, func(c *Checkout) ChargeReq { return ChargeReq{OrderID: c.OrderID, Amount: c.Amount} }, nil),
		saga.Compensate(Refund, func(c *Checkout) OrderRef { return OrderRef{OrderID: c.OrderID} }),
		saga.WithTimeout[Checkout](30*time.Second),
		saga.WithRetry[Checkout](saga.RetryPolicy{MaxAttempts: 3}),
	),
	saga.Step("ship",
		saga.Invoke(Ship, func(c *Checkout) ShipReq { return ShipReq{OrderID: c.OrderID, Address: "main street"} }, nil),
		saga.WithTimeout[Checkout](time.Minute),
	),
)

// This example runs an orchestrator and starts a saga in the same
// transaction as the order it belongs to. It needs PostgreSQL and RabbitMQ.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/shop")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	broker, err := rabbitmq.New(ctx, rabbitmq.Config{URL: "amqp://guest:guest@127.0.0.1:5672/"})
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = broker.Close() }()

	client, err := orchestrator.NewClient(orchestrator.Config{
		Pool:        pool,
		Schema:      "orders",
		Service:     "orders",
		Broker:      broker,
		Definitions: []saga.Runner{CheckoutSaga},
	})
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- client.Run(ctx) }()

	// Start a saga in the transaction that creates the order.
	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO shop.orders (id, amount) VALUES ($1, $2)`, "o-1", 42); err != nil {
		log.Fatal(err)
	}
	started, err := orchestrator.Start(ctx, client, tx, CheckoutSaga, Checkout{OrderID: "o-1", Amount: 42},
		&orchestrator.StartOpts{StartKey: "o-1"})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
	client.Wake() // publish the first command now

	s, err := client.Get(ctx, started.ID)
	if errors.Is(err, orchestrator.ErrNotFound) {
		log.Fatal("the transaction committed: the saga exists")
	}
	log.Printf("saga %s is %s", s.ID, s.Status)

	if err := <-done; err != nil {
		log.Fatal(err)
	}
}
