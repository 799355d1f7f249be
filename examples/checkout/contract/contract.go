// Package contract holds what the checkout services agree on: the command
// contracts of each step and the saga's data. The orchestrator (orders) and
// each participant import it; nothing else is shared between them.
package contract

import (
	"time"

	"github.com/sagabox/sagabox/saga"
)

// ReserveStock asks inventory to set stock aside for an order.
type ReserveStock struct {
	OrderID string `json:"order_id"`
	SKU     string `json:"sku"`
	Qty     int    `json:"qty"`
}

// StockReserved is inventory's answer.
type StockReserved struct {
	ReservationID string `json:"reservation_id"`
}

// ReleaseStock undoes ReserveStock.
type ReleaseStock struct {
	OrderID string `json:"order_id"`
}

// ChargePayment asks payment to charge a customer.
type ChargePayment struct {
	OrderID     string `json:"order_id"`
	Customer    string `json:"customer"`
	AmountCents int64  `json:"amount_cents"`
}

// PaymentCharged is payment's answer.
type PaymentCharged struct {
	ChargeID string `json:"charge_id"`
}

// RefundPayment undoes ChargePayment.
type RefundPayment struct {
	OrderID string `json:"order_id"`
}

// CreateShipment asks shipping to ship an order.
type CreateShipment struct {
	OrderID string `json:"order_id"`
	Address string `json:"address"`
}

// ShipmentCreated is shipping's answer.
type ShipmentCreated struct {
	TrackingNumber string `json:"tracking_number"`
}

// CancelShipment undoes CreateShipment.
type CancelShipment struct {
	OrderID string `json:"order_id"`
}

// Undeliverable is the address shipping cannot deliver to: an order
// shipped there is rejected by shipping.
const Undeliverable = "0 Nowhere Lane"

// PaymentConfirmed is the outside event the checkout saga waits for after
// the charge: the payment provider confirms the charge asynchronously, by a
// webhook the orders service turns into this event (orchestrator.SendEvent).
type PaymentConfirmed struct {
	ChargeID    string    `json:"charge_id"`
	ConfirmedAt time.Time `json:"confirmed_at"`
}

// AwardPoints asks loyalty to award a customer points for an order.
type AwardPoints struct {
	OrderID  string `json:"order_id"`
	Customer string `json:"customer"`
	Points   int64  `json:"points"`
}

// PointsAwarded is loyalty's answer: the award and the customer's balance
// after it.
type PointsAwarded struct {
	AwardID string `json:"award_id"`
	Balance int64  `json:"balance"`
}

// RevokePoints undoes AwardPoints.
type RevokePoints struct {
	OrderID string `json:"order_id"`
}

// PointsFor is the loyalty points an order of amountCents earns: one per
// whole currency unit.
func PointsFor(amountCents int64) int64 { return amountCents / 100 }

// ProviderWebhook is the body of the payment provider's webhook call, which
// tells the orders service that a charge is confirmed. It is the outside
// provider's API, not a sagabox message: the provider may deliver one call
// more than once, always with the same ID.
type ProviderWebhook struct {
	// ID is the provider's event id, the same on every delivery.
	ID string `json:"id"`
	// Type is "charge.confirmed".
	Type string `json:"type"`
	// ChargeID is the confirmed charge (PaymentCharged.ChargeID).
	ChargeID string `json:"charge_id"`
	// Reference is what the charge was made for: the order id.
	Reference   string    `json:"reference"`
	ConfirmedAt time.Time `json:"confirmed_at"`
}

// WebhookChargeConfirmed is the ProviderWebhook type of a confirmation.
const WebhookChargeConfirmed = "charge.confirmed"

// Confirmed is the contract of the payment provider's confirmation.
var Confirmed = saga.NewEventType[PaymentConfirmed]("payment.confirmed")

// The commands of the checkout saga, by stable name.
var (
	Reserve = saga.NewCommand[ReserveStock, StockReserved]("inventory.reserve")
	Release = saga.NewCommand[ReleaseStock, saga.None]("inventory.release")
	Charge  = saga.NewCommand[ChargePayment, PaymentCharged]("payment.charge")
	Refund  = saga.NewCommand[RefundPayment, saga.None]("payment.refund")
	Ship    = saga.NewCommand[CreateShipment, ShipmentCreated]("shipping.create")
	Unship  = saga.NewCommand[CancelShipment, saga.None]("shipping.cancel")
	Award   = saga.NewCommand[AwardPoints, PointsAwarded]("loyalty.award")
	Revoke  = saga.NewCommand[RevokePoints, saga.None]("loyalty.revoke")
)

// Service names: each is a queue and a database schema.
const (
	ServiceOrders    = "orders"
	ServiceInventory = "inventory"
	ServicePayment   = "payment"
	ServiceShipping  = "shipping"
	ServiceLoyalty   = "loyalty"
)
