// Package loyalty is the checkout example's loyalty-points service: it
// awards a customer points for an order (loyalty.award) and takes them back
// when the checkout is compensated (loyalty.revoke). It runs in parallel
// with shipping, and never says no: a member is enrolled by its first
// award. Its tables live in its own schema.
package loyalty

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

// Service is the loyalty service, whose tables live in one schema.
type Service struct {
	schema string
}

// New returns the service for schema (its sagabox tables and its business
// tables share it).
func New(schema string) *Service { return &Service{schema: schema} }

// Schema returns the service's schema.
func (s *Service) Schema() string { return s.schema }

// sql writes the schema into query, where "loyalty." names a table.
func (s *Service) sql(query string) string {
	return strings.ReplaceAll(query, "loyalty.", pgx.Identifier{s.schema}.Sanitize()+".")
}

// Setup creates the service's business tables if they do not exist. The
// schema itself is created by the sagabox migrations, which run first.
func (s *Service) Setup(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, s.sql(`
		CREATE TABLE IF NOT EXISTS loyalty.member (
			customer text PRIMARY KEY,
			points   bigint NOT NULL DEFAULT 0 CHECK (points >= 0)
		);
		CREATE TABLE IF NOT EXISTS loyalty.award (
			order_id   text PRIMARY KEY,
			customer   text NOT NULL REFERENCES loyalty.member (customer),
			points     bigint NOT NULL,
			revoked    boolean NOT NULL DEFAULT false,
			created_at timestamptz NOT NULL DEFAULT now()
		);`))
	if err != nil {
		return fmt.Errorf("loyalty: create tables: %w", err)
	}
	return nil
}

// Register installs the service's handlers on c.
func (s *Service) Register(c *participant.Client) {
	participant.HandleCommand(c, contract.Award, s.award)
	participant.HandleCompensation(c, contract.Revoke, s.revoke)
}

func (s *Service) award(ctx context.Context, tx pgx.Tx, req *participant.Request[contract.AwardPoints]) (contract.PointsAwarded, error) {
	var balance int64
	err := tx.QueryRow(ctx, s.sql(`INSERT INTO loyalty.member (customer, points) VALUES ($1, $2)
		ON CONFLICT (customer) DO UPDATE SET points = loyalty.member.points + EXCLUDED.points
		RETURNING points`), req.Data.Customer, req.Data.Points).Scan(&balance)
	if err != nil {
		return contract.PointsAwarded{}, err
	}
	if _, err := tx.Exec(ctx, s.sql(`INSERT INTO loyalty.award (order_id, customer, points) VALUES ($1, $2, $3)`),
		req.Data.OrderID, req.Data.Customer, req.Data.Points); err != nil {
		return contract.PointsAwarded{}, err
	}
	return contract.PointsAwarded{AwardID: "pts-" + req.Data.OrderID, Balance: balance}, nil
}

func (s *Service) revoke(ctx context.Context, tx pgx.Tx, req *participant.Request[contract.RevokePoints]) error {
	var customer string
	var points int64
	err := tx.QueryRow(ctx, s.sql(`UPDATE loyalty.award SET revoked = true
		WHERE order_id = $1 AND NOT revoked RETURNING customer, points`), req.Data.OrderID).Scan(&customer, &points)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // nothing awarded for this order
	}
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, s.sql(`UPDATE loyalty.member SET points = points - $2 WHERE customer = $1`), customer, points)
	return err
}
