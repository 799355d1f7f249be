package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/driver"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store"
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
	rows, err := s.OutboxClaim(context.Background(), driver.OutboxClaimOpts{Max: max, Lease: time.Minute, ClaimedBy: by})
	require.NoError(t, err)
	return rows
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

	ids := []int64{a[0].ID, a[1].ID, a[2].ID}
	require.NoError(t, s.OutboxDone(ctx, ids, nil, 0, nil))
	b = claim(t, s, 10, "relay-b")
	require.Len(t, b, 3)
	for i, r := range b {
		require.Equal(t, msgs[3+i].MessageID, r.Message.MessageID)
	}
}

// OutboxDone settles a batch in one statement: the confirmed rows are
// published, the others wait for their retry delay.
func TestOutboxDoneSettlesABatch(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t, store.LineMessaging)
	ctx := context.Background()
	write(t, s, event("k", 1), event("j", 1))
	rows := claim(t, s, 10, "t")
	require.Len(t, rows, 2)
	require.NoError(t, s.OutboxDone(ctx, []int64{rows[1].ID}, []int64{rows[0].ID}, time.Hour, fmt.Errorf("broker down")))
	require.Empty(t, claim(t, s, 10, "t"), "the failed row waits for its retry delay; the other is published")
	require.NoError(t, s.OutboxDone(ctx, nil, []int64{rows[0].ID}, 0, fmt.Errorf("broker down")))
	again := claim(t, s, 10, "t")
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
	var ids []int64
	for _, r := range rows {
		ids = append(ids, r.ID)
	}
	require.NoError(t, s.OutboxDone(ctx, ids, nil, 0, nil))

	pruned, err := s.Prune(ctx, driver.Retention{Outbox: time.Now().Add(time.Hour), Batch: 7})
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

	got := claim(t, s, 100, "t")
	require.Len(t, got, 1)
}

func explainClaim(t *testing.T, s *dbtest.DB) string {
	t.Helper()
	ctx := context.Background()
	tx, err := s.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	sql := strings.ReplaceAll(store.ClaimSQLForTest(), "/* TEMPLATE: schema */", fmt.Sprintf("%q.", s.Schema()))
	rows, err := tx.Query(ctx, "EXPLAIN "+sql, 30.0, "explain", 100)
	require.NoError(t, err)
	var lines []string
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		lines = append(lines, line)
	}
	require.NoError(t, rows.Err())
	return strings.Join(lines, "\n")
}
