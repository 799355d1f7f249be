// Package payment is the checkout example's payment service: it charges
// customers through an outside payment provider (rejecting when funds are
// insufficient) and refunds charges when a checkout is compensated. Both
// call the provider outside any database transaction, with an idempotency
// key of the saga step (participant.HandleOutsideCommand). The provider
// confirms each charge later, by calling the orders service's webhook.
package payment

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sagabox/sagabox/examples/checkout/contract"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/participant"
)

// Service is the payment service, whose tables live in one schema.
type Service struct {
	schema      string
	providerURL string
	http        *http.Client
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

// Setup creates the service's business tables, and its outside provider's
// table, if they do not exist. The schema itself is created by the sagabox
// migrations, which run first.
func (s *Service) Setup(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, s.sql(`
		CREATE TABLE IF NOT EXISTS payment.account (
			customer      text PRIMARY KEY,
			balance_cents bigint NOT NULL CHECK (balance_cents >= 0)
		);
		-- false: the provider holds the account's charges for review and
		-- never confirms them (see Provider).
		ALTER TABLE payment.account ADD COLUMN IF NOT EXISTS confirms boolean NOT NULL DEFAULT true;
		CREATE TABLE IF NOT EXISTS payment.charge (
			order_id     text PRIMARY KEY,
			customer     text NOT NULL REFERENCES payment.account (customer),
			amount_cents bigint NOT NULL,
			refunded     boolean NOT NULL DEFAULT false
		);
		ALTER TABLE payment.charge ADD COLUMN IF NOT EXISTS charge_id text NOT NULL DEFAULT '';
		-- The outside provider's own record of the operations it applied,
		-- one per idempotency key (see Provider).
		CREATE TABLE IF NOT EXISTS payment.provider_op (
			key          text PRIMARY KEY,
			status       text NOT NULL,
			customer     text NOT NULL DEFAULT '',
			amount_cents bigint NOT NULL DEFAULT 0,
			charge_key   text NOT NULL DEFAULT ''
		);
		-- The provider's confirmations of charges, each delivered to the
		-- merchant's webhook until it answers (see Provider): sends counts
		-- the calls answered 2xx.
		CREATE TABLE IF NOT EXISTS payment.provider_webhook (
			event_id     text PRIMARY KEY,
			charge_id    text NOT NULL,
			reference    text NOT NULL,
			confirmed_at timestamptz NOT NULL,
			next_at      timestamptz NOT NULL,
			attempts     integer NOT NULL DEFAULT 0,
			sends        integer NOT NULL DEFAULT 0,
			delivered_at timestamptz
		);
		CREATE INDEX IF NOT EXISTS provider_webhook_due ON payment.provider_webhook (next_at) WHERE delivered_at IS NULL;`))
	if err != nil {
		return fmt.Errorf("payment: create tables: %w", err)
	}
	return nil
}

// Account opens a customer's account at the provider with a balance,
// unless it already exists (a restarted service must not undo the charges
// made since).
func (s *Service) Account(ctx context.Context, pool *pgxpool.Pool, customer string, balanceCents int64) error {
	_, err := pool.Exec(ctx, s.sql(`INSERT INTO payment.account (customer, balance_cents) VALUES ($1, $2)
		ON CONFLICT (customer) DO NOTHING`), customer, balanceCents)
	return err
}

// HoldConfirmations puts a customer's account on hold at the provider: it
// still charges it, but never confirms those charges, so that their
// checkouts time out waiting and are compensated.
func (s *Service) HoldConfirmations(ctx context.Context, pool *pgxpool.Pool, customer string) error {
	_, err := pool.Exec(ctx, s.sql(`UPDATE payment.account SET confirms = false WHERE customer = $1`), customer)
	return err
}

// UseProvider makes the service charge and refund through the outside
// provider at url (StartProvider). Call it before Register.
func (s *Service) UseProvider(url string) {
	s.providerURL = url
	s.http = &http.Client{Timeout: 10 * time.Second}
}

// Register installs the service's handlers on c. The charge and the refund
// call the outside provider (participant.HandleOutsideCommand): the inbox
// entry is committed before the call, the provider gets an idempotency key
// of the saga step, and the charge row is written after the call.
func (s *Service) Register(c *participant.Client) {
	participant.HandleOutsideCommand(c, contract.Charge, s.charge, s.recordCharge)
	participant.HandleOutsideCompensation(c, contract.Refund, s.refund, s.recordRefund)
}

// call posts body to the provider's path with the idempotency key.
func (s *Service) call(ctx context.Context, path, key string, body providerRequest) (int, providerReply, error) {
	if s.http == nil {
		return 0, providerReply{}, errors.New("payment: no provider configured (UseProvider)")
	}
	b, err := json.Marshal(body)
	if err != nil {
		return 0, providerReply{}, err
	}
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, s.providerURL+path, bytes.NewReader(b))
	if err != nil {
		return 0, providerReply{}, err
	}
	r.Header.Set("Idempotency-Key", key)
	resp, err := s.http.Do(r)
	if err != nil {
		return 0, providerReply{}, fmt.Errorf("call payment provider: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusPaymentRequired {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return resp.StatusCode, providerReply{}, fmt.Errorf("payment provider: %s: %s", resp.Status, bytes.TrimSpace(msg))
	}
	var reply providerReply
	if err := json.NewDecoder(resp.Body).Decode(&reply); err != nil {
		return resp.StatusCode, providerReply{}, fmt.Errorf("payment provider: decode answer: %w", err)
	}
	return resp.StatusCode, reply, nil
}

func (s *Service) charge(ctx context.Context, req *participant.OutsideRequest[contract.ChargePayment]) (contract.PaymentCharged, error) {
	code, reply, err := s.call(ctx, "/charge", req.IdempotencyKey, providerRequest{
		Customer: req.Data.Customer, AmountCents: req.Data.AmountCents, Reference: req.Data.OrderID,
	})
	switch {
	case err != nil:
		return contract.PaymentCharged{}, err // transient: called again, same key
	case code == http.StatusPaymentRequired:
		return contract.PaymentCharged{}, participant.RejectWithCode("insufficient_funds",
			fmt.Errorf("customer %s cannot pay %d cents", req.Data.Customer, req.Data.AmountCents))
	}
	return contract.PaymentCharged{ChargeID: reply.ID}, nil
}

// recordCharge writes the charge the provider made, with the reply.
func (s *Service) recordCharge(ctx context.Context, tx pgx.Tx, req *participant.OutsideRequest[contract.ChargePayment], charged contract.PaymentCharged) error {
	_, err := tx.Exec(ctx, s.sql(`INSERT INTO payment.charge (order_id, customer, amount_cents, charge_id) VALUES ($1, $2, $3, $4)`),
		req.Data.OrderID, req.Data.Customer, req.Data.AmountCents, charged.ChargeID)
	return err
}

// refund asks the provider to refund the step's charge, named by the
// action's idempotency key; a charge the provider never made refunds
// nothing.
func (s *Service) refund(ctx context.Context, req *participant.OutsideRequest[contract.RefundPayment]) error {
	chargeKey := participant.IdempotencyKey(req.SagaID, req.Run, req.Step, message.PhaseAction)
	_, _, err := s.call(ctx, "/refund", req.IdempotencyKey, providerRequest{ChargeKey: chargeKey})
	return err
}

func (s *Service) recordRefund(ctx context.Context, tx pgx.Tx, req *participant.OutsideRequest[contract.RefundPayment]) error {
	_, err := tx.Exec(ctx, s.sql(`UPDATE payment.charge SET refunded = true WHERE order_id = $1`), req.Data.OrderID)
	return err
}
