package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sagabox/sagabox/participant"
)

// DeclinedCard is a card the airline's bank always declines.
const DeclinedCard = "4000-0000-0000-0002"

// Airline is the participant service: it holds seats and charges cards.
// Its tables live in its own schema, next to its sagabox tables.
type Airline struct {
	Schema string
}

// table returns the quoted name of one of the airline's tables.
func (a *Airline) table(name string) string {
	return pgx.Identifier{a.Schema, name}.Sanitize()
}

// Setup creates the airline's business tables.
func (a *Airline) Setup(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `
		CREATE TABLE IF NOT EXISTS `+a.table("seat")+` (
			trip_id  text PRIMARY KEY,
			flight   text NOT NULL,
			seat     text NOT NULL,
			released boolean NOT NULL DEFAULT false
		);
		CREATE TABLE IF NOT EXISTS `+a.table("charge")+` (
			trip_id      text PRIMARY KEY,
			card         text NOT NULL,
			amount_cents bigint NOT NULL
		);`)
	return err
}

// Register installs the airline's handlers on its participant client.
func (a *Airline) Register(c *participant.Client) {
	participant.HandleCommand(c, Reserve, a.reserve)
	participant.HandleCompensation(c, Release, a.release)
	participant.HandleCommand(c, Charge, a.charge)
}

// reserve holds the next free seat of the flight. It runs in tx, the
// transaction that also records the command in the inbox and writes the
// reply to the outbox: it takes effect once, however often it is delivered.
func (a *Airline) reserve(ctx context.Context, tx pgx.Tx, req *participant.Request[ReserveSeat]) (SeatReserved, error) {
	var taken int
	err := tx.QueryRow(ctx, `SELECT count(*) FROM `+a.table("seat")+` WHERE flight = $1`, req.Data.Flight).Scan(&taken)
	if err != nil {
		return SeatReserved{}, err // any error but a rejection is retried
	}
	seat := fmt.Sprintf("%dA", taken+1)
	_, err = tx.Exec(ctx, `INSERT INTO `+a.table("seat")+` (trip_id, flight, seat) VALUES ($1, $2, $3)`,
		req.Data.TripID, req.Data.Flight, seat)
	return SeatReserved{Seat: seat}, err
}

// release gives the trip's seat back.
func (a *Airline) release(ctx context.Context, tx pgx.Tx, req *participant.Request[ReleaseSeat]) error {
	_, err := tx.Exec(ctx, `UPDATE `+a.table("seat")+` SET released = true WHERE trip_id = $1`, req.Data.TripID)
	return err
}

// charge charges the card, unless the bank declines it: a business "no",
// which the saga answers by compensating the steps before this one.
func (a *Airline) charge(ctx context.Context, tx pgx.Tx, req *participant.Request[ChargeCard]) (CardCharged, error) {
	if req.Data.Card == DeclinedCard {
		return CardCharged{}, participant.Reject(errors.New("card declined"))
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+a.table("charge")+` (trip_id, card, amount_cents) VALUES ($1, $2, $3)`,
		req.Data.TripID, req.Data.Card, req.Data.AmountCents)
	return CardCharged{ChargeID: "ch-" + req.Data.TripID}, err
}
