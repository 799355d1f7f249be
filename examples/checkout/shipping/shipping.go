// Package shipping is the checkout example's shipping service: it creates a
// shipment for an order (rejecting an address it cannot deliver to), and
// cancels it when the checkout is compensated after all (loyalty, which runs
// beside it, timed out).
package shipping

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sagabox/sagabox/examples/checkout/contract"
	"github.com/sagabox/sagabox/participant"
)

// Service is the shipping service, whose tables live in one schema.
type Service struct {
	schema string
}

// New returns the service for schema (its sagabox tables and its business
// tables share it).
func New(schema string) *Service { return &Service{schema: schema} }

// Schema returns the service's schema.
func (s *Service) Schema() string { return s.schema }

// sql writes the schema into query, where "shipping." names a table.
func (s *Service) sql(query string) string {
	return strings.ReplaceAll(query, "shipping.", pgx.Identifier{s.schema}.Sanitize()+".")
}

// Setup creates the service's business tables if they do not exist. The
// schema itself is created by the sagabox migrations, which run first.
func (s *Service) Setup(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, s.sql(`
		CREATE TABLE IF NOT EXISTS shipping.shipment (
			order_id        text PRIMARY KEY,
			address         text NOT NULL,
			tracking_number text NOT NULL,
			created_at      timestamptz NOT NULL DEFAULT now()
		);
		ALTER TABLE shipping.shipment ADD COLUMN IF NOT EXISTS cancelled boolean NOT NULL DEFAULT false;`))
	if err != nil {
		return fmt.Errorf("shipping: create tables: %w", err)
	}
	return nil
}

// Register installs the service's handlers on c.
func (s *Service) Register(c *participant.Client) {
	participant.HandleCommand(c, contract.Ship, s.ship)
	participant.HandleCompensation(c, contract.Unship, s.cancel)
}

func (s *Service) ship(ctx context.Context, tx pgx.Tx, req *participant.Request[contract.CreateShipment]) (contract.ShipmentCreated, error) {
	if req.Data.Address == contract.Undeliverable {
		return contract.ShipmentCreated{}, participant.RejectWithCode("undeliverable",
			fmt.Errorf("cannot deliver order %s to %q", req.Data.OrderID, req.Data.Address))
	}
	tracking := "TRK-" + req.Data.OrderID
	if _, err := tx.Exec(ctx, s.sql(`INSERT INTO shipping.shipment (order_id, address, tracking_number) VALUES ($1, $2, $3)`),
		req.Data.OrderID, req.Data.Address, tracking); err != nil {
		return contract.ShipmentCreated{}, err
	}
	return contract.ShipmentCreated{TrackingNumber: tracking}, nil
}

func (s *Service) cancel(ctx context.Context, tx pgx.Tx, req *participant.Request[contract.CancelShipment]) error {
	_, err := tx.Exec(ctx, s.sql(`UPDATE shipping.shipment SET cancelled = true WHERE order_id = $1`), req.Data.OrderID)
	return err
}
