package main

import "github.com/sagabox/sagabox/saga"

// ReserveSeat asks the airline to hold a seat on a flight for a trip.
type ReserveSeat struct {
	TripID string `json:"trip_id"`
	Flight string `json:"flight"`
}

// SeatReserved is the airline's answer: the seat it holds.
type SeatReserved struct {
	Seat string `json:"seat"`
}

// ReleaseSeat gives the trip's seat back: it undoes ReserveSeat.
type ReleaseSeat struct {
	TripID string `json:"trip_id"`
}

// ChargeCard asks the airline to charge the traveller's card for the ticket.
type ChargeCard struct {
	TripID      string `json:"trip_id"`
	Card        string `json:"card"`
	AmountCents int64  `json:"amount_cents"`
}

// CardCharged is the airline's answer: the charge it made.
type CardCharged struct {
	ChargeID string `json:"charge_id"`
}

// The commands the two services agree on: a stable name, a request type
// and a reply type each (saga.None: the reply carries nothing).
var (
	Reserve = saga.NewCommand[ReserveSeat, SeatReserved]("airline.reserve-seat")
	Release = saga.NewCommand[ReleaseSeat, saga.None]("airline.release-seat")
	Charge  = saga.NewCommand[ChargeCard, CardCharged]("airline.charge-card")
)
