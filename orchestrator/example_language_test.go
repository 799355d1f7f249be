package orchestrator_test

import (
	"context"
	"log"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
)

// PaymentConfirmation is the payload of the payment provider's webhook.
type PaymentConfirmation struct {
	Ref string `json:"ref"`
}

// Confirmed is the outside event a checkout waits for.
var Confirmed = saga.NewEventType[PaymentConfirmation]("payment.confirmed")

// This example waits for the outcome of a saga started earlier: it returns
// once the saga is completed, compensated or failed, with its typed data.
func ExampleAwait() {
	var client *orchestrator.Client // running, with CheckoutSaga registered
	var id uuid.UUID                // from orchestrator.Start, after the commit
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := orchestrator.Await(ctx, client, CheckoutSaga, id, nil)
	if err != nil {
		log.Fatal(err) // ctx ended first, or no such saga
	}
	log.Printf("order %s: %s %s", out.Data.OrderID, out.Status, out.LastError)
}

// This example delivers the payment provider's webhook to the saga of the
// order it confirms, in the transaction that records the webhook: both
// commit or neither does, and a webhook delivered twice (same event id)
// has no second effect.
func ExampleSendEvent() {
	var client *orchestrator.Client
	var pool *pgxpool.Pool
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO shop.webhooks (id, order_id) VALUES ($1, $2)`, "evt_123", "o-1"); err != nil {
		log.Fatal(err)
	}
	sent, err := orchestrator.SendEvent(ctx, client, tx, orchestrator.SagaRef{Type: "checkout", StartKey: "o-1"},
		Confirmed, "evt_123", PaymentConfirmation{Ref: "pay_9"})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
	client.Wake()
	log.Printf("event %s for saga %s", sent.Outcome, sent.SagaID)
}
