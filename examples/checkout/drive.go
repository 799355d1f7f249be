package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/sagabox/sagabox/examples/checkout/contract"
	"github.com/sagabox/sagabox/examples/checkout/orders"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store"
)

// tally counts sagas by status.
type tally struct {
	completed, compensated, failed, running int
}

func (t tally) terminal() int { return t.completed + t.compensated + t.failed }

// drive places the plan's orders, waits for their sagas to end, and prints
// the summary, two timelines and the invariant check.
func (a *app) drive(ctx context.Context, orch *orchestrator.Client, p *plan, errs <-chan error) error {
	fmt.Fprintf(a.out, "checkout: run %s: placing %d orders (%d should complete, %d should be compensated, %d of them after waiting %s for a payment confirmation that never comes)\n",
		p.runID, len(p.orders), p.completedExpected, len(p.orders)-p.completedExpected, p.unconfirmed, a.orders.ConfirmTimeout())
	start := time.Now()
	ids, err := a.place(ctx, orch, p)
	if err != nil {
		return err
	}
	if d := time.Since(start); len(ids) > 0 {
		fmt.Fprintf(a.out, "checkout: placed %d orders in %s (%.0f/s)\n", len(ids), d.Round(time.Millisecond), float64(len(ids))/d.Seconds())
	}

	status := make([]saga.Status, len(ids))
	deadline := time.NewTimer(a.o.timeout)
	defer deadline.Stop()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	lastPrint := time.Time{}
	var t tally
	for {
		err := a.retryTransient(ctx, "read the sagas", func(ctx context.Context) error {
			var err error
			t, err = a.refresh(ctx, orch, ids, status)
			return err
		})
		if err != nil {
			return err
		}
		done := t.terminal() == len(ids)
		if done || time.Since(lastPrint) >= time.Second {
			fmt.Fprintf(a.out, "progress: %d/%d done (%d completed, %d compensated, %d failed) after %s\n",
				t.terminal(), len(ids), t.completed, t.compensated, t.failed, time.Since(start).Round(10*time.Millisecond))
			lastPrint = time.Now()
		}
		if done {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-errs:
			return err
		case <-deadline.C:
			fmt.Fprintf(a.out, "checkout: gave up waiting after %s\n", a.o.timeout)
			a.summary(t, len(ids))
			return fmt.Errorf("%d sagas still running after %s", t.running, a.o.timeout)
		case <-tick.C:
		}
	}
	a.summary(t, len(ids))
	if err := a.retryTransient(ctx, "read flow control figures", func(ctx context.Context) error { return a.flow(ctx, ids) }); err != nil {
		return err
	}
	if err := a.timelines(ctx, orch, p, ids, status); err != nil {
		return err
	}
	if a.o.trace {
		for i, id := range ids {
			if status[i] == saga.StatusCompleted {
				if err := a.obs.printTrace(a.out, id); err != nil {
					return err
				}
				break
			}
		}
	}
	if t.failed > 0 {
		return fmt.Errorf("%d sagas failed; inspect them with `sagabox saga list --status failed --schema %s`", t.failed, a.orders.Schema())
	}
	var mismatched []string
	for i, want := range p.expected {
		if (want == expectCompleted) != (status[i] == saga.StatusCompleted) {
			mismatched = append(mismatched, fmt.Sprintf("%s ended %s", p.orders[i].ID, status[i]))
		}
	}
	if len(mismatched) > 0 {
		return fmt.Errorf("unexpected outcomes: %s", strings.Join(mismatched, "; "))
	}
	return a.checkInvariants(ctx, p, status)
}

// place places the plan's orders, each in a transaction of its own, from
// -placers goroutines at once, and returns their sagas' ids in plan order.
func (a *app) place(ctx context.Context, orch *orchestrator.Client, p *plan) ([]uuid.UUID, error) {
	ids := make([]uuid.UUID, len(p.orders))
	var pace <-chan time.Time
	if a.o.rate > 0 {
		t := time.NewTicker(time.Duration(float64(time.Second) / a.o.rate))
		defer t.Stop()
		pace = t.C
	}
	next := make(chan int)
	errs := make(chan error, a.o.placers)
	var wg sync.WaitGroup
	for range a.o.placers {
		wg.Go(func() {
			paced := false
			for i := range next {
				o := p.orders[i]
				// Only new orders wait for the pace (-rate): a restarted
				// orders service goes quickly over those it placed before.
				if pace != nil && paced {
					select {
					case <-ctx.Done():
						errs <- ctx.Err()
						return
					case <-pace:
					}
				}
				paced = false
				// Placing an order again is safe (its ID is the saga's start
				// key), so a placement whose outcome a database restart hid
				// is repeated.
				err := a.retryTransient(ctx, "place order "+o.ID, func(ctx context.Context) error {
					started, err := a.orders.Place(ctx, a.pool, orch, o)
					if err == nil {
						ids[i] = started.ID
						paced = !started.Existing
					}
					return err
				})
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	var err error
feed:
	for i := range p.orders {
		select {
		case next <- i:
		case err = <-errs:
			break feed
		}
	}
	close(next)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errs:
		default:
		}
	}
	return ids, err
}

// refresh reads the status of every saga not yet known to be terminal, in
// one query over the orchestrator's saga view (a stable query API), so that
// watching thousands of sagas does not load the database.
func (a *app) refresh(ctx context.Context, _ *orchestrator.Client, ids []uuid.UUID, status []saga.Status) (tally, error) {
	var open []uuid.UUID
	at := make(map[uuid.UUID]int, len(ids))
	for i, id := range ids {
		if !status[i].Terminal() {
			open = append(open, id)
			at[id] = i
		}
	}
	if len(open) > 0 {
		rows, err := a.pool.Query(ctx, a.orders.SQL(`SELECT id, status FROM orders.sagabox_saga_v WHERE id = ANY($1)`), open)
		if err != nil {
			return tally{}, fmt.Errorf("read saga statuses: %w", err)
		}
		for rows.Next() {
			var id uuid.UUID
			var st string
			if err := rows.Scan(&id, &st); err != nil {
				rows.Close()
				return tally{}, fmt.Errorf("read saga statuses: %w", err)
			}
			status[at[id]] = saga.Status(st)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return tally{}, fmt.Errorf("read saga statuses: %w", err)
		}
	}
	var t tally
	for i := range ids {
		switch status[i] {
		case saga.StatusCompleted:
			t.completed++
		case saga.StatusCompensated:
			t.compensated++
		case saga.StatusFailed:
			t.failed++
		default:
			t.running++
		}
	}
	return t, nil
}

// flow prints how the run's sagas fared under flow control: how many waited
// for admission and how long, how long they took from start to end, and how
// many step time-outs fired (those of the payment confirmation apart: some
// are planned).
func (a *app) flow(ctx context.Context, ids []uuid.UUID) error {
	var queued, timeouts, unconfirmed int
	var waitP50, waitP99, waitMax, p50, p99 float64
	err := a.pool.QueryRow(ctx, a.orders.SQL(`
		SELECT count(*) FILTER (WHERE admitted_at > created_at),
		       coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY admission_wait_seconds), 0),
		       coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY admission_wait_seconds), 0),
		       coalesce(max(admission_wait_seconds), 0),
		       coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY age_seconds), 0),
		       coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY age_seconds), 0),
		       (SELECT count(*) FROM orders.sagabox_saga_history_v WHERE saga_id = ANY($1) AND event = 'timed-out' AND step <> $2),
		       (SELECT count(*) FROM orders.sagabox_saga_history_v WHERE saga_id = ANY($1) AND event = 'timed-out' AND step = $2)
		FROM orders.sagabox_saga_v WHERE id = ANY($1)`), ids, orders.StepAwaitConfirmation).Scan(&queued, &waitP50, &waitP99, &waitMax, &p50, &p99, &timeouts, &unconfirmed)
	if err != nil {
		return fmt.Errorf("read flow control figures: %w", err)
	}
	fmt.Fprintf(a.out, "flow control: %d of %d sagas waited for admission (wait p50 %.2fs, p99 %.2fs, max %.2fs); start to end p50 %.2fs, p99 %.2fs; payment confirmations timed out: %d; step time-outs: %d\n",
		queued, len(ids), waitP50, waitP99, waitMax, p50, p99, unconfirmed, timeouts)
	return nil
}

func (a *app) summary(t tally, n int) {
	fmt.Fprintf(a.out, "checkout: %d sagas, %d completed, %d compensated, %d failed, %d still running\n",
		n, t.completed, t.compensated, t.failed, t.running)
}

// timelines prints the history of the first completed saga, the first
// compensated by a rejection of inventory or payment, the first whose
// payment confirmation timed out, and the first rejected by shipping (its
// parallel group unwound).
func (a *app) timelines(ctx context.Context, orch *orchestrator.Client, p *plan, ids []uuid.UUID, status []saga.Status) error {
	shown := map[outcome]bool{}
	for i, id := range ids {
		kind := p.expected[i]
		if kind == expectNoStock {
			kind = expectNoFunds // one timeline for both rejections
		}
		if shown[kind] || !status[i].Terminal() {
			continue
		}
		shown[kind] = true
		if err := a.timeline(ctx, orch, id, status[i]); err != nil {
			return err
		}
	}
	return nil
}

func (a *app) timeline(ctx context.Context, orch *orchestrator.Client, id uuid.UUID, status saga.Status) error {
	s, err := orch.Get(ctx, id)
	if err != nil {
		return err
	}
	data, err := a.orders.Saga.DecodeData(s.Data)
	if err != nil {
		return err
	}
	hist, err := orch.History(ctx, id)
	if err != nil {
		return err
	}
	fmt.Fprintf(a.out, "\ntimeline of a %s saga %s (order %s):\n", status, id, data.OrderID)
	fmt.Fprintf(a.out, "  %-9s  %-26s  %-20s  %s\n", "TIME", "STEP", "EVENT", "DETAIL")
	for _, h := range hist {
		step := h.Step
		if step == "" {
			step = "-"
		}
		detail := h.Detail
		if h.Attempt > 1 {
			detail = strings.TrimSpace(fmt.Sprintf("%s (attempt %d)", detail, h.Attempt))
		}
		fmt.Fprintf(a.out, "  +%-8s  %-26s  %-20s  %s\n", h.At.Sub(s.CreatedAt).Round(100*time.Microsecond), step, h.Event, detail)
	}
	return nil
}

// checkInvariants audits the business state of every service for this run's
// orders. It reads all five schemas on purpose: it is the example's auditor,
// not a service (services never read each other's tables), and it reads
// them through -audit-database-url when that is given: a role that may.
func (a *app) checkInvariants(ctx context.Context, p *plan, status []saga.Status) error {
	var completed, compensated, undeliverable []string
	completedQty := 0
	var completedAmount, completedPoints int64
	for i, o := range p.orders {
		switch status[i] {
		case saga.StatusCompleted:
			completed = append(completed, o.ID)
			completedQty += o.Qty
			completedAmount += o.AmountCents
			completedPoints += contract.PointsFor(o.AmountCents)
		case saga.StatusCompensated:
			compensated = append(compensated, o.ID)
			if p.expected[i] == expectUndeliverable {
				undeliverable = append(undeliverable, o.ID)
			}
		}
	}
	all := append(append([]string{}, completed...), compensated...)
	var problems []string
	check := func(ok bool, format string, args ...any) {
		if !ok {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	q := func(query string, args ...any) int64 {
		var n int64
		query = strings.NewReplacer(
			"{orders}", quoteIdent(a.orders.Schema()), "{inventory}", quoteIdent(a.inventory.Schema()),
			"{payment}", quoteIdent(a.payment.Schema()), "{shipping}", quoteIdent(a.shipping.Schema()),
			"{loyalty}", quoteIdent(a.loyalty.Schema()),
		).Replace(query)
		if err := a.auditor().QueryRow(ctx, query, args...).Scan(&n); err != nil {
			problems = append(problems, fmt.Sprintf("query failed: %v", err))
		}
		return n
	}

	held := q(`SELECT coalesce(sum(qty), 0) FROM {inventory}.reservation WHERE order_id = ANY($1) AND NOT released`, all)
	check(held == int64(completedQty), "stock held by reservations is %d, but completed orders bought %d", held, completedQty)
	check(q(`SELECT count(*) FROM {inventory}.reservation WHERE order_id = ANY($1) AND NOT released`, compensated) == 0,
		"a compensated order still holds stock")
	available := q(`SELECT available FROM {inventory}.stock WHERE sku = $1`, p.widget)
	check(int64(p.widgetStock)-available == int64(completedQty),
		"stock of %s went from %d to %d, but completed orders bought %d", p.widget, p.widgetStock, available, completedQty)

	charged := q(`SELECT coalesce(sum(amount_cents), 0) FROM {payment}.charge WHERE order_id = ANY($1) AND NOT refunded`, all)
	check(charged == completedAmount, "customers are charged %d cents, but completed orders cost %d", charged, completedAmount)
	check(q(`SELECT count(*) FROM {payment}.charge WHERE order_id = ANY($1) AND NOT refunded`, compensated) == 0,
		"a compensated order's charge was not refunded")

	check(q(`SELECT count(*) FROM {shipping}.shipment WHERE order_id = ANY($1) AND NOT cancelled`, completed) == int64(len(completed)),
		"not every completed order was shipped")
	check(q(`SELECT count(*) FROM {shipping}.shipment WHERE order_id = ANY($1) AND NOT cancelled`, compensated) == 0,
		"a compensated order was shipped")

	// Loyalty: the points of the completed orders are awarded, once; a
	// compensated order's points (shipping rejected it) are revoked.
	points := q(`SELECT coalesce(sum(points), 0) FROM {loyalty}.award WHERE order_id = ANY($1) AND NOT revoked`, all)
	check(points == completedPoints, "%d loyalty points awarded, but completed orders earn %d", points, completedPoints)
	check(q(`SELECT count(*) FROM {loyalty}.award WHERE order_id = ANY($1) AND NOT revoked`, completed) == int64(len(completed)),
		"not every completed order earned its points")
	check(q(`SELECT count(*) FROM {loyalty}.award WHERE order_id = ANY($1) AND NOT revoked`, compensated) == 0,
		"a compensated order kept its loyalty points")
	members := q(`SELECT coalesce(sum(points), 0) FROM {loyalty}.member WHERE customer = ANY($1)`, []string{p.rich, p.broke, p.held})
	check(members == completedPoints, "the run's customers hold %d points, but completed orders earn %d", members, completedPoints)
	revoked := q(`SELECT count(*) FROM {loyalty}.award WHERE order_id = ANY($1) AND revoked`, compensated)
	check(q(`SELECT count(*) FROM {orders}.orders WHERE id = ANY($1) AND status = 'confirmed'`, completed) == int64(len(completed)),
		"not every completed order is confirmed")
	check(q(`SELECT count(*) FROM {orders}.orders WHERE id = ANY($1) AND status = 'confirmed'`, compensated) == 0,
		"a compensated order is confirmed")

	// The provider's confirmations: one recorded per confirmed charge
	// (completed orders, and those shipping rejected after it) however often
	// its webhook came, none for another order (declined, or on hold:
	// refunded after the wait timed out), and as many recorded as the
	// provider made.
	confirmed := append(append([]string{}, completed...), undeliverable...)
	check(q(`SELECT count(*) FROM {orders}.orders WHERE id = ANY($1) AND payment_confirmations = 1`, confirmed) == int64(len(confirmed)),
		"not every completed (or undeliverable) order has exactly one payment confirmation recorded")
	check(q(`SELECT count(*) FROM {orders}.orders WHERE id = ANY($1) AND payment_confirmations > 1`, all) == 0,
		"an order has a payment confirmation recorded twice")
	check(q(`SELECT coalesce(sum(payment_confirmations), 0) FROM {orders}.orders WHERE id = ANY($1) AND NOT id = ANY($2)`, compensated, undeliverable) == 0,
		"a compensated order whose charge was never confirmed has a payment confirmation")
	made := q(`SELECT count(*) FROM {payment}.provider_webhook WHERE reference = ANY($1)`, all)
	recorded := q(`SELECT coalesce(sum(payment_confirmations), 0) FROM {orders}.orders WHERE id = ANY($1)`, all)
	check(made == recorded, "the provider confirmed %d charges, the orders service recorded %d confirmations", made, recorded)
	sends := q(`SELECT coalesce(sum(sends), 0) FROM {payment}.provider_webhook WHERE reference = ANY($1)`, all)
	early := q(`SELECT count(*) FROM {orders}.orders WHERE id = ANY($1) AND payment_event_outcome = 'kept'`, all)
	onHold := q(`SELECT balance_cents FROM {payment}.account WHERE customer = $1`, p.held)
	check(onHold == p.heldBalanceCents, "%s, whose charges are never confirmed, has %d cents, not the %d seeded", p.held, onHold, p.heldBalanceCents)

	if len(problems) > 0 {
		fmt.Fprintf(a.out, "\ninvariants: VIOLATED\n  %s\n", strings.Join(problems, "\n  "))
		return errors.New("business invariants violated")
	}
	hooks := a.orders.WebhookStats()
	fmt.Fprintf(a.out, "\npayment confirmations: the provider confirmed %d charges in %d webhook calls (%d recognised as redeliveries here); %d recorded, one per confirmed charge; %d came before their saga waited for them and were kept\n",
		made, sends, hooks.Duplicates, recorded, early)
	fmt.Fprintf(a.out, "loyalty: %d points awarded for %d completed orders; %d awards revoked for compensated orders\n",
		points, len(completed), revoked)
	fmt.Fprintf(a.out, "\ninvariants: OK (stock held = stock of completed orders = %d; every compensated order released, refunded and its points revoked; %d shipments for %d completed orders)\n",
		completedQty, len(completed), len(completed))
	return nil
}

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// retryTransient runs fn until it succeeds, ctx ends, or it fails with an
// error other than a lost or refused database connection: a database
// restart pauses the example instead of ending it. Each failure is logged.
// fn must be safe to run again after a connection lost mid-commit, whose
// outcome is unknown (placing an order is: its saga has a start key).
func (a *app) retryTransient(ctx context.Context, what string, fn func(context.Context) error) error {
	for attempt := 1; ; attempt++ {
		err := fn(ctx)
		if err == nil || ctx.Err() != nil || !connectionLost(err) {
			return err
		}
		wait := min(100*time.Millisecond<<min(attempt-1, 6), 5*time.Second)
		a.log.Warn(what+": database unreachable; retrying", "err", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// connectionLost reports whether err says the database connection was
// refused or lost. Besides store.IsConnectionError, a connection that dies
// mid-statement surfaces from pgx as the raw read error (an unexpected EOF or
// a network error); fn here does nothing but database work, so such an error
// is the database's.
func connectionLost(err error) bool {
	var netErr net.Error
	return store.IsConnectionError(err) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &netErr)
}
