// Command tutorial is the program of docs/tutorial.md, "Your first saga":
// a trips service (the orchestrator) books trips with a saga that reserves
// a seat and charges a card at an airline service (a participant). The
// charge of a card the bank declines is rejected, and the seat is released.
//
//	go run ./examples/tutorial
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/participant"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

// Config says where the two services keep their state.
type Config struct {
	DatabaseURL   string // PostgreSQL
	AMQPURL       string // RabbitMQ
	TripsSchema   string // the trips service's tables, sagabox's included
	AirlineSchema string // the airline's tables, sagabox's included
	Namespace     string // prefix of the RabbitMQ exchanges and queues
	Logger        *slog.Logger
}

func main() {
	cfg := Config{
		DatabaseURL:   envOr("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
		AMQPURL:       envOr("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
		TripsSchema:   "trips",
		AirlineSchema: "airline",
		Namespace:     "tutorial",
		Logger:        slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, cfg, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "tutorial:", err)
		os.Exit(1)
	}
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// run sets both services up, runs them, books two trips and prints how
// their sagas ended.
func run(ctx context.Context, cfg Config, out io.Writer) error {
	poolCfg, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return err
	}
	poolCfg.MaxConns = 20 // the two clients hold up to 16 connections at once
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	broker, err := rabbitmq.New(ctx, rabbitmq.Config{URL: cfg.AMQPURL, Namespace: cfg.Namespace, Logger: cfg.Logger})
	if err != nil {
		return err
	}
	defer func() { _ = broker.Close() }()

	// sagabox's tables: the airline needs the messaging line (outbox,
	// inbox, barrier), the trips service the saga line too.
	if err := migrate(ctx, pool, cfg.AirlineSchema, store.LineMessaging); err != nil {
		return err
	}
	if err := migrate(ctx, pool, cfg.TripsSchema, store.LineMessaging, store.LineSaga); err != nil {
		return err
	}

	airline := &Airline{Schema: cfg.AirlineSchema}
	if err := airline.Setup(ctx, pool); err != nil {
		return err
	}
	airlineClient, err := participant.NewClient(participant.Config{
		Pool: pool, Schema: cfg.AirlineSchema, Service: "airline", Broker: broker, Logger: cfg.Logger,
	})
	if err != nil {
		return err
	}
	airline.Register(airlineClient)
	// The airline's Run declares its queue; declaring it now already means
	// that the first command finds it (the relay would retry it until then).
	if err := broker.Declare(ctx, airlineClient.QueueSpec()); err != nil {
		return err
	}

	tripsClient, err := orchestrator.NewClient(orchestrator.Config{
		Pool: pool, Schema: cfg.TripsSchema, Service: "trips", Broker: broker, Logger: cfg.Logger,
		Definitions: []saga.Runner{BookTrip},
	})
	if err != nil {
		return err
	}
	trips := &Trips{Schema: cfg.TripsSchema, Pool: pool, Client: tripsClient}
	if err := trips.Setup(ctx); err != nil {
		return err
	}

	// Run both clients until the trips are booked, or one of them fails.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	for _, c := range []interface{ Run(context.Context) error }{airlineClient, tripsClient} {
		wg.Go(func() {
			if err := c.Run(ctx); err != nil {
				cancel(err)
			}
		})
	}
	err = bookTrips(ctx, trips, out)
	cancel(nil)
	wg.Wait()
	if cause := context.Cause(ctx); !errors.Is(cause, context.Canceled) {
		return cause // a client stopped with an error
	}
	return err
}

// migrate applies the migrations of lines to schema. Safe to run from
// every process at start: it takes a lock and skips what is applied.
func migrate(ctx context.Context, pool *pgxpool.Pool, schema string, lines ...store.Line) error {
	st, err := store.New(pool, schema)
	if err != nil {
		return err
	}
	_, err = st.MigrateUp(ctx, lines...)
	return err
}

// bookTrips books two trips, the second paid with a card the bank
// declines, and prints how each saga ended.
func bookTrips(ctx context.Context, trips *Trips, out io.Writer) error {
	for _, trip := range []Trip{
		{ID: "trip-ada", Flight: "SB101", Card: "4242-4242-4242-4242", AmountCents: 12900},
		{ID: "trip-bob", Flight: "SB101", Card: DeclinedCard, AmountCents: 12900},
	} {
		id, err := trips.Book(ctx, trip)
		if err != nil {
			return err
		}
		waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		outcome, err := orchestrator.Await(waitCtx, trips.Client, BookTrip, id, nil)
		cancel()
		if err != nil {
			return fmt.Errorf("wait for the saga of %s: %w", trip.ID, err)
		}
		switch outcome.Status {
		case saga.StatusCompleted:
			fmt.Fprintf(out, "%s: completed: seat %s, charge %s\n", trip.ID, outcome.Data.Seat, outcome.Data.ChargeID)
		default:
			fmt.Fprintf(out, "%s: %s: %s\n", trip.ID, outcome.Status, outcome.LastError)
		}
	}
	return nil
}
