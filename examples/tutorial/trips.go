package main

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
)

// Trip is the saga's data: what the trip needs, and what its steps learn.
type Trip struct {
	ID          string `json:"id"`
	Flight      string `json:"flight"`
	Card        string `json:"card"`
	AmountCents int64  `json:"amount_cents"`
	Seat        string `json:"seat,omitempty"`
	ChargeID    string `json:"charge_id,omitempty"`
}

// BookTrip reserves a seat, then charges the card. If the charge is
// rejected, the seat is released: the reservation's compensation.
var BookTrip = saga.MustNew("book-trip", 1,
	saga.Step("reserve-seat",
		saga.Invoke(Reserve,
			func(t *Trip) ReserveSeat { return ReserveSeat{TripID: t.ID, Flight: t.Flight} },
			func(t *Trip, r SeatReserved) { t.Seat = r.Seat }),
		saga.Compensate(Release, func(t *Trip) ReleaseSeat { return ReleaseSeat{TripID: t.ID} }),
		saga.WithTimeout[Trip](30*time.Second)),
	saga.Step("charge-card",
		saga.Invoke(Charge,
			func(t *Trip) ChargeCard { return ChargeCard{TripID: t.ID, Card: t.Card, AmountCents: t.AmountCents} },
			func(t *Trip, r CardCharged) { t.ChargeID = r.ChargeID }),
		saga.WithTimeout[Trip](30*time.Second)),
)

// Trips is the orchestrator service: it books trips.
type Trips struct {
	Schema string
	Pool   *pgxpool.Pool
	Client *orchestrator.Client
}

// tripTable is the quoted name of the service's table of trips.
func (s *Trips) tripTable() string {
	return pgx.Identifier{s.Schema, "trip"}.Sanitize()
}

// Setup creates the trips service's business table.
func (s *Trips) Setup(ctx context.Context) error {
	_, err := s.Pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+s.tripTable()+` (
		id     text PRIMARY KEY,
		flight text NOT NULL
	)`)
	return err
}

// Book records the trip and starts its saga in one transaction: the saga
// exists, and its first command is sent, if and only if the trip is
// recorded. The trip's id is the saga's start key, so booking it again
// starts nothing and returns the saga already started.
func (s *Trips) Book(ctx context.Context, trip Trip) (uuid.UUID, error) {
	tx, err := s.Pool.Begin(ctx)
	if err != nil {
		return uuid.Nil, err
	}
	defer tx.Rollback(ctx) // a no-op once committed
	_, err = tx.Exec(ctx, `INSERT INTO `+s.tripTable()+` (id, flight) VALUES ($1, $2)
		ON CONFLICT (id) DO NOTHING`, trip.ID, trip.Flight)
	if err != nil {
		return uuid.Nil, fmt.Errorf("record trip %s: %w", trip.ID, err)
	}
	started, err := orchestrator.Start(ctx, s.Client, tx, BookTrip, trip, &orchestrator.StartOpts{StartKey: trip.ID})
	if err != nil {
		return uuid.Nil, fmt.Errorf("start saga of trip %s: %w", trip.ID, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return uuid.Nil, err
	}
	s.Client.Wake() // publish the first command now
	return started.ID, nil
}
