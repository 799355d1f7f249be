package main

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sagabox/sagabox/examples/checkout/contract"
	"github.com/sagabox/sagabox/examples/checkout/inventory"
	"github.com/sagabox/sagabox/examples/checkout/orders"
	"github.com/sagabox/sagabox/examples/checkout/payment"
)

// outcome is what a planned order is expected to end as.
type outcome int

const (
	expectCompleted outcome = iota
	expectNoStock           // inventory rejects: nothing to undo
	expectNoFunds           // payment rejects: the reservation is released
	// expectUnconfirmed: the provider never confirms the charge; the wait
	// times out and the charge is refunded, the reservation released.
	expectUnconfirmed
	// expectUndeliverable: shipping rejects the address; the points
	// awarded beside it are revoked, the charge refunded, the reservation
	// released.
	expectUndeliverable
)

// plan is the run's orders and the stock and accounts they need. Every
// process of a run computes the same plan from the run id, so services
// started separately seed exactly what the orders process will ask for.
type plan struct {
	runID    string
	orders   []orders.Order
	expected []outcome
	// widget is the stock every successful (and every payment-rejected)
	// order reserves from; soldOut has none.
	widget, soldOut   string
	widgetStock       int
	rich, broke       string
	richBalanceCents  int64
	completedExpected int
	// held is the customer whose charges the provider never confirms;
	// heldBalanceCents pays exactly for their orders (all refunded).
	held             string
	heldBalanceCents int64
	unconfirmed      int
}

func newPlan(runID string, n int, failRate float64) *plan {
	h := fnv.New64a()
	_, _ = h.Write([]byte(runID))
	rng := rand.New(rand.NewPCG(h.Sum64(), 42))
	p := &plan{
		runID:   runID,
		widget:  "widget-" + runID,
		soldOut: "gadget-" + runID,
		rich:    "alice-" + runID,
		broke:   "bob-" + runID,
		held:    "carol-" + runID,
	}
	// Exactly the planned share of the orders fails (rounded), at places
	// the run's seed picks: a small run with a failure rate has failures.
	fail := make(map[int]bool)
	for _, i := range rng.Perm(n)[:int(math.Round(float64(n)*failRate))] {
		fail[i] = true
	}
	failures := 0
	for i := range n {
		o := orders.Order{
			ID:          fmt.Sprintf("order-%s-%03d", runID, i),
			Customer:    p.rich,
			SKU:         p.widget,
			Qty:         1 + rng.IntN(3),
			AmountCents: int64(500 + 100*rng.IntN(50)),
			Address:     fmt.Sprintf("%d Saga Street", 1+rng.IntN(999)),
		}
		want := expectCompleted
		if fail[i] {
			// Take the four kinds of failure in turn.
			switch failures % 4 {
			case 0:
				want, o.Customer = expectNoFunds, p.broke
			case 1:
				want, o.SKU = expectNoStock, p.soldOut
			case 2:
				want, o.Customer = expectUnconfirmed, p.held
				p.heldBalanceCents += o.AmountCents
				p.unconfirmed++
			default:
				want, o.Address = expectUndeliverable, contract.Undeliverable
				p.richBalanceCents += o.AmountCents // charged, then refunded
			}
			failures++
		}
		if o.SKU == p.widget {
			p.widgetStock += o.Qty
		}
		if want == expectCompleted {
			p.richBalanceCents += o.AmountCents
			p.completedExpected++
		}
		p.orders = append(p.orders, o)
		p.expected = append(p.expected, want)
	}
	return p
}

// seedInventory stocks exactly what the plan's orders reserve.
func (p *plan) seedInventory(ctx context.Context, pool *pgxpool.Pool, s *inventory.Service) error {
	if err := s.Stock(ctx, pool, p.widget, p.widgetStock); err != nil {
		return fmt.Errorf("seed inventory: %w", err)
	}
	if err := s.Stock(ctx, pool, p.soldOut, 0); err != nil {
		return fmt.Errorf("seed inventory: %w", err)
	}
	return nil
}

// seedPayment funds exactly the orders that are charged: those meant to
// succeed, those shipping rejects, and those whose charges the provider
// never confirms (on an account on hold); the last two are refunded.
func (p *plan) seedPayment(ctx context.Context, pool *pgxpool.Pool, s *payment.Service) error {
	if err := s.Account(ctx, pool, p.rich, p.richBalanceCents); err != nil {
		return fmt.Errorf("seed payment: %w", err)
	}
	if err := s.Account(ctx, pool, p.broke, 0); err != nil {
		return fmt.Errorf("seed payment: %w", err)
	}
	if err := s.Account(ctx, pool, p.held, p.heldBalanceCents); err != nil {
		return fmt.Errorf("seed payment: %w", err)
	}
	if err := s.HoldConfirmations(ctx, pool, p.held); err != nil {
		return fmt.Errorf("seed payment: %w", err)
	}
	return nil
}
