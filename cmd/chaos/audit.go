package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
)

// undeliverable selects the orders shipping rejects, after their charge was
// confirmed: those to the example's contract.Undeliverable address.
const undeliverable = `o.address = '0 Nowhere Lane'`

// installDuplicates makes every service's outbox write a fraction of its
// rows twice (same message id), so the relay publishes those messages twice
// and the receivers get duplicate deliveries; each copy is logged in
// public.chaos_duplicate.
func (r *runner) installDuplicates(ctx context.Context) error {
	if r.c.duplicates == 0 {
		return nil
	}
	if _, err := r.pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS public.chaos_duplicate (
		schema_name text NOT NULL, message_id uuid NOT NULL, at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return fmt.Errorf("create the duplicate log: %w", err)
	}
	for _, s := range schemas {
		rows, err := r.pool.Query(ctx, `SELECT column_name FROM information_schema.columns
			WHERE table_schema = $1 AND table_name = 'sagabox_outbox' AND column_name <> 'id' ORDER BY ordinal_position`, s)
		if err != nil {
			return fmt.Errorf("read the outbox columns of %s: %w", s, err)
		}
		cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("read the outbox columns of %s: %w", s, err)
		}
		if len(cols) == 0 {
			return fmt.Errorf("read the outbox columns of %s: no table %s.sagabox_outbox", s, s)
		}
		names := make([]string, len(cols))
		values := make([]string, len(cols))
		for i, c := range cols {
			names[i] = pgx.Identifier{c}.Sanitize()
			values[i] = "NEW." + names[i]
		}
		table := pgx.Identifier{s, "sagabox_outbox"}.Sanitize()
		fn := pgx.Identifier{"public", "chaos_duplicate_" + s}.Sanitize()
		sql := fmt.Sprintf(`
			CREATE OR REPLACE FUNCTION %[1]s() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN
				IF pg_trigger_depth() = 1 AND random() < %[2]v THEN
					INSERT INTO %[3]s (%[4]s) VALUES (%[5]s);
					INSERT INTO public.chaos_duplicate (schema_name, message_id) VALUES (%[6]s, NEW.message_id);
				END IF;
				RETURN NULL;
			END $$;
			DROP TRIGGER IF EXISTS chaos_duplicate ON %[3]s;
			CREATE TRIGGER chaos_duplicate AFTER INSERT ON %[3]s FOR EACH ROW EXECUTE FUNCTION %[1]s();`,
			fn, r.c.duplicates, table, strings.Join(names, ", "), strings.Join(values, ", "), "'"+s+"'")
		if _, err := r.pool.Exec(ctx, sql); err != nil {
			return fmt.Errorf("install the duplicating trigger on %s: %w", table, err)
		}
	}
	return nil
}

// report is the audit's result.
type report struct {
	c       *config
	drained bool
	elapsed time.Duration

	ordersPresent, sagasPresent int64
	byStatus                    map[string]int64
	plannedCompleted            int64
	plannedCompensated          int64
	mismatched                  []string

	stockStart, stockAvailable, stockHeld, stockHeldByCompleted int64
	heldByCompensated                                           int64
	moneyStart, balance, charged, chargedForCompleted           int64
	chargedForCompensated                                       int64
	shipments, shipmentsCompleted, shipmentsCompensated         int64
	confirmedCompensated, confirmedCompleted                    int64

	// The payment provider's confirmations: made (one per confirmed
	// charge), recorded by the orders service's webhook, recorded once for
	// a completed order, recorded twice, recorded for others; the webhook
	// calls answered and the confirmations left undelivered.
	paymentConfirmationsMade, paymentConfirmationsRecorded int64
	paymentConfirmedOnce, paymentConfirmedTwice            int64
	paymentConfirmedOthers, webhookSends, webhookPending   int64
	plannedUnconfirmed, plannedUndeliverable               int64

	// Loyalty points: held by the customers, earned by the completed
	// orders, awarded and kept, kept by orders that did not complete, and
	// the awards revoked.
	pointsHeld, pointsEarned, pointsAwarded, pointsKeptByOthers, pointsRevoked int64

	backlog     map[string]int64
	deadOutbox  []string
	deadInbox   []string
	deadQueues  []string
	dupInjected int64
	dupSeen     int64
	dupAll      int64
	timedOut    int64
	ignored     int64
	retried     int64
	p50, p99    time.Duration

	faults    []*fault
	resumed   []string
	unplanned []string
}

func (r *runner) audit(ctx context.Context, drained bool) (*report, error) {
	rep := &report{c: r.c, drained: drained, elapsed: time.Since(r.started), byStatus: map[string]int64{}, backlog: map[string]int64{}, faults: r.faults}
	q := func(dst *int64, sql string, args ...any) error {
		if err := r.pool.QueryRow(ctx, sql, args...).Scan(dst); err != nil {
			return fmt.Errorf("audit query %q: %w", strings.Join(strings.Fields(sql), " "), err)
		}
		return nil
	}
	// The plan, as the example builds it: orders of the broke customer are
	// rejected by payment, orders of the sold-out SKU by inventory, orders
	// of the customer on hold are charged but never confirmed (the wait
	// times out, the charge is refunded), every other order completes. The
	// stock and the money seeded are exactly what the plan needs.
	const planned = `CASE WHEN o.customer LIKE 'bob-%' OR o.customer LIKE 'carol-%' OR o.sku LIKE 'gadget-%' OR ` + undeliverable + `
		THEN 'compensated' ELSE 'completed' END`
	checks := []struct {
		dst *int64
		sql string
	}{
		{&rep.ordersPresent, `SELECT count(*) FROM orders.orders`},
		{&rep.sagasPresent, `SELECT count(*) FROM orders.sagabox_saga WHERE saga_type = 'checkout'`},
		{&rep.plannedCompleted, `SELECT count(*) FROM orders.orders o WHERE ` + planned + ` = 'completed'`},
		{&rep.plannedCompensated, `SELECT count(*) FROM orders.orders o WHERE ` + planned + ` = 'compensated'`},
		{&rep.stockStart, `SELECT coalesce(sum(qty), 0) FROM orders.orders WHERE sku LIKE 'widget-%'`},
		{&rep.stockAvailable, `SELECT coalesce(sum(available), 0) FROM inventory.stock WHERE sku LIKE 'widget-%'`},
		{&rep.stockHeld, `SELECT coalesce(sum(qty), 0) FROM inventory.reservation WHERE NOT released`},
		{&rep.stockHeldByCompleted, `SELECT coalesce(sum(r.qty), 0) FROM inventory.reservation r JOIN orders.orders o ON o.id = r.order_id
			JOIN orders.sagabox_saga s ON s.id = o.saga_id WHERE NOT r.released AND s.status = 'completed'`},
		{&rep.heldByCompensated, `SELECT count(*) FROM inventory.reservation r JOIN orders.orders o ON o.id = r.order_id
			JOIN orders.sagabox_saga s ON s.id = o.saga_id WHERE NOT r.released AND s.status <> 'completed'`},
		{&rep.moneyStart, `SELECT coalesce(sum(amount_cents), 0) FROM orders.orders o WHERE ` + planned + ` = 'completed' OR o.customer LIKE 'carol-%' OR ` + undeliverable},
		{&rep.balance, `SELECT coalesce(sum(balance_cents), 0) FROM payment.account`},
		{&rep.charged, `SELECT coalesce(sum(amount_cents), 0) FROM payment.charge WHERE NOT refunded`},
		{&rep.chargedForCompleted, `SELECT coalesce(sum(o.amount_cents), 0) FROM orders.orders o
			JOIN orders.sagabox_saga s ON s.id = o.saga_id WHERE s.status = 'completed'`},
		{&rep.chargedForCompensated, `SELECT count(*) FROM payment.charge c JOIN orders.orders o ON o.id = c.order_id
			JOIN orders.sagabox_saga s ON s.id = o.saga_id WHERE NOT c.refunded AND s.status <> 'completed'`},
		{&rep.shipments, `SELECT count(*) FROM shipping.shipment WHERE NOT cancelled`},
		{&rep.shipmentsCompleted, `SELECT count(*) FROM shipping.shipment h JOIN orders.orders o ON o.id = h.order_id
			JOIN orders.sagabox_saga s ON s.id = o.saga_id WHERE s.status = 'completed' AND NOT h.cancelled`},
		{&rep.shipmentsCompensated, `SELECT count(*) FROM shipping.shipment h JOIN orders.orders o ON o.id = h.order_id
			JOIN orders.sagabox_saga s ON s.id = o.saga_id WHERE s.status <> 'completed' AND NOT h.cancelled`},
		{&rep.pointsHeld, `SELECT coalesce(sum(points), 0) FROM loyalty.member`},
		{&rep.pointsEarned, `SELECT coalesce(sum(o.amount_cents / 100), 0) FROM orders.orders o
			JOIN orders.sagabox_saga s ON s.id = o.saga_id WHERE s.status = 'completed'`},
		{&rep.pointsAwarded, `SELECT coalesce(sum(points), 0) FROM loyalty.award WHERE NOT revoked`},
		{&rep.pointsKeptByOthers, `SELECT count(*) FROM loyalty.award a JOIN orders.orders o ON o.id = a.order_id
			JOIN orders.sagabox_saga s ON s.id = o.saga_id WHERE NOT a.revoked AND s.status <> 'completed'`},
		{&rep.pointsRevoked, `SELECT count(*) FROM loyalty.award WHERE revoked`},
		{&rep.confirmedCompleted, `SELECT count(*) FROM orders.orders o JOIN orders.sagabox_saga s ON s.id = o.saga_id
			WHERE s.status = 'completed' AND o.status = 'confirmed'`},
		{&rep.confirmedCompensated, `SELECT count(*) FROM orders.orders o JOIN orders.sagabox_saga s ON s.id = o.saga_id
			WHERE s.status <> 'completed' AND o.status = 'confirmed'`},
		{&rep.paymentConfirmationsMade, `SELECT count(*) FROM payment.provider_webhook`},
		{&rep.paymentConfirmationsRecorded, `SELECT coalesce(sum(payment_confirmations), 0) FROM orders.orders`},
		{&rep.paymentConfirmedOnce, `SELECT count(*) FROM orders.orders o JOIN orders.sagabox_saga s ON s.id = o.saga_id
			WHERE (s.status = 'completed' OR ` + undeliverable + `) AND o.payment_confirmations = 1`},
		{&rep.plannedUndeliverable, `SELECT count(*) FROM orders.orders o WHERE ` + undeliverable},
		{&rep.paymentConfirmedTwice, `SELECT count(*) FROM orders.orders WHERE payment_confirmations > 1`},
		{&rep.paymentConfirmedOthers, `SELECT count(*) FROM orders.orders o JOIN orders.sagabox_saga s ON s.id = o.saga_id
			WHERE s.status <> 'completed' AND NOT ` + undeliverable + ` AND o.payment_confirmations > 0`},
		{&rep.webhookSends, `SELECT coalesce(sum(sends), 0) FROM payment.provider_webhook`},
		{&rep.webhookPending, `SELECT count(*) FROM payment.provider_webhook WHERE delivered_at IS NULL`},
		{&rep.plannedUnconfirmed, `SELECT count(*) FROM orders.orders WHERE customer LIKE 'carol-%'`},
		{&rep.timedOut, `SELECT count(*) FROM orders.sagabox_saga_history WHERE event = 'timed-out'`},
		{&rep.ignored, `SELECT count(*) FROM orders.sagabox_saga_history WHERE event = 'reply-ignored'`},
		{&rep.retried, `SELECT count(*) FROM orders.sagabox_saga_history WHERE event = 'retry-scheduled'`},
	}
	for _, c := range checks {
		if err := q(c.dst, c.sql); err != nil {
			return nil, err
		}
	}

	rows, err := r.pool.Query(ctx, `SELECT s.status, count(*) FROM orders.sagabox_saga s GROUP BY 1`)
	if err != nil {
		return nil, fmt.Errorf("audit statuses: %w", err)
	}
	for rows.Next() {
		var st string
		var n int64
		if err := rows.Scan(&st, &n); err != nil {
			return nil, fmt.Errorf("audit statuses: %w", err)
		}
		rep.byStatus[st] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("audit statuses: %w", err)
	}

	rows, err = r.pool.Query(ctx, `SELECT o.id || ' planned ' || `+planned+` || ', ended ' || coalesce(s.status, 'absent')
		FROM orders.orders o LEFT JOIN orders.sagabox_saga s ON s.id = o.saga_id
		WHERE s.status IS DISTINCT FROM `+planned+` ORDER BY o.id`)
	if err != nil {
		return nil, fmt.Errorf("audit outcomes: %w", err)
	}
	if rep.mismatched, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		return nil, fmt.Errorf("audit outcomes: %w", err)
	}

	var p50, p99 float64
	if err := r.pool.QueryRow(ctx, `SELECT coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY d), 0),
			coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY d), 0)
		FROM (SELECT extract(epoch FROM updated_at - created_at) AS d FROM orders.sagabox_saga
			WHERE status IN ('completed', 'compensated', 'failed')) t`).Scan(&p50, &p99); err != nil {
		return nil, fmt.Errorf("audit latency: %w", err)
	}
	rep.p50, rep.p99 = time.Duration(p50*float64(time.Second)), time.Duration(p99*float64(time.Second))

	for _, s := range schemas {
		var n int64
		if err := q(&n, fmt.Sprintf(`SELECT count(*) FROM %s.sagabox_outbox WHERE published_at IS NULL`, s)); err != nil {
			return nil, err
		}
		rep.backlog[s] = n
		lines, err := r.groups(ctx, fmt.Sprintf(`SELECT kind || ' ' || type || ': ' || left(last_error, 100), count(*)
			FROM %s.sagabox_outbox WHERE dead_at IS NOT NULL GROUP BY 1 ORDER BY 2 DESC`, s), s)
		if err != nil {
			return nil, err
		}
		rep.deadOutbox = append(rep.deadOutbox, lines...)
		lines, err = r.groups(ctx, fmt.Sprintf(`SELECT kind || ' ' || type || ': ' || left(last_error, 100), count(*)
			FROM %s.sagabox_inbox_attempt WHERE dead_lettered_at IS NOT NULL GROUP BY 1 ORDER BY 2 DESC`, s), s)
		if err != nil {
			return nil, err
		}
		rep.deadInbox = append(rep.deadInbox, lines...)
	}
	if rep.deadQueues, err = r.deadLetterQueues(ctx); err != nil {
		return nil, err
	}
	if r.c.duplicates > 0 {
		if err := q(&rep.dupInjected, `SELECT count(*) FROM public.chaos_duplicate`); err != nil {
			return nil, err
		}
		var union []string
		for _, s := range schemas {
			union = append(union, fmt.Sprintf(`SELECT message_id, duplicates FROM %s.sagabox_inbox`, s))
		}
		all := strings.Join(union, " UNION ALL ")
		if err := q(&rep.dupSeen, `SELECT count(DISTINCT d.message_id) FROM public.chaos_duplicate d
			JOIN (`+all+`) i ON i.message_id = d.message_id WHERE i.duplicates > 0`); err != nil {
			return nil, err
		}
		if err := q(&rep.dupAll, `SELECT coalesce(sum(duplicates), 0) FROM (`+all+`) i`); err != nil {
			return nil, err
		}
	}
	for _, f := range r.faults {
		if f.err != nil {
			rep.resumed = append(rep.resumed, "failed: "+f.err.Error())
			continue
		}
		if d, ok := r.samples.resumed(f.back); ok {
			rep.resumed = append(rep.resumed, d.Round(100*time.Millisecond).String())
		} else {
			rep.resumed = append(rep.resumed, "idle (nothing left to do)")
		}
	}
	for _, p := range r.procs {
		for _, e := range p.unplannedExits() {
			rep.unplanned = append(rep.unplanned, p.name+": "+e)
		}
	}
	return rep, nil
}

// groups runs a query of (text, count) rows and formats them, prefixed with
// the schema.
func (r *runner) groups(ctx context.Context, sql, schema string) ([]string, error) {
	rows, err := r.pool.Query(ctx, sql)
	if err != nil {
		return nil, fmt.Errorf("audit %s: %w", schema, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var what string
		var n int64
		if err := rows.Scan(&what, &n); err != nil {
			return nil, fmt.Errorf("audit %s: %w", schema, err)
		}
		out = append(out, fmt.Sprintf("%s: %d × %s", schema, n, what))
	}
	return out, rows.Err()
}

// deadLetterQueues lists the messages in the run's dead-letter queues,
// asking a live node.
func (r *runner) deadLetterQueues(ctx context.Context) ([]string, error) {
	var lastErr error
	for _, n := range r.nodes {
		if n.PID() == 0 {
			continue
		}
		out, err := n.Ctl(ctx, "list_queues", "name", "messages", "--no-table-headers")
		if err != nil {
			lastErr = err
			continue
		}
		var list []string
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) == 2 && strings.HasPrefix(f[0], namespace+".") && strings.HasSuffix(f[0], ".dead-letter") && f[1] != "0" {
				list = append(list, f[0]+": "+f[1]+" messages")
			}
		}
		return list, nil
	}
	return nil, fmt.Errorf("list the dead-letter queues: no node answers: %w", lastErr)
}

// check is one line of the verdict.
type check struct {
	name string
	ok   bool
	note string
}

func (rep *report) checks() []check {
	terminal := rep.byStatus["completed"] + rep.byStatus["compensated"] + rep.byStatus["failed"]
	var backlog int64
	for _, n := range rep.backlog {
		backlog += n
	}
	n := int64(rep.c.sagas)
	return []check{
		{"sagas placed = present", rep.ordersPresent == n && rep.sagasPresent == n,
			fmt.Sprintf("%d placed, %d orders and %d sagas present", n, rep.ordersPresent, rep.sagasPresent)},
		{"every saga terminal", terminal == rep.sagasPresent && rep.drained,
			fmt.Sprintf("%d of %d terminal (%d completed, %d compensated, %d failed)", terminal, rep.sagasPresent,
				rep.byStatus["completed"], rep.byStatus["compensated"], rep.byStatus["failed"])},
		{"outcome = plan", len(rep.mismatched) == 0 && rep.byStatus["completed"] == rep.plannedCompleted,
			fmt.Sprintf("planned %d completed / %d compensated; %d ended otherwise", rep.plannedCompleted, rep.plannedCompensated, len(rep.mismatched))},
		{"stock balances", rep.stockAvailable+rep.stockHeld == rep.stockStart && rep.stockHeld == rep.stockHeldByCompleted && rep.heldByCompensated == 0,
			fmt.Sprintf("seeded %d = available %d + held %d; held by completed orders %d, by others %d orders",
				rep.stockStart, rep.stockAvailable, rep.stockHeld, rep.stockHeldByCompleted, rep.heldByCompensated)},
		{"money balances", rep.balance+rep.charged == rep.moneyStart && rep.charged == rep.chargedForCompleted && rep.chargedForCompensated == 0,
			fmt.Sprintf("seeded %d = balance %d + charged %d; completed orders cost %d; %d charges kept by others",
				rep.moneyStart, rep.balance, rep.charged, rep.chargedForCompleted, rep.chargedForCompensated)},
		{"shipments balance", rep.shipments == rep.byStatus["completed"] && rep.shipmentsCompleted == rep.byStatus["completed"] && rep.shipmentsCompensated == 0,
			fmt.Sprintf("%d shipments for %d completed orders; %d for others", rep.shipments, rep.byStatus["completed"], rep.shipmentsCompensated)},
		{"orders confirmed = completed", rep.confirmedCompleted == rep.byStatus["completed"] && rep.confirmedCompensated == 0,
			fmt.Sprintf("%d confirmed of %d completed; %d others confirmed", rep.confirmedCompleted, rep.byStatus["completed"], rep.confirmedCompensated)},
		{"payment confirmations = charges confirmed", rep.paymentConfirmationsMade == rep.paymentConfirmationsRecorded &&
			rep.paymentConfirmedOnce == rep.byStatus["completed"]+rep.plannedUndeliverable && rep.paymentConfirmedTwice == 0 && rep.paymentConfirmedOthers == 0,
			fmt.Sprintf("provider confirmed %d charges in %d webhook calls, %d recorded; %d completed or undeliverable orders confirmed once, %d twice, %d others confirmed; %d planned unconfirmed; %d not marked delivered",
				rep.paymentConfirmationsMade, rep.webhookSends, rep.paymentConfirmationsRecorded, rep.paymentConfirmedOnce,
				rep.paymentConfirmedTwice, rep.paymentConfirmedOthers, rep.plannedUnconfirmed, rep.webhookPending)},
		{"loyalty points balance", rep.pointsHeld == rep.pointsEarned && rep.pointsAwarded == rep.pointsEarned && rep.pointsKeptByOthers == 0,
			fmt.Sprintf("customers hold %d points, completed orders earned %d, awards kept %d; %d kept by others; %d awards revoked",
				rep.pointsHeld, rep.pointsEarned, rep.pointsAwarded, rep.pointsKeptByOthers, rep.pointsRevoked)},
		{"every duplicate recognised", rep.dupSeen == rep.dupInjected,
			fmt.Sprintf("%d duplicate deliveries injected, %d counted as duplicates by the receiving inbox", rep.dupInjected, rep.dupSeen)},
		{"outboxes drained", backlog == 0, rep.backlogNote()},
		{"no unplanned exits", len(rep.unplanned) == 0, fmt.Sprintf("%d processes exited on their own", len(rep.unplanned))},
		{"every fault injected", rep.faultErrors() == 0, fmt.Sprintf("%d of %d faults failed to inject", rep.faultErrors(), len(rep.faults))},
	}
}

// backlogNote lists the unpublished rows of each schema's outbox.
func (rep *report) backlogNote() string {
	parts := make([]string, len(schemas))
	for i, s := range schemas {
		parts[i] = fmt.Sprintf("%s %d", s, rep.backlog[s])
	}
	return strings.Join(parts, ", ") + " unpublished"
}

func (rep *report) faultErrors() int {
	n := 0
	for _, f := range rep.faults {
		if f.err != nil {
			n++
		}
	}
	return n
}

func (rep *report) passed() bool {
	for _, c := range rep.checks() {
		if !c.ok {
			return false
		}
	}
	return true
}

func (rep *report) print(out io.Writer) {
	mode := "one RabbitMQ node"
	if rep.c.cluster {
		mode = "three-node RabbitMQ cluster"
	}
	fmt.Fprintf(out, "\nchaos run: %d sagas, %s, %s in all\n", rep.c.sagas, mode, rep.elapsed.Round(time.Second))
	fmt.Fprintf(out, "faults: %d SIGKILLs, %d broker and %d database restarts; %d duplicate deliveries injected\n\n",
		count(rep.faults, "SIGKILL"), count(rep.faults, "broker"), count(rep.faults, "database"), rep.dupInjected)

	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "#\tAT\tFAULT\tTARGET\tIN FLIGHT\tDOWN\tPROGRESS RESUMED AFTER")
	for i, f := range rep.faults {
		at := "-"
		if !f.inject.IsZero() {
			at = fmt.Sprintf("+%.0fs", f.inject.Sub(rep.faults[0].inject).Seconds())
		}
		fmt.Fprintf(w, "%d\t%s\t%s %s\t%s\t%d\t%s\t%s\n", i+1, at, f.kind, f.how, f.target, f.inflight,
			f.back.Sub(f.inject).Round(100*time.Millisecond), rep.resumed[i])
	}
	_ = w.Flush()

	fmt.Fprintln(out)
	w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "CHECK\tRESULT\tDETAIL")
	for _, c := range rep.checks() {
		res := "ok"
		if !c.ok {
			res = "FAILED"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\n", c.name, res, c.note)
	}
	_ = w.Flush()

	fmt.Fprintf(out, "\nduplicate deliveries counted by the inboxes in all (injected and redelivered after faults): %d\n", rep.dupAll)
	fmt.Fprintf(out, "saga latency (start to end): p50 %s, p99 %s; step time-outs %d, late replies ignored %d, retries scheduled %d\n",
		rep.p50.Round(10*time.Millisecond), rep.p99.Round(10*time.Millisecond), rep.timedOut, rep.ignored, rep.retried)
	dead := len(rep.deadOutbox) + len(rep.deadInbox) + len(rep.deadQueues)
	fmt.Fprintf(out, "dead letters: %d kinds\n", dead)
	for _, l := range rep.deadOutbox {
		fmt.Fprintf(out, "  outbox (given up) %s\n", l)
	}
	for _, l := range rep.deadInbox {
		fmt.Fprintf(out, "  inbox (dead-lettered) %s\n", l)
	}
	for _, l := range rep.deadQueues {
		fmt.Fprintf(out, "  broker dead-letter queue %s\n", l)
	}
	for i, m := range rep.mismatched {
		if i == 20 {
			fmt.Fprintf(out, "  … and %d more\n", len(rep.mismatched)-20)
			break
		}
		fmt.Fprintf(out, "  unplanned outcome: %s\n", m)
	}
	for _, u := range rep.unplanned {
		fmt.Fprintf(out, "  unplanned exit: %s\n", u)
	}
	verdict := "PASSED"
	if !rep.passed() {
		verdict = "FAILED"
	}
	fmt.Fprintf(out, "\nchaos: %s\n", verdict)
}

func count(fs []*fault, kind string) int {
	n := 0
	for _, f := range fs {
		if f.kind == kind {
			n++
		}
	}
	return n
}
