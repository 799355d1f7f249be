package sagapic_test

import (
	"context"
	"testing"
	"time"

	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/saga/sagatest"
)

// The shop saga has a step of every kind: a command with retries, a
// parallel group of two commands (one without a compensation), a wait for
// an outside event, a conditional local step and a last command.
type Order struct {
	ID       string `json:"id"`
	Gift     bool   `json:"gift,omitempty"`
	Paid     bool   `json:"paid,omitempty"`
	Reserved string `json:"reserved,omitempty"`
}

type Ref struct {
	OrderID string `json:"order_id"`
}

type Confirmed struct {
	Reference string `json:"reference"`
}

var (
	reserve = saga.NewCommand[Ref, saga.None]("inventory.reserve")
	release = saga.NewCommand[Ref, saga.None]("inventory.release")
	charge  = saga.NewCommand[Ref, saga.None]("payment.charge")
	refund  = saga.NewCommand[Ref, saga.None]("payment.refund")
	notify  = saga.NewCommand[Ref, saga.None]("mail.notify")
	ship    = saga.NewCommand[Ref, saga.None]("shipping.ship")
	unship  = saga.NewCommand[Ref, saga.None]("shipping.cancel")

	confirmed = saga.NewEventType[Confirmed]("payment.confirmed")
)

func ref(o *Order) Ref { return Ref{OrderID: o.ID} }

// shop returns the shop saga.
func shop() *saga.Definition[Order] {
	return saga.MustNew("shop", 2,
		saga.Step("reserve", saga.Invoke(reserve, ref, nil), saga.Compensate(release, ref),
			saga.WithTimeout[Order](30*time.Second), saga.WithRetry[Order](saga.RetryPolicy{MaxAttempts: 3, InitialInterval: time.Second})),
		saga.Parallel("pay-and-notify",
			saga.Step("charge", saga.Invoke(charge, ref, nil), saga.Compensate(refund, ref),
				saga.WithTimeout[Order](10*time.Second), saga.WithCompensationTimeout[Order](time.Minute)),
			saga.Step("notify", saga.Invoke(notify, ref, nil)),
		),
		saga.WaitEvent("await-confirmation", confirmed, func(o *Order, _ Confirmed) { o.Paid = true }, saga.WithTimeout[Order](time.Hour)),
		saga.LocalStep("mark-paid", func(context.Context, *Order) error { return nil }, saga.When(func(o *Order) bool { return !o.Gift })),
		saga.Step("ship", saga.Invoke(ship, ref, nil), saga.Compensate(unship, ref), saga.WithTimeout[Order](time.Minute)),
	)
}

// compensatedRun runs a shop saga to its compensation: reserve times out
// once and succeeds on its second attempt, the group's branches reply at
// different times, the event arrives, the local step runs, shipping
// rejects, and the charge and the reservation are compensated (notify has
// nothing to compensate).
func compensatedRun(t *testing.T) *sagatest.Scenario[Order] {
	t.Helper()
	s := sagatest.New(t, shop())
	s.Start(Order{ID: "o-1"})
	sagatest.ExpectCommand(s, reserve)
	s.Advance(30 * time.Second) // attempt 1 times out
	s.Advance(time.Second)      // the backoff: attempt 2
	sagatest.ExpectCommand(s, reserve)
	s.Advance(2 * time.Second)
	sagatest.ReplySuccess(s, reserve, saga.None{})
	chargeMsg, notifyMsg := next(t, s, charge.Name()), next(t, s, notify.Name())
	s.Advance(time.Second)
	sagatest.ReplySuccessTo(s, notifyMsg, notify, saga.None{})
	s.Advance(2 * time.Second)
	sagatest.ReplySuccessTo(s, chargeMsg, charge, saga.None{})
	s.Advance(10 * time.Second)
	sagatest.SendEvent(s, confirmed, "evt-1", Confirmed{Reference: "r-1"})
	sagatest.ExpectCommand(s, ship)
	s.Advance(2 * time.Second)
	s.ReplyFailure("no courier for this address")
	s.Advance(500 * time.Millisecond)
	sagatest.ExpectCompensation(s, refund)
	sagatest.ReplySuccess(s, refund, saga.None{})
	s.Advance(700 * time.Millisecond)
	sagatest.ExpectCompensation(s, release)
	sagatest.ReplySuccess(s, release, saga.None{})
	s.RequireStatus(saga.StatusCompensated)
	return s
}

// next takes the next message the scenario sent, which must be a command
// called name.
func next(t *testing.T, s *sagatest.Scenario[Order], name string) saga.Outgoing {
	t.Helper()
	msg := s.Next()
	if msg.Type != name {
		t.Fatalf("next message is %s, want %s", msg.Type, name)
	}
	return msg
}

// waitingRun runs a shop saga up to its wait for the payment's
// confirmation, and leaves it there.
func waitingRun(t *testing.T) *sagatest.Scenario[Order] {
	t.Helper()
	s := sagatest.New(t, shop())
	s.Start(Order{ID: "o-2"})
	sagatest.ExpectCommand(s, reserve)
	s.Advance(1500 * time.Millisecond)
	sagatest.ReplySuccess(s, reserve, saga.None{})
	chargeMsg, notifyMsg := next(t, s, charge.Name()), next(t, s, notify.Name())
	s.Advance(800 * time.Millisecond)
	sagatest.ReplySuccessTo(s, notifyMsg, notify, saga.None{})
	sagatest.ReplySuccessTo(s, chargeMsg, charge, saga.None{})
	s.Advance(4 * time.Second)
	s.RequireStepStatus("await-confirmation", saga.StepWaitingEvent)
	return s
}
