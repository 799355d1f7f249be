// Package inventory is the checkout example's stock service: it reserves
// stock for orders and releases it when a checkout is compensated. Its tables
// live in its own schema; it sees nothing of the other services.
package inventory

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

// Service is the inventory service, whose tables live in one schema.
type Service struct {
	schema string
}

// New returns the service for schema (its sagabox tables and its business
// tables share it).
func New(schema string) *Service { return &Service{schema: schema} }

// Schema returns the service's schema.
func (s *Service) Schema() string { return s.schema }

// sql writes the schema into query, where "inventory." names a table.
func (s *Service) sql(query string) string {
	return strings.ReplaceAll(query, "inventory.", pgx.Identifier{s.schema}.Sanitize()+".")
}

// Setup creates the service's business tables if they do not exist. The
// schema itself is created by the sagabox migrations, which run first.
func (s *Service) Setup(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, s.sql(`
		CREATE TABLE IF NOT EXISTS inventory.stock (
			sku       text PRIMARY KEY,
			available integer NOT NULL CHECK (available >= 0)
		);
		CREATE TABLE IF NOT EXISTS inventory.reservation (
			order_id  text PRIMARY KEY,
			sku       text NOT NULL REFERENCES inventory.stock (sku),
			qty       integer NOT NULL,
			released  boolean NOT NULL DEFAULT false
		);`))
	if err != nil {
		return fmt.Errorf("inventory: create tables: %w", err)
	}
	return nil
}

// Stock adds sku with an available quantity, unless it already exists (a
// restarted service must not undo the reservations made since).
func (s *Service) Stock(ctx context.Context, pool *pgxpool.Pool, sku string, available int) error {
	_, err := pool.Exec(ctx, s.sql(`INSERT INTO inventory.stock (sku, available) VALUES ($1, $2)
		ON CONFLICT (sku) DO NOTHING`), sku, available)
	return err
}

// Register installs the service's handlers on c.
func (s *Service) Register(c *participant.Client) {
	participant.HandleCommand(c, contract.Reserve, s.reserve)
	participant.HandleCompensation(c, contract.Release, s.release)
}

func (s *Service) reserve(ctx context.Context, tx pgx.Tx, req *participant.Request[contract.ReserveStock]) (contract.StockReserved, error) {
	tag, err := tx.Exec(ctx, s.sql(`UPDATE inventory.stock SET available = available - $2 WHERE sku = $1 AND available >= $2`),
		req.Data.SKU, req.Data.Qty)
	if err != nil {
		return contract.StockReserved{}, err
	}
	if tag.RowsAffected() == 0 {
		return contract.StockReserved{}, participant.RejectWithCode("out_of_stock",
			fmt.Errorf("not enough %s in stock for %d", req.Data.SKU, req.Data.Qty))
	}
	if _, err := tx.Exec(ctx, s.sql(`INSERT INTO inventory.reservation (order_id, sku, qty) VALUES ($1, $2, $3)`),
		req.Data.OrderID, req.Data.SKU, req.Data.Qty); err != nil {
		return contract.StockReserved{}, err
	}
	return contract.StockReserved{ReservationID: "res-" + req.Data.OrderID}, nil
}

func (s *Service) release(ctx context.Context, tx pgx.Tx, req *participant.Request[contract.ReleaseStock]) error {
	var sku string
	var qty int
	err := tx.QueryRow(ctx, s.sql(`UPDATE inventory.reservation SET released = true
		WHERE order_id = $1 AND NOT released RETURNING sku, qty`), req.Data.OrderID).Scan(&sku, &qty)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // nothing reserved for this order
	}
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, s.sql(`UPDATE inventory.stock SET available = available + $2 WHERE sku = $1`), sku, qty)
	return err
}
