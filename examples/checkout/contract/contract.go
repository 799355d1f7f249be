// Package contract holds what the checkout services agree on: the command
// contracts of each step and the saga's data. The orchestrator (orders) and
// each participant import it; nothing else is shared between them.
package contract

import "github.com/sagabox/sagabox/saga"

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

// The commands of the checkout saga, by stable name.
var (
	Reserve = saga.NewCommand[ReserveStock, StockReserved]("inventory.reserve")
	Release = saga.NewCommand[ReleaseStock, saga.None]("inventory.release")
	Charge  = saga.NewCommand[ChargePayment, PaymentCharged]("payment.charge")
	Refund  = saga.NewCommand[RefundPayment, saga.None]("payment.refund")
	Ship    = saga.NewCommand[CreateShipment, ShipmentCreated]("shipping.create")
)

// Service names: each is a queue and a database schema.
const (
	ServiceOrders    = "orders"
	ServiceInventory = "inventory"
	ServicePayment   = "payment"
	ServiceShipping  = "shipping"
)
