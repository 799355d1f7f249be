package participant_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/participant"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/transport"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

type ExampleCharge struct {
	Cents int `json:"cents"`
}

type ExampleCharged struct {
	ChargeID string `json:"charge_id"`
}

var exampleCharge = saga.NewCommand[ExampleCharge, ExampleCharged]("payment.charge")

// A payment service that charges through an outside provider: the charge
// is made outside any transaction with the step's idempotency key, and
// recorded in a second transaction. The same command delivered twice calls
// the provider once. It runs against the test PostgreSQL and RabbitMQ
// (TEST_DATABASE_URL, TEST_AMQP_URL) in a schema and namespace of its own.
func ExampleHandleOutsideCommand() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// The outside provider: it counts the calls per idempotency key.
	var mu sync.Mutex
	calls := map[string]int{}
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls[r.Header.Get("Idempotency-Key")]++
		mu.Unlock()
		_ = json.NewEncoder(w).Encode(ExampleCharged{ChargeID: "ch_1"})
	}))
	defer provider.Close()

	schema := "example_outside_" + uuid.NewString()[:8]
	pool, err := pgxpool.New(ctx, dbtest.URL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	defer func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	}()
	st, err := store.New(pool, schema)
	if err != nil {
		panic(err)
	}
	if _, err := st.MigrateUp(ctx, store.LineMessaging); err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+pgx.Identifier{schema, "charge"}.Sanitize()+" (key text PRIMARY KEY, charge_id text)"); err != nil {
		panic(err)
	}
	amqpURL := os.Getenv("TEST_AMQP_URL")
	if amqpURL == "" {
		amqpURL = amqptest.DefaultURL
	}
	broker, err := rabbitmq.New(ctx, rabbitmq.Config{URL: amqpURL, Namespace: schema})
	if err != nil {
		panic(err)
	}
	defer func() { _ = amqptest.RemoveTopology(amqpURL, broker) }()
	defer func() { _ = broker.Close() }()

	c, err := participant.NewClient(participant.Config{
		Pool: pool, Schema: schema, Service: "payment", Broker: broker,
		Workers: 1, // one delivery at a time: the copy arrives after the first is recorded
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}
	participant.HandleOutsideCommand(c, exampleCharge,
		// The call: outside any transaction, with the step's key.
		func(ctx context.Context, req *participant.OutsideRequest[ExampleCharge]) (ExampleCharged, error) {
			r, err := http.NewRequestWithContext(ctx, http.MethodPost, provider.URL, nil)
			if err != nil {
				return ExampleCharged{}, err
			}
			r.Header.Set("Idempotency-Key", req.IdempotencyKey)
			resp, err := provider.Client().Do(r)
			if err != nil {
				return ExampleCharged{}, err
			}
			defer func() { _ = resp.Body.Close() }()
			var charged ExampleCharged
			return charged, json.NewDecoder(resp.Body).Decode(&charged)
		},
		// The record: the service's own writes, with the reply.
		func(ctx context.Context, tx pgx.Tx, req *participant.OutsideRequest[ExampleCharge], charged ExampleCharged) error {
			_, err := tx.Exec(ctx, "INSERT INTO "+pgx.Identifier{schema, "charge"}.Sanitize()+" VALUES ($1, $2)", req.IdempotencyKey, charged.ChargeID)
			return err
		})

	// A stand-in for the orchestrator's reply queue.
	replies := make(chan message.Message, 4)
	replySpec := transport.QueueSpec{Name: "orchestrator", Replies: true}
	if err := broker.Declare(ctx, replySpec); err != nil {
		panic(err)
	}
	if err := broker.Declare(ctx, c.QueueSpec()); err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	wg.Go(func() { _ = c.Run(runCtx) })
	wg.Go(func() {
		_ = broker.Subscribe(runCtx, replySpec, transport.HandlerFunc(func(_ context.Context, d *transport.Delivery) transport.Outcome {
			replies <- d.Message
			return transport.Ack()
		}), nil)
	})

	sagaID := uuid.New()
	cmd := message.Message{
		Envelope: message.Envelope{
			Version: message.Version, MessageID: uuid.Must(uuid.NewV7()), Type: exampleCharge.Name(),
			Kind: message.KindCommand, RoutingKey: exampleCharge.Name(), SagaID: sagaID, SagaType: "checkout",
			Step: "charge", StepIndex: 1, Attempt: 1, ReplyTo: replySpec.Name, CreatedAt: time.Now().UTC(),
		},
		Payload: []byte(`{"cents":500}`),
	}
	// The command, and then the same command again (a redelivery).
	for range 2 {
		if err := broker.Publish(ctx, cmd); err != nil {
			panic(err)
		}
	}
	reply := <-replies
	fmt.Println("reply:", reply.Kind, string(reply.Payload))
	var duplicates int
	for duplicates == 0 && ctx.Err() == nil {
		_ = pool.QueryRow(ctx, "SELECT duplicates FROM "+pgx.Identifier{schema, "sagabox_inbox"}.Sanitize()+" WHERE message_id = $1", cmd.MessageID).Scan(&duplicates)
		time.Sleep(20 * time.Millisecond)
	}
	key := participant.IdempotencyKey(sagaID, 0, "charge", message.PhaseAction)
	mu.Lock()
	fmt.Println("duplicates:", duplicates, "provider calls for the key:", calls[key])
	mu.Unlock()
	// Output:
	// reply: reply-success {"charge_id":"ch_1"}
	// duplicates: 1 provider calls for the key: 1
}
