package saga_test

import (
	"context"
	"errors"
	"time"

	"github.com/sagabox/sagabox/saga"
)

// The checkout fixture: four command steps, the third without a
// compensation, plus commands used by local-step variants.

type Order struct {
	ID            string   `json:"id"`
	Amount        int      `json:"amount"`
	Gift          bool     `json:"gift,omitempty"`
	ReservationID string   `json:"reservation_id,omitempty"`
	PaymentID     string   `json:"payment_id,omitempty"`
	ShipmentID    string   `json:"shipment_id,omitempty"`
	Notes         []string `json:"notes,omitempty"`
}

type ReserveReq struct {
	OrderID string `json:"order_id"`
}

type ReserveReply struct {
	ReservationID string `json:"reservation_id"`
}

type ReleaseReq struct {
	ReservationID string `json:"reservation_id"`
}

type ChargeReq struct {
	OrderID string `json:"order_id"`
	Amount  int    `json:"amount"`
}

type ChargeReply struct {
	PaymentID string `json:"payment_id"`
}

type RefundReq struct {
	PaymentID string `json:"payment_id"`
}

type NotifyReq struct {
	OrderID string `json:"order_id"`
}

type ShipReq struct {
	OrderID string `json:"order_id"`
}

type ShipReply struct {
	ShipmentID string `json:"shipment_id"`
}

type CancelShipReq struct {
	ShipmentID string `json:"shipment_id"`
}

var (
	reserve    = saga.NewCommand[ReserveReq, ReserveReply]("inventory.reserve")
	release    = saga.NewCommand[ReleaseReq, saga.None]("inventory.release")
	charge     = saga.NewCommand[ChargeReq, ChargeReply]("payment.charge")
	refund     = saga.NewCommand[RefundReq, saga.None]("payment.refund")
	notify     = saga.NewCommand[NotifyReq, saga.None]("mail.notify")
	ship       = saga.NewCommand[ShipReq, ShipReply]("shipping.ship")
	cancelShip = saga.NewCommand[CancelShipReq, saga.None]("shipping.cancel")
)

const (
	reserveTimeout = 30 * time.Second
	chargeTimeout  = 10 * time.Second
)

func reserveStep(opts ...saga.StepOption[Order]) *saga.StepSpec[Order] {
	base := []saga.StepOption[Order]{
		saga.Invoke(reserve,
			func(d *Order) ReserveReq { return ReserveReq{OrderID: d.ID} },
			func(d *Order, r ReserveReply) { d.ReservationID = r.ReservationID }),
		saga.Compensate(release, func(d *Order) ReleaseReq { return ReleaseReq{ReservationID: d.ReservationID} }),
		saga.WithTimeout[Order](reserveTimeout),
		saga.WithRetry[Order](saga.RetryPolicy{MaxAttempts: 3, InitialInterval: time.Second}),
	}
	return saga.Step("reserve-stock", append(base, opts...)...)
}

func chargeStep(opts ...saga.StepOption[Order]) *saga.StepSpec[Order] {
	base := []saga.StepOption[Order]{
		saga.Invoke(charge,
			func(d *Order) ChargeReq { return ChargeReq{OrderID: d.ID, Amount: d.Amount} },
			func(d *Order, r ChargeReply) { d.PaymentID = r.PaymentID }),
		saga.Compensate(refund, func(d *Order) RefundReq { return RefundReq{PaymentID: d.PaymentID} }),
		saga.WithTimeout[Order](chargeTimeout),
	}
	return saga.Step("charge-card", append(base, opts...)...)
}

func notifyStep() *saga.StepSpec[Order] {
	return saga.Step("notify-customer",
		saga.Invoke(notify, func(d *Order) NotifyReq { return NotifyReq{OrderID: d.ID} }, nil),
	)
}

func shipStep(opts ...saga.StepOption[Order]) *saga.StepSpec[Order] {
	base := []saga.StepOption[Order]{
		saga.Invoke(ship,
			func(d *Order) ShipReq { return ShipReq{OrderID: d.ID} },
			func(d *Order, r ShipReply) { d.ShipmentID = r.ShipmentID }),
		saga.Compensate(cancelShip, func(d *Order) CancelShipReq { return CancelShipReq{ShipmentID: d.ShipmentID} }),
	}
	return saga.Step("ship", append(base, opts...)...)
}

// checkout is the four-step fixture: reserve-stock (release), charge-card
// (refund), notify-customer (no compensation), ship (cancel).
var checkout = saga.MustNew("checkout", 1, reserveStep(), chargeStep(), notifyStep(), shipStep())

var errOutOfPaper = errors.New("printer out of paper")

// note is a local step that appends to Notes, or rejects when the order is
// for 0, or fails transiently when the amount is negative.
func note(text string) func(ctx context.Context, d *Order) error {
	return func(_ context.Context, d *Order) error {
		d.Notes = append(d.Notes, text)
		switch {
		case d.Amount == 0:
			return saga.Reject(errors.New("nothing to pay"))
		case d.Amount < 0:
			return errOutOfPaper
		}
		return nil
	}
}
