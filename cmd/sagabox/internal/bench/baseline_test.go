package bench

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit/dbtest"
)

// TestBaselineInboxGatesRedelivery checks that the baseline is correct, not
// only fast: a redelivered message changes nothing, and a reply for a step
// the saga has left is ignored.
func TestBaselineInboxGatesRedelivery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := &baseline{pool: dbtest.Pool(t), schemas: map[string]string{}, wake: map[string]chan struct{}{}}
	suffix := uuid.NewString()[:8]
	for _, svc := range baselineServices {
		schema := "bench_test_" + svc + "_" + suffix
		b.schemas[svc] = pgx.Identifier{schema}.Sanitize()
		b.wake[svc] = make(chan struct{}, 1)
		t.Cleanup(func() { dropSchema(b.pool, schema) })
		require.NoError(t, b.createSchema(ctx, svc))
	}
	id, err := b.start(ctx)
	require.NoError(t, err)

	deliver := func(svc string, d *amqp.Delivery) {
		t.Helper()
		sql, args, _, err := b.apply(svc, d)
		require.NoError(t, err)
		batch := &pgx.Batch{}
		batch.Queue("BEGIN")
		batch.Queue(sql, args...)
		batch.Queue("COMMIT")
		require.NoError(t, b.exec(ctx, batch))
	}
	message := func(step int) *amqp.Delivery {
		body, err := json.Marshal(blMessage{SagaID: id, Step: step})
		require.NoError(t, err)
		return &amqp.Delivery{MessageId: uuid.Must(uuid.NewV7()).String(), Body: body}
	}
	count := func(svc, routingKey string) int {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schemas[svc]+".outbox WHERE routing_key = $1", routingKey).Scan(&n))
		return n
	}
	step := func() (int, string) {
		var n int
		var status string
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT step, status FROM "+b.schemas[svcOrch]+".saga WHERE id = $1", id).Scan(&n, &status))
		return n, status
	}

	cmd := message(1)
	deliver(svcAlpha, cmd)
	deliver(svcAlpha, cmd)
	require.Equal(t, 1, count(svcAlpha, svcOrch), "a redelivered command writes one reply")

	reply := message(1)
	deliver(svcOrch, reply)
	deliver(svcOrch, reply)
	require.Equal(t, 1, count(svcOrch, svcBeta), "a redelivered reply writes one next command")
	n, status := step()
	require.Equal(t, 2, n)
	require.Equal(t, "running", status)

	deliver(svcOrch, message(1)) // a stale reply under a new message id
	require.Equal(t, 1, count(svcOrch, svcBeta), "a reply for a step the saga has left is ignored")
	n, _ = step()
	require.Equal(t, 2, n)

	deliver(svcOrch, message(2))
	deliver(svcOrch, message(3))
	n, status = step()
	require.Equal(t, 3, n)
	require.Equal(t, "completed", status)
}
