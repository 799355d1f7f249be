// Package orders is the checkout example's order service and saga
// orchestrator: it creates an order and starts the checkout saga in one
// transaction, receives the payment provider's confirmations on a webhook
// (each recorded on its order in the transaction that sends it to the saga),
// and confirms the order when the saga completes.
package orders

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sagabox/sagabox/examples/checkout/contract"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
)

// Checkout is the data of one checkout saga.
type Checkout struct {
	OrderID       string `json:"order_id"`
	Customer      string `json:"customer"`
	SKU           string `json:"sku"`
	Qty           int    `json:"qty"`
	AmountCents   int64  `json:"amount_cents"`
	Address       string `json:"address"`
	ReservationID string `json:"reservation_id,omitempty"`
	ChargeID      string `json:"charge_id,omitempty"`
	// PaymentConfirmedAt is when the provider confirmed the charge (the
	// payment.confirmed event).
	PaymentConfirmedAt time.Time `json:"payment_confirmed_at,omitzero"`
	TrackingNumber     string    `json:"tracking_number,omitempty"`
	// PointsAwardID and PointsBalance are loyalty's answer.
	PointsAwardID string `json:"points_award_id,omitempty"`
	PointsBalance int64  `json:"points_balance,omitempty"`
}

// SagaName is the checkout definition's name: with an order's id (its start
// key) it addresses the order's saga (orchestrator.SagaRef).
const SagaName = "checkout"

// DefaultConfirmTimeout is the default of Config.ConfirmTimeout.
const DefaultConfirmTimeout = 5 * time.Second

// StepAwaitConfirmation is the name of the step that waits for the
// provider's confirmation.
const StepAwaitConfirmation = "await-payment-confirmation"

// GroupFulfil is the name of the parallel group that ships the order and
// awards its loyalty points.
const GroupFulfil = "fulfil"

// Config configures the orders service.
type Config struct {
	// Schema is the schema of the service's tables (its sagabox tables and
	// its business tables share it). Required.
	Schema string
	// ConfirmTimeout is how long a checkout waits for the payment
	// provider's confirmation of its charge before it gives up and
	// compensates (refund, release). Defaults to DefaultConfirmTimeout.
	ConfirmTimeout time.Duration
}

// Service is the orders service, whose tables live in one schema.
type Service struct {
	schema         string
	confirmTimeout time.Duration
	hooks          webhookCounts
	// Saga is the checkout definition, bound to this service's tables.
	Saga *saga.Definition[Checkout]
}

// New returns the service configured by cfg.
func New(cfg Config) *Service {
	if cfg.ConfirmTimeout <= 0 {
		cfg.ConfirmTimeout = DefaultConfirmTimeout
	}
	s := &Service{schema: cfg.Schema, confirmTimeout: cfg.ConfirmTimeout}
	s.Saga = s.definition()
	return s
}

// ConfirmTimeout returns how long a checkout waits for the provider's
// confirmation.
func (s *Service) ConfirmTimeout() time.Duration { return s.confirmTimeout }

// Schema returns the service's schema.
func (s *Service) Schema() string { return s.schema }

func (s *Service) sql(query string) string { return s.SQL(query) }

// SQL returns query with the schema "orders." replaced by the service's
// schema.
func (s *Service) SQL(query string) string {
	return strings.ReplaceAll(query, "orders.", pgx.Identifier{s.schema}.Sanitize()+".")
}

// definition is the checkout saga: reserve stock, charge the customer, wait
// for the payment provider to confirm the charge, then create the shipment
// and award loyalty points side by side (the parallel group "fulfil"), then
// confirm the order locally. A rejection by
// payment releases the stock; a rejection by inventory undoes nothing; a
// confirmation that does not come in time refunds the charge and releases
// the stock; a rejection by shipping revokes the points, refunds and
// releases.
func (s *Service) definition() *saga.Definition[Checkout] {
	retry := saga.RetryPolicy{MaxAttempts: 3, InitialInterval: time.Second}
	return saga.MustNew(SagaName, 1,
		saga.Step("reserve-stock",
			saga.Invoke(contract.Reserve,
				func(d *Checkout) contract.ReserveStock {
					return contract.ReserveStock{OrderID: d.OrderID, SKU: d.SKU, Qty: d.Qty}
				},
				func(d *Checkout, r contract.StockReserved) { d.ReservationID = r.ReservationID }),
			saga.Compensate(contract.Release, func(d *Checkout) contract.ReleaseStock {
				return contract.ReleaseStock{OrderID: d.OrderID}
			}),
			saga.WithTimeout[Checkout](30*time.Second),
			saga.WithRetry[Checkout](retry),
		),
		saga.Step("charge-payment",
			saga.Invoke(contract.Charge,
				func(d *Checkout) contract.ChargePayment {
					return contract.ChargePayment{OrderID: d.OrderID, Customer: d.Customer, AmountCents: d.AmountCents}
				},
				func(d *Checkout, r contract.PaymentCharged) { d.ChargeID = r.ChargeID }),
			saga.Compensate(contract.Refund, func(d *Checkout) contract.RefundPayment {
				return contract.RefundPayment{OrderID: d.OrderID}
			}),
			saga.WithTimeout[Checkout](30*time.Second),
			saga.WithRetry[Checkout](retry),
		),
		// The provider confirms the charge later, by a webhook (Webhook);
		// a confirmation that came before the saga got here was kept and is
		// consumed at once.
		saga.WaitEvent(StepAwaitConfirmation, contract.Confirmed,
			func(d *Checkout, e contract.PaymentConfirmed) { d.PaymentConfirmedAt = e.ConfirmedAt },
			saga.WithTimeout[Checkout](s.confirmTimeout),
		),
		// Shipping and loyalty at once; their replies are applied in this
		// order when both have succeeded. A rejection of either cancels the
		// other's work (in parallel), then the earlier steps are undone.
		saga.Parallel(GroupFulfil, s.createShipment(), s.awardPoints(retry)),
		saga.LocalStep("confirm-order", func(ctx context.Context, d *Checkout) error {
			_, err := orchestrator.TxFromContext(ctx).Exec(ctx,
				s.sql(`UPDATE orders.orders SET status = 'confirmed', tracking_number = $2 WHERE id = $1`), d.OrderID, d.TrackingNumber)
			return err
		}),
	)
}

// createShipment asks shipping to ship the order; the shipment is
// cancelled if the group unwinds after it (loyalty timed out).
func (s *Service) createShipment() *saga.StepSpec[Checkout] {
	return saga.Step("create-shipment",
		saga.Invoke(contract.Ship,
			func(d *Checkout) contract.CreateShipment {
				return contract.CreateShipment{OrderID: d.OrderID, Address: d.Address}
			},
			func(d *Checkout, r contract.ShipmentCreated) { d.TrackingNumber = r.TrackingNumber }),
		saga.Compensate(contract.Unship, func(d *Checkout) contract.CancelShipment {
			return contract.CancelShipment{OrderID: d.OrderID}
		}),
	)
}

// awardPoints asks loyalty to award the customer points for the order,
// revoked if the group unwinds (shipping rejected the order).
func (s *Service) awardPoints(retry saga.RetryPolicy) *saga.StepSpec[Checkout] {
	return saga.Step("award-points",
		saga.Invoke(contract.Award,
			func(d *Checkout) contract.AwardPoints {
				return contract.AwardPoints{OrderID: d.OrderID, Customer: d.Customer, Points: contract.PointsFor(d.AmountCents)}
			},
			func(d *Checkout, r contract.PointsAwarded) { d.PointsAwardID, d.PointsBalance = r.AwardID, r.Balance }),
		saga.Compensate(contract.Revoke, func(d *Checkout) contract.RevokePoints {
			return contract.RevokePoints{OrderID: d.OrderID}
		}),
		saga.WithTimeout[Checkout](30*time.Second),
		saga.WithRetry[Checkout](retry),
	)
}

// Setup creates the service's business tables if they do not exist. The
// schema itself is created by the sagabox migrations, which run first.
func (s *Service) Setup(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, s.sql(`
		CREATE TABLE IF NOT EXISTS orders.orders (
			id              text PRIMARY KEY,
			customer        text NOT NULL,
			sku             text NOT NULL,
			qty             integer NOT NULL,
			amount_cents    bigint NOT NULL,
			address         text NOT NULL,
			status          text NOT NULL DEFAULT 'pending',
			tracking_number text,
			saga_id         uuid,
			created_at      timestamptz NOT NULL DEFAULT now()
		);
		-- The payment provider's confirmation of the order's charge, written
		-- by the webhook: how many were recorded (a redelivered webhook is
		-- recognised by its event id and records nothing), the first's event
		-- id and time, and what the saga did with it.
		ALTER TABLE orders.orders
			ADD COLUMN IF NOT EXISTS payment_confirmations integer NOT NULL DEFAULT 0,
			ADD COLUMN IF NOT EXISTS payment_event_id      text,
			ADD COLUMN IF NOT EXISTS payment_confirmed_at  timestamptz,
			ADD COLUMN IF NOT EXISTS payment_event_outcome text;`))
	if err != nil {
		return fmt.Errorf("orders: create tables: %w", err)
	}
	return nil
}

// Order is what a customer asks for.
type Order struct {
	ID          string
	Customer    string
	SKU         string
	Qty         int
	AmountCents int64
	Address     string
}

// Place creates the order and starts its checkout saga in one transaction:
// either both exist or neither does. Placing an order again (same ID) starts
// nothing new and returns the saga of the first placement.
func (s *Service) Place(ctx context.Context, pool *pgxpool.Pool, c *orchestrator.Client, o Order) (*orchestrator.Started, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("place order %s: %w", o.ID, err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, s.sql(`INSERT INTO orders.orders (id, customer, sku, qty, amount_cents, address)
		VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (id) DO NOTHING`),
		o.ID, o.Customer, o.SKU, o.Qty, o.AmountCents, o.Address); err != nil {
		return nil, fmt.Errorf("place order %s: %w", o.ID, err)
	}
	started, err := orchestrator.Start(ctx, c, tx, s.Saga, Checkout{
		OrderID: o.ID, Customer: o.Customer, SKU: o.SKU, Qty: o.Qty, AmountCents: o.AmountCents, Address: o.Address,
	}, &orchestrator.StartOpts{StartKey: o.ID})
	if err != nil {
		return nil, fmt.Errorf("start checkout of order %s: %w", o.ID, err)
	}
	if _, err := tx.Exec(ctx, s.sql(`UPDATE orders.orders SET saga_id = $2 WHERE id = $1`), o.ID, started.ID); err != nil {
		return nil, fmt.Errorf("place order %s: %w", o.ID, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("place order %s: commit: %w", o.ID, err)
	}
	c.Wake()
	return started, nil
}
