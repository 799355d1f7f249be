package saga_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/saga/sagatest"
)

// The checkout saga of docs/dsl.md. In an application the contracts live in
// a package shared by the orchestrator and the participants.

// Checkout is the saga's data.
type Checkout struct {
	OrderID       string `json:"order_id"`
	SKU           string `json:"sku"`
	Quantity      int    `json:"quantity"`
	AmountCents   int64  `json:"amount_cents"`
	Ship          bool   `json:"ship"`
	ReservationID string `json:"reservation_id,omitempty"`
	ChargeID      string `json:"charge_id,omitempty"`
	ShipmentID    string `json:"shipment_id,omitempty"`
}

type ReserveStock struct {
	OrderID  string `json:"order_id"`
	SKU      string `json:"sku"`
	Quantity int    `json:"quantity"`
}

type StockReserved struct {
	ReservationID string `json:"reservation_id"`
}

type ReleaseStock struct {
	OrderID string `json:"order_id"`
}

type ChargeCard struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
}

type CardCharged struct {
	ChargeID string `json:"charge_id"`
}

type RefundCharge struct {
	OrderID string `json:"order_id"`
}

type CreateShipment struct {
	OrderID string `json:"order_id"`
}

type ShipmentCreated struct {
	ShipmentID string `json:"shipment_id"`
}

// The command contracts.
var (
	Reserve = saga.NewCommand[ReserveStock, StockReserved]("inventory.reserve")
	Release = saga.NewCommand[ReleaseStock, saga.None]("inventory.release")
	Charge  = saga.NewCommand[ChargeCard, CardCharged]("payment.charge")
	Refund  = saga.NewCommand[RefundCharge, saga.None]("payment.refund")
	Ship    = saga.NewCommand[CreateShipment, ShipmentCreated]("shipping.create")
)

// maxAmountCents is the limit the local step "check-limit" enforces.
const maxAmountCents = 500_00

func checkLimit(_ context.Context, c *Checkout) error {
	if c.AmountCents > maxAmountCents {
		return saga.Reject(fmt.Errorf("amount %d cents is over the limit of %d", c.AmountCents, maxAmountCents))
	}
	return nil
}

// CheckoutSaga reserves stock, charges the card and, for physical goods,
// creates a shipment. Compensations are keyed by the order id, which the
// saga knows before each action runs.
var CheckoutSaga = saga.MustNew("checkout", 1,
	saga.LocalStep("check-limit", checkLimit),
	saga.Step("reserve-stock",
		saga.Invoke(Reserve,
			func(c *Checkout) ReserveStock {
				return ReserveStock{OrderID: c.OrderID, SKU: c.SKU, Quantity: c.Quantity}
			},
			func(c *Checkout, r StockReserved) { c.ReservationID = r.ReservationID }),
		saga.Compensate(Release, func(c *Checkout) ReleaseStock { return ReleaseStock{OrderID: c.OrderID} }),
		saga.WithTimeout[Checkout](30*time.Second),
		saga.WithRetry[Checkout](saga.RetryPolicy{MaxAttempts: 3, InitialInterval: 5 * time.Second}),
		saga.WithCompensationTimeout[Checkout](time.Minute),
	),
	saga.Step("charge-card",
		saga.Invoke(Charge,
			func(c *Checkout) ChargeCard { return ChargeCard{OrderID: c.OrderID, AmountCents: c.AmountCents} },
			func(c *Checkout, r CardCharged) { c.ChargeID = r.ChargeID }),
		saga.Compensate(Refund, func(c *Checkout) RefundCharge { return RefundCharge{OrderID: c.OrderID} }),
		saga.WithTimeout[Checkout](20*time.Second),
	),
	saga.Step("create-shipment",
		saga.Invoke(Ship,
			func(c *Checkout) CreateShipment { return CreateShipment{OrderID: c.OrderID} },
			func(c *Checkout, r ShipmentCreated) { c.ShipmentID = r.ShipmentID }),
		saga.When(func(c *Checkout) bool { return c.Ship }),
		saga.WithTimeout[Checkout](time.Minute),
	),
)

// A definition describes its steps, with the retry policy's defaults
// filled in.
func ExampleNew() {
	def, err := saga.New("checkout", 1,
		saga.LocalStep("check-limit", checkLimit),
		saga.Step("reserve-stock",
			saga.Invoke(Reserve, func(c *Checkout) ReserveStock { return ReserveStock{OrderID: c.OrderID} }, nil),
			saga.Compensate(Release, func(c *Checkout) ReleaseStock { return ReleaseStock{OrderID: c.OrderID} }),
			saga.WithTimeout[Checkout](30*time.Second),
			saga.WithRetry[Checkout](saga.RetryPolicy{MaxAttempts: 3, InitialInterval: 5 * time.Second}),
		),
	)
	if err != nil {
		panic(err)
	}
	fmt.Println(def)
	for _, s := range def.Steps() {
		fmt.Printf("%s local=%t action=%q compensation=%q timeout=%s attempts=%d max-interval=%s\n",
			s.Name, s.Local, s.Action, s.Compensation, s.Timeout, s.Retry.MaxAttempts, s.Retry.MaximumInterval)
	}

	// An invalid definition reports every problem at once.
	_, err = saga.New("checkout", 1,
		saga.Step("reserve-stock",
			saga.Invoke(Reserve, func(c *Checkout) ReserveStock { return ReserveStock{} }, nil),
			saga.WithRetry[Checkout](saga.RetryPolicy{MaxAttempts: 3}),
		),
		saga.Step("reserve-stock",
			saga.Invoke(Charge, func(c *Checkout) ChargeCard { return ChargeCard{} }, nil),
			saga.Compensate(Refund, func(c *Checkout) RefundCharge { return RefundCharge{} }),
			saga.WithCompensationTimeout[Checkout](0),
		),
	)
	fmt.Println(err)
	// Output:
	// checkout v1
	// check-limit local=true action="" compensation="" timeout=0s attempts=1 max-interval=1m40s
	// reserve-stock local=false action="inventory.reserve" compensation="inventory.release" timeout=30s attempts=3 max-interval=8m20s
	// invalid saga definition: saga "checkout" v1: step "reserve-stock" (index 0): retry policy allows 3 attempts but the step has no timeout, so nothing would ever trigger a retry
	// invalid saga definition: saga "checkout" v1: step "reserve-stock" (index 1) has the same name as step 0
	// invalid saga definition: saga "checkout" v1: step "reserve-stock" (index 1): compensation timeout 0s is not positive
}

// A step whose attempts all time out is compensated, its own compensation
// first: the orchestrator cannot know whether the action ran, and the
// participant's barrier turns the compensation into a no-op if it did not.
func ExampleDefinition_Apply_timeout() {
	ctx := context.Background()
	at := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	data, _ := CheckoutSaga.EncodeData(Checkout{OrderID: "o-7", SKU: "mug", Quantity: 1, AmountCents: 12_00})
	res, err := CheckoutSaga.Start(ctx, uuid.New(), data, at)
	if err != nil {
		panic(err)
	}
	show := func(res saga.Result) {
		for _, h := range res.History {
			line := fmt.Sprintf("%-20s %-14s attempt=%d %s", h.Event, h.Step, h.Attempt, h.Detail)
			fmt.Println(strings.TrimSpace(line))
		}
		st := res.Instance.Steps[1]
		fmt.Printf("-> saga %s, reserve-stock %s\n", res.Instance.Status, st.Status)
	}
	show(res)
	// The orchestrator's sweeper delivers a timer each time the deadline
	// passes: 30s timeout, then 5s and 10s of backoff between attempts.
	for range 5 {
		at = res.Instance.Deadline
		res, err = CheckoutSaga.Apply(ctx, res.Instance, saga.Event{Kind: saga.EventTimer, At: at})
		if err != nil {
			panic(err)
		}
		show(res)
	}
	// Output:
	// started                             attempt=0 checkout v1
	// local-step-succeeded check-limit    attempt=0
	// command-sent         reserve-stock  attempt=1 inventory.reserve
	// -> saga running, reserve-stock running
	// timed-out            reserve-stock  attempt=1 30s
	// retry-scheduled      reserve-stock  attempt=2 in 5s
	// -> saga running, reserve-stock waiting-retry
	// command-sent         reserve-stock  attempt=2 inventory.reserve
	// -> saga running, reserve-stock running
	// timed-out            reserve-stock  attempt=2 30s
	// retry-scheduled      reserve-stock  attempt=3 in 10s
	// -> saga running, reserve-stock waiting-retry
	// command-sent         reserve-stock  attempt=3 inventory.reserve
	// -> saga running, reserve-stock running
	// timed-out            reserve-stock  attempt=3 30s
	// compensation-sent    reserve-stock  attempt=1 inventory.release
	// -> saga compensating, reserve-stock compensating
}

// TestCheckoutScenario is the sagatest example of docs/dsl.md.
func TestCheckoutScenario(t *testing.T) {
	s := sagatest.New(t, CheckoutSaga)
	s.Start(Checkout{OrderID: "o-1", SKU: "mug", Quantity: 2, AmountCents: 24_00, Ship: true})

	// check-limit ran at Start; reserve-stock is the first command.
	req := sagatest.ExpectCommand(s, Reserve)
	if req != (ReserveStock{OrderID: "o-1", SKU: "mug", Quantity: 2}) {
		t.Fatalf("reserve request: %+v", req)
	}
	// The first attempt gets no reply; the step is re-sent after 30s + 5s.
	s.Advance(35 * time.Second)
	sagatest.ExpectCommand(s, Reserve)
	sagatest.ReplySuccess(s, Reserve, StockReserved{ReservationID: "r-1"})

	sagatest.ExpectCommand(s, Charge)
	sagatest.ReplySuccess(s, Charge, CardCharged{ChargeID: "ch-1"})

	sagatest.ExpectCommand(s, Ship)
	s.ReplyFailure("address not deliverable")

	// Compensation runs in reverse order: refund, then release.
	if got := sagatest.ExpectCompensation(s, Refund); got.OrderID != "o-1" {
		t.Fatalf("refund request: %+v", got)
	}
	sagatest.ReplySuccess(s, Refund, saga.None{})
	sagatest.ExpectCompensation(s, Release)
	sagatest.ReplySuccess(s, Release, saga.None{})

	s.RequireStatus(saga.StatusCompensated)
	s.RequireStepStatus("create-shipment", saga.StepRejected)
	s.RequireStepStatus("charge-card", saga.StepCompensated)
	s.RequireNoMessage()
	if got := s.Instance().LastError; got != "address not deliverable" {
		t.Fatalf("last error: %q", got)
	}
	if got := s.Data().ChargeID; got != "ch-1" {
		t.Fatalf("charge id: %q", got)
	}
}

// TestCheckoutScenarioLateReply checks the late-reply rule of docs/dsl.md: a
// reply to the first attempt, arriving while the second is in flight, is
// applied; a second reply for the same step is ignored.
func TestCheckoutScenarioLateReply(t *testing.T) {
	s := sagatest.New(t, CheckoutSaga)
	s.Start(Checkout{OrderID: "o-2", SKU: "mug", Quantity: 1, AmountCents: 12_00})
	first := s.Next()
	s.Advance(35 * time.Second)
	sagatest.ExpectCommand(s, Reserve)

	sagatest.ReplySuccessTo(s, first, Reserve, StockReserved{ReservationID: "r-1"})
	s.RequireStepStatus("reserve-stock", saga.StepSucceeded)
	sagatest.ExpectCommand(s, Charge)

	res := sagatest.ReplySuccessTo(s, first, Reserve, StockReserved{ReservationID: "r-1"})
	if !res.Ignored {
		t.Fatal("duplicate reply was applied")
	}
	sagatest.ReplySuccess(s, Charge, CardCharged{ChargeID: "ch-2"})
	// Ship is false: create-shipment is skipped and the saga completes.
	s.RequireStepStatus("create-shipment", saga.StepSkipped)
	s.RequireStatus(saga.StatusCompleted)
}

// Steps that do not depend on each other run side by side in a Parallel
// group: their commands are sent together, and their replies are applied in
// the order the branches are declared once all of them have succeeded,
// whatever order they arrive in.
func ExampleParallel() {
	ctx := context.Background()
	at := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	def := saga.MustNew("checkout-parallel", 1,
		saga.Parallel("pay-and-ship",
			saga.Step("charge-card",
				saga.Invoke(Charge,
					func(c *Checkout) ChargeCard { return ChargeCard{OrderID: c.OrderID, AmountCents: c.AmountCents} },
					func(c *Checkout, r CardCharged) { c.ChargeID = r.ChargeID }),
				saga.Compensate(Refund, func(c *Checkout) RefundCharge { return RefundCharge{OrderID: c.OrderID} }),
				saga.WithTimeout[Checkout](20*time.Second)),
			saga.Step("create-shipment",
				saga.Invoke(Ship,
					func(c *Checkout) CreateShipment { return CreateShipment{OrderID: c.OrderID} },
					func(c *Checkout, r ShipmentCreated) { c.ShipmentID = r.ShipmentID }),
				saga.WithTimeout[Checkout](time.Minute)),
		),
	)
	data, _ := def.EncodeData(Checkout{OrderID: "o-8", AmountCents: 9_00})
	res, err := def.Start(ctx, uuid.New(), data, at)
	if err != nil {
		panic(err)
	}
	for _, o := range res.Emit {
		fmt.Printf("sent %s (step %d, group %s)\n", o.Type, o.StepIndex, res.Instance.Steps[o.StepIndex].Group)
	}
	reply := func(o saga.Outgoing, payload string) {
		res, err = def.Apply(ctx, res.Instance, saga.Event{
			Kind: saga.EventReplySuccess, Type: o.Type, Step: o.Step, StepIndex: o.StepIndex, Attempt: o.Attempt,
			Payload: []byte(payload), At: at,
		})
		if err != nil {
			panic(err)
		}
		d, _ := def.DecodeData(res.Instance.Data)
		fmt.Printf("%s replied: saga %s, charge %q, shipment %q\n", o.Step, res.Instance.Status, d.ChargeID, d.ShipmentID)
	}
	charge, ship := res.Emit[0], res.Emit[1]
	reply(ship, `{"shipment_id":"s-8"}`) // held until the group joins
	reply(charge, `{"charge_id":"c-8"}`)
	// Output:
	// sent payment.charge (step 0, group pay-and-ship)
	// sent shipping.create (step 1, group pay-and-ship)
	// create-shipment replied: saga running, charge "", shipment ""
	// charge-card replied: saga completed, charge "c-8", shipment "s-8"
}
