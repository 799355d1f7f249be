package participant_test

import (
	"context"
	"errors"
	"log"
	"os"
	"os/signal"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sagabox/sagabox/participant"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

// The contracts are shared with the saga definition (usually in a contract
// package).
type ExampleReserve struct {
	SKU string `json:"sku"`
	Qty int    `json:"qty"`
}

type ExampleReserved struct {
	Remaining int `json:"remaining"`
}

var (
	exampleReserve = saga.NewCommand[ExampleReserve, ExampleReserved]("inventory.reserve")
	exampleRelease = saga.NewCommand[ExampleReserve, saga.None]("inventory.release")
)

// An inventory service that reserves stock for sagas and releases it when
// they compensate. It needs PostgreSQL (with `sagabox migrate up` applied to
// its schema) and RabbitMQ, so it is compiled but not run.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	broker, err := rabbitmq.New(ctx, rabbitmq.Config{URL: os.Getenv("AMQP_URL"), Namespace: "shop"})
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = broker.Close() }()

	client, err := participant.NewClient(participant.Config{
		Pool:    pool,
		Schema:  "inventory",
		Service: "inventory",
		Broker:  broker,
	})
	if err != nil {
		log.Fatal(err)
	}

	participant.HandleCommand(client, exampleReserve, func(ctx context.Context, tx pgx.Tx, req *participant.Request[ExampleReserve]) (ExampleReserved, error) {
		var left int
		err := tx.QueryRow(ctx, `UPDATE stock SET qty = qty - $2 WHERE sku = $1 AND qty >= $2 RETURNING qty`,
			req.Data.SKU, req.Data.Qty).Scan(&left)
		if errors.Is(err, pgx.ErrNoRows) {
			// A business "no": the saga compensates the steps before this one.
			return ExampleReserved{}, participant.RejectWithCode("out_of_stock", errors.New("not enough stock"))
		}
		return ExampleReserved{Remaining: left}, err // any other error is retried
	})
	participant.HandleCompensation(client, exampleRelease, func(ctx context.Context, tx pgx.Tx, req *participant.Request[ExampleReserve]) error {
		// Runs only if the reservation was applied here, and at most once.
		_, err := tx.Exec(ctx, `UPDATE stock SET qty = qty + $2 WHERE sku = $1`, req.Data.SKU, req.Data.Qty)
		return err
	})

	// Run blocks until ctx is cancelled, then drains within StopTimeout.
	if err := client.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
