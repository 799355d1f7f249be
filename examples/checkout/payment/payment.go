// Package payment is the checkout example's payment service: it charges
// customers' accounts (rejecting when funds are insufficient) and refunds
// charges when a checkout is compensated.
package payment

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sagabox/sagabox/examples/checkout/contract"
	"github.com/sagabox/sagabox/participant"
)

// Service is the payment service, whose tables live in one schema.
type Service struct {
	schema string
}

// New returns the service for schema (its sagabox tables and its business
// tables share it).
func New(schema string) *Service { return &Service{schema: schema} }

// Schema returns the service's schema.
func (s *Service) Schema() string { return s.schema }

// sql writes the schema into query, where "payment." names a table.
func (s *Service) sql(query string) string {
	return strings.ReplaceAll(query, "payment.", pgx.Identifier{s.schema}.Sanitize()+".")
}

// Setup creates the service's business tables if they do not exist. The
// schema itself is created by the sagabox migrations, which run first.
func (s *Service) Setup(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, s.sql(`
		CREATE TABLE IF NOT EXISTS payment.account (
			customer      text PRIMARY KEY,
			balance_cents bigint NOT NULL CHECK (balance_cents >= 0)
		);
		CREATE TABLE IF NOT EXISTS payment.charge (
			order_id     text PRIMARY KEY,
			customer     text NOT NULL REFERENCES payment.account (customer),
			amount_cents bigint NOT NULL,
			refunded     boolean NOT NULL DEFAULT false
		);`))
	if err != nil {
		return fmt.Errorf("payment: create tables: %w", err)
	}
	return nil
}

// Account opens a customer's account with a balance, unless it already
// exists (a restarted service must not undo the charges made since).
func (s *Service) Account(ctx context.Context, pool *pgxpool.Pool, customer string, balanceCents int64) error {
	_, err := pool.Exec(ctx, s.sql(`INSERT INTO payment.account (customer, balance_cents) VALUES ($1, $2)
		ON CONFLICT (customer) DO NOTHING`), customer, balanceCents)
	return err
}

// Register installs the service's handlers on c.
func (s *Service) Register(c *participant.Client) {
	participant.HandleCommand(c, contract.Charge, s.charge)
	participant.HandleCompensation(c, contract.Refund, s.refund)
}

func (s *Service) charge(ctx context.Context, tx pgx.Tx, req *participant.Request[contract.ChargePayment]) (contract.PaymentCharged, error) {
	tag, err := tx.Exec(ctx, s.sql(`UPDATE payment.account SET balance_cents = balance_cents - $2
		WHERE customer = $1 AND balance_cents >= $2`), req.Data.Customer, req.Data.AmountCents)
	if err != nil {
		return contract.PaymentCharged{}, err
	}
	if tag.RowsAffected() == 0 {
		return contract.PaymentCharged{}, participant.RejectWithCode("insufficient_funds",
			fmt.Errorf("customer %s cannot pay %d cents", req.Data.Customer, req.Data.AmountCents))
	}
	if _, err := tx.Exec(ctx, s.sql(`INSERT INTO payment.charge (order_id, customer, amount_cents) VALUES ($1, $2, $3)`),
		req.Data.OrderID, req.Data.Customer, req.Data.AmountCents); err != nil {
		return contract.PaymentCharged{}, err
	}
	return contract.PaymentCharged{ChargeID: "ch-" + req.Data.OrderID}, nil
}

func (s *Service) refund(ctx context.Context, tx pgx.Tx, req *participant.Request[contract.RefundPayment]) error {
	var customer string
	var amount int64
	err := tx.QueryRow(ctx, s.sql(`UPDATE payment.charge SET refunded = true
		WHERE order_id = $1 AND NOT refunded RETURNING customer, amount_cents`), req.Data.OrderID).Scan(&customer, &amount)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // nothing charged for this order
	}
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, s.sql(`UPDATE payment.account SET balance_cents = balance_cents + $2 WHERE customer = $1`), customer, amount)
	return err
}
