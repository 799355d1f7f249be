package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/store/driver"
)

func event(key string, n int) message.Message {
	return message.Message{
		Envelope: message.Envelope{Type: "test.event", Kind: message.KindEvent, OrderingKey: key},
		Payload:  []byte(fmt.Sprintf(`{"n":%d}`, n)),
	}
}

func write(t *testing.T, s *dbtest.DB, msgs ...message.Message) []message.Message {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, s.InTx(ctx, func(tx pgx.Tx) error { return s.OutboxWrite(ctx, tx, msgs) }))
	return msgs
}

func claim(t *testing.T, s *dbtest.DB, max int, by string) []driver.OutboxRow {
	t.Helper()
	return settleAndClaim(t, s, max, by, driver.OutboxSettle{})
}

func settleAndClaim(t *testing.T, s *dbtest.DB, max int, by string, settle driver.OutboxSettle) []driver.OutboxRow {
	t.Helper()
	rows, err := s.OutboxClaim(context.Background(), driver.OutboxClaimOpts{Max: max, Lease: time.Minute, ClaimedBy: by, Settle: settle})
	require.NoError(t, err)
	return rows
}

func ids(rows []driver.OutboxRow) []int64 {
	out := make([]int64, len(rows))
	for i, r := range rows {
		out[i] = r.ID
	}
	return out
}

func TestOutboxWriteFillsEnvelope(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t, store.LineMessaging)
	sagaID := uuid.New()
	msgs := write(t, s, message.Message{
		Envelope: message.Envelope{
			Type: "inventory.reserve", Kind: message.KindCommand, SagaID: sagaID, SagaType: "checkout",
			Step: "reserve", StepIndex: 1, Attempt: 1, ReplyTo: "orders", Headers: map[string]string{"k": "v"},
		},
		Payload: []byte(`{"sku":"A"}`),
	})
	require.Equal(t, uuid.Version(7), msgs[0].MessageID.Version(), "message ids are UUIDv7")
	require.Equal(t, sagaID.String(), msgs[0].OrderingKey, "ordering key defaults to the saga id")
	require.Equal(t, "inventory.reserve", msgs[0].RoutingKey)

	rows := claim(t, s, 10, "t")
	require.Len(t, rows, 1)
	got := rows[0].Message
	require.Equal(t, msgs[0].MessageID, got.MessageID)
	require.Equal(t, sagaID, got.SagaID)
	require.Equal(t, "reserve", got.Step)
	require.Equal(t, 1, got.StepIndex)
	require.Equal(t, "orders", got.ReplyTo)
	require.Equal(t, map[string]string{"k": "v"}, got.Headers)
	require.JSONEq(t, `{"sku":"A"}`, string(got.Payload))
	require.WithinDuration(t, msgs[0].CreatedAt, got.CreatedAt, time.Millisecond)
	require.Zero(t, got.Run)
}

// A restarted saga's run travels with its messages through the outbox,
// kept among the headers under a reserved key that the message's own
// headers never show.
func TestOutboxKeepsTheRun(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t, store.LineMessaging)
	for _, headers := range []map[string]string{nil, {"k": "v"}} {
		write(t, s, message.Message{
			Envelope: message.Envelope{
				Type: "inventory.reserve", Kind: message.KindCommand, SagaID: uuid.New(), SagaType: "checkout",
				Step: "reserve", Attempt: 1, Run: 2, ReplyTo: "orders", Headers: headers,
			},
			Payload: []byte(`{}`),
		})
	}
	rows := claim(t, s, 10, "t")
	require.Len(t, rows, 2)
	for i, want := range []map[string]string{nil, {"k": "v"}} {
		require.Equal(t, 2, rows[i].Message.Run)
		require.Equal(t, want, rows[i].Message.Headers)
	}
}

func TestOutboxWriteRejectsInvalidMessage(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t, store.LineMessaging)
	ctx := context.Background()
	err := s.InTx(ctx, func(tx pgx.Tx) error {
		return s.OutboxWrite(ctx, tx, []message.Message{{Envelope: message.Envelope{Kind: message.KindEvent}}})
	})
	require.ErrorContains(t, err, "type is missing")
	err = s.InTx(ctx, func(tx pgx.Tx) error {
		return s.OutboxWrite(ctx, tx, []message.Message{{Envelope: message.Envelope{Type: "x", Kind: message.KindEvent}, Payload: []byte("{")}})
	})
	require.ErrorContains(t, err, "not valid JSON")
}

func TestGuaranteeAtomicOutboxRolledBackRowsNeverClaimed(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t, store.LineMessaging)
	ctx := context.Background()
	errRollback := fmt.Errorf("business failure")
	err := s.InTx(ctx, func(tx pgx.Tx) error {
		if err := s.OutboxWrite(ctx, tx, []message.Message{event("k", 1)}); err != nil {
			return err
		}
		return errRollback
	})
	require.ErrorIs(t, err, errRollback)
	committed := write(t, s, event("k", 2))
	rows := claim(t, s, 100, "t")
	require.Len(t, rows, 1)
	require.Equal(t, committed[0].MessageID, rows[0].Message.MessageID)
}

// Two claimers on one table: a key whose earlier rows are claimed by one
// relay is not handed to another until those rows are published.
func TestGuaranteeOrderingClaimRespectsKeys(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t, store.LineMessaging)
	ctx := context.Background()
	var msgs []message.Message
	for i := range 6 {
		msgs = append(msgs, event("key-a", i))
	}
	msgs = append(msgs, event("key-b", 0))
	write(t, s, msgs...)

	a := claim(t, s, 3, "relay-a") // key-a rows 0..2
	require.Len(t, a, 3)
	for i, r := range a {
		require.Equal(t, msgs[i].MessageID, r.Message.MessageID)
	}
	b := claim(t, s, 10, "relay-b")
	require.Len(t, b, 1, "relay-b must not take key-a rows 3..5 while 0..2 are unpublished")
	require.Equal(t, "key-b", b[0].Message.OrderingKey)

	// A settles its batch in the statement that claims its next one, which
	// can already take the key's next rows.
	next := settleAndClaim(t, s, 2, "relay-a", driver.OutboxSettle{Published: ids(a)})
	require.Len(t, next, 2)
	require.Equal(t, msgs[3].MessageID, next[0].Message.MessageID)
	require.Equal(t, msgs[4].MessageID, next[1].Message.MessageID)
	require.Empty(t, claim(t, s, 10, "relay-b"), "relay-b must not take key-a row 5 while rows 3 and 4 are unpublished")
	b = settleAndClaim(t, s, 10, "relay-a", driver.OutboxSettle{Published: ids(next)})
	require.Len(t, b, 1)
	require.Equal(t, msgs[5].MessageID, b[0].Message.MessageID)
	_ = ctx
}

// A row that a concurrent claim has locked (SKIP LOCKED leaves it out of
// this claim's candidates) splits its key: the key's rows before it can be
// claimed, the rows after it wait, so nothing of the key is published out of
// order.
func TestGuaranteeOrderingClaimSkipsAKeyAfterALockedRow(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t, store.LineMessaging)
	ctx := context.Background()
	var msgs []message.Message
	for i := range 4 {
		msgs = append(msgs, event("key-a", i))
	}
	msgs = append(msgs, event("key-b", 0))
	write(t, s, msgs...)
	// A concurrent claim holds the lock of key-a's second row.
	other, err := s.Pool.Begin(ctx)
	require.NoError(t, err)
	defer other.Rollback(ctx)
	var locked int64
	require.NoError(t, other.QueryRow(ctx, fmt.Sprintf(`SELECT id FROM %q.sagabox_outbox WHERE ordering_key = 'key-a' ORDER BY id OFFSET 1 LIMIT 1`, s.Schema())).Scan(&locked))
	_, err = other.Exec(ctx, fmt.Sprintf(`SELECT 1 FROM %q.sagabox_outbox WHERE id = $1 FOR UPDATE`, s.Schema()), locked)
	require.NoError(t, err)

	got := claim(t, s, 10, "me")
	var keys []string
	for _, r := range got {
		keys = append(keys, r.Message.OrderingKey)
		require.NotEqual(t, locked, r.ID)
	}
	require.Equal(t, []string{"key-a", "key-b"}, keys, "key-a's first row and key-b; not key-a's rows after the locked one")
	require.Equal(t, msgs[0].MessageID, got[0].Message.MessageID)
}

// A claim settles the previous batch: the confirmed rows are deleted (or,
// when published rows are kept, marked), the others wait for their retry
// delay.
func TestClaimSettlesThePreviousBatch(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t, store.LineMessaging)
	ctx := context.Background()
	write(t, s, event("k", 1), event("j", 1))
	rows := claim(t, s, 10, "t")
	require.Len(t, rows, 2)
	settle := driver.OutboxSettle{Published: []int64{rows[1].ID}, Failed: []int64{rows[0].ID}, RetryAfter: time.Hour, Cause: fmt.Errorf("broker down")}
	require.Empty(t, settleAndClaim(t, s, 10, "t", settle), "the failed row waits for its retry delay; the other is published")
	require.Equal(t, 1, count.n(t, s, `SELECT count(*) FROM %q.sagabox_outbox`), "the published row is deleted")
	again := settleAndClaim(t, s, 0, "t", driver.OutboxSettle{Failed: []int64{rows[0].ID}, Cause: fmt.Errorf("broker down")})
	require.Empty(t, again, "Max 0 only settles")
	again = claim(t, s, 10, "t")
	require.Len(t, again, 1)
	require.Equal(t, rows[0].Message.MessageID, again[0].Message.MessageID)
	require.Equal(t, 2, again[0].PublishAttempts)
	var lastError string
	require.NoError(t, s.Pool.QueryRow(ctx, fmt.Sprintf("SELECT last_error FROM %q.sagabox_outbox WHERE id = $1", s.Schema()), rows[0].ID).Scan(&lastError))
	require.Equal(t, "broker down", lastError)

	stats, err := s.OutboxStats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, stats.Backlog)
	require.EqualValues(t, 1, stats.Retrying)

	settleAndClaim(t, s, 0, "t", driver.OutboxSettle{Published: ids(again), KeepPublished: true})
	require.Equal(t, 1, count.n(t, s, `SELECT count(*) FROM %q.sagabox_outbox WHERE published_at IS NOT NULL`), "kept, marked published")
}

func TestRetentionDeletesInSmallBatches(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t, store.LineMessaging)
	ctx := context.Background()
	var msgs []message.Message
	for i := range 25 {
		msgs = append(msgs, event(fmt.Sprint(i), i))
	}
	write(t, s, msgs...)
	rows := claim(t, s, 20, "t")
	settleAndClaim(t, s, 0, "t", driver.OutboxSettle{Published: ids(rows), KeepPublished: true})

	pruned, err := s.RetentionPrune(ctx, driver.Retention{Outbox: time.Now().Add(time.Hour), Batch: 7})
	require.NoError(t, err)
	require.EqualValues(t, 20, pruned.Outbox, "only published rows are deleted, 7 at a time")
	require.EqualValues(t, 20, pruned.Total())
	stats, err := s.OutboxStats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 5, stats.Backlog)
}

// A large backlog of published rows must not be scanned by the claim: the
// plan uses the partial index on unpublished rows.
func TestClaimPlanIgnoresPublishedBacklog(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t, store.LineMessaging)
	ctx := context.Background()
	rows := 1_000_000
	if testing.Short() {
		rows = 100_000
	}
	q := fmt.Sprintf(`INSERT INTO %q.sagabox_outbox
		(message_id, ordering_key, kind, type, routing_key, payload, created_at, published_at)
		SELECT gen_random_uuid(), g::text, 'event', 'old.event', 'old.event', '{}', now() - interval '2 days', now() - interval '1 day'
		FROM generate_series(1, %d) g`, s.Schema(), rows)
	_, err := s.Pool.Exec(ctx, q)
	require.NoError(t, err)
	write(t, s, event("fresh", 1))
	_, err = s.Pool.Exec(ctx, fmt.Sprintf("ANALYZE %q.sagabox_outbox", s.Schema()))
	require.NoError(t, err)

	plan := explainClaim(t, s)
	require.Contains(t, plan, "sagabox_outbox_unpublished_idx", "claim must read the partial index:\n%s", plan)
	require.NotContains(t, plan, "Seq Scan on sagabox_outbox", "claim must not scan the table:\n%s", plan)
	// The plan the relay runs is the generic one, built once per connection.
	plan = explainGenericClaim(t, s)
	require.Contains(t, plan, "sagabox_outbox_unpublished_idx", "claim must read the partial index:\n%s", plan)
	require.Contains(t, plan, "Backward using sagabox_outbox_unpublished_key_idx", "the previous row of a key must come from a probe of the key index:\n%s", plan)
	require.NotContains(t, plan, "Seq Scan on sagabox_outbox", "claim must not scan the table:\n%s", plan)

	got := claim(t, s, 100, "t")
	require.Len(t, got, 1)
}

// claimArgs are the claim statement's arguments, in its parameter order, for
// a claim of max rows that settles nothing.
func claimArgs(max int) []any {
	return []any{30.0, "explain", []int64{}, false, 0.0, "", []int64{}, []int64{}, []string{}, max}
}

func explainClaim(t *testing.T, s *dbtest.DB) string {
	t.Helper()
	ctx := context.Background()
	tx, err := s.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, store.ClaimPlanForTest())
	require.NoError(t, err)
	sql := strings.ReplaceAll(store.ClaimSQLForTest(), "/* TEMPLATE: schema */", fmt.Sprintf("%q.", s.Schema()))
	rows, err := tx.Query(ctx, "EXPLAIN "+sql, claimArgs(100)...)
	require.NoError(t, err)
	return planText(t, rows)
}

// planText reads the lines of an EXPLAIN.
func planText(t *testing.T, rows pgx.Rows) string {
	t.Helper()
	var lines []string
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		lines = append(lines, line)
	}
	require.NoError(t, rows.Err())
	return strings.Join(lines, "\n")
}

// explainGenericClaim returns the claim's generic plan, the one the relay
// runs (claimPlan forces it).
func explainGenericClaim(t *testing.T, s *dbtest.DB) string {
	t.Helper()
	plan := explainGeneric(t, s, store.ClaimSQLForTest(), store.ClaimPlanForTest())
	require.Regexp(t, `\$\d`, plan, "the generic plan refers to the parameters, not to their values")
	return plan
}

// planNode is a node of EXPLAIN (ANALYZE, FORMAT JSON).
type planNode struct {
	NodeType       string     `json:"Node Type"`
	RelationName   string     `json:"Relation Name"`
	ActualRows     float64    `json:"Actual Rows"`
	ActualLoops    float64    `json:"Actual Loops"`
	RemovedFilter  float64    `json:"Rows Removed by Filter"`
	RemovedRecheck float64    `json:"Rows Removed by Index Recheck"`
	Plans          []planNode `json:"Plans"`
}

// rowsVisited sums the rows every scan of relation read (those it produced
// and those its filter removed), over all loops: the work the plan did on
// it.
func (n planNode) rowsVisited(relation string) float64 {
	total := 0.0
	if n.RelationName == relation {
		total += (n.ActualRows + n.RemovedFilter + n.RemovedRecheck) * n.ActualLoops
	}
	for _, c := range n.Plans {
		total += c.rowsVisited(relation)
	}
	return total
}

// The claim's cost is bounded by its batch, whatever the backlog and the
// planner's statistics: with 20,000 unpublished rows over 5,000 keys and no
// ANALYZE ever run, one claim of 200 rows visits a small multiple of 200
// rows of the outbox, however the keys' rows lie.
func TestClaimCostBoundedByTheBatch(t *testing.T) {
	t.Parallel()
	for name, key := range map[string]string{
		"keys interleaved": "(g % 5000)::text",
		"keys in runs":     "(g / 4)::text",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := dbtest.Store(t, store.LineMessaging)
			ctx := context.Background()
			_, err := s.Pool.Exec(ctx, fmt.Sprintf(`ALTER TABLE %[1]q.sagabox_outbox SET (autovacuum_enabled = false);
				INSERT INTO %[1]q.sagabox_outbox (message_id, ordering_key, kind, type, routing_key, payload)
				SELECT gen_random_uuid(), %[2]s, 'event', 'e', 'e', '{}' FROM generate_series(1, 20000) g`, s.Schema(), key))
			require.NoError(t, err)
			// Another relay holds the first rows: the claim must skip them
			// and their keys' later rows without scanning the backlog.
			held := claim(t, s, 50, "other")
			require.Len(t, held, 50)

			tx, err := s.Pool.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(ctx)
			_, err = tx.Exec(ctx, store.ClaimPlanForTest())
			require.NoError(t, err)
			sql := strings.ReplaceAll(store.ClaimSQLForTest(), "/* TEMPLATE: schema */", fmt.Sprintf("%q.", s.Schema()))
			var out []byte
			require.NoError(t, tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql, claimArgs(200)...).Scan(&out))
			var plans []struct {
				Plan planNode `json:"Plan"`
			}
			require.NoError(t, json.Unmarshal(out, &plans))
			visited := plans[0].Plan.rowsVisited("sagabox_outbox")
			t.Logf("rows of the outbox visited by a claim of 200: %.0f", visited)
			require.LessOrEqual(t, visited, 10.0*200, "the claim's work is bounded by its batch:\n%s", out)
			require.NoError(t, tx.Rollback(ctx))

			got := claim(t, s, 200, "me")
			require.GreaterOrEqual(t, len(got), 190, "nearly a full batch: only the rows of keys the other relay holds wait")
			heldKeys := map[string]bool{}
			for _, r := range held {
				heldKeys[r.Message.OrderingKey] = true
			}
			for _, r := range got {
				require.False(t, heldKeys[r.Message.OrderingKey], "row %d: a key whose first rows the other relay holds waits", r.ID)
			}
		})
	}
}

// A relay that settles its published row and claims in one statement takes
// the next row of the same key, even after another relay's claim saw that
// row blocked behind the unsettled one.
func TestClaimTakesTheNextRowOfAKeyItSettles(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t, store.LineMessaging)
	sagaID := uuid.New()
	msg := func() message.Message {
		return message.Message{Envelope: message.Envelope{Type: "a.b", Kind: message.KindCommand, SagaID: sagaID, Step: "s", ReplyTo: "r"}, Payload: []byte(`{}`)}
	}
	write(t, s, msg())
	first := claim(t, s, 10, "x")
	require.Len(t, first, 1)
	write(t, s, msg())
	require.Empty(t, claim(t, s, 10, "y"), "the second row waits behind the first, unsettled")
	next := settleAndClaim(t, s, 10, "x", driver.OutboxSettle{Published: ids(first)})
	require.Len(t, next, 1, "settling the first row frees the second")
}
