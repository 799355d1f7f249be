package orchestrator_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/telemetry"
	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/transport"
)

// gatedBroker is a broker whose subscriptions declare their queue at once
// but consume only once open is closed: replies pile up in the queue
// meanwhile, as they do behind a busy or restarting orchestrator.
type gatedBroker struct {
	transport.Broker
	open chan struct{}
}

func (b *gatedBroker) Subscribe(ctx context.Context, spec transport.QueueSpec, h transport.Handler, opts *transport.SubscribeOpts) error {
	if err := b.Declare(ctx, spec); err != nil {
		return err
	}
	select {
	case <-b.open:
	case <-ctx.Done():
		return nil
	}
	return b.Broker.Subscribe(ctx, spec, h, opts)
}

// reservedSagas starts n order sagas on a running orchestrator that does not
// consume its replies (behind gate), lets the inventory answer them all and
// waits until the n replies wait in the reply queue. Charges go nowhere.
func reservedSagas(t *testing.T, e *env, n int) (*gatedBroker, []uuid.UUID) {
	t.Helper()
	def := orderSaga(1, time.Hour, 1)
	gate := &gatedBroker{Broker: e.broker, open: make(chan struct{})}
	cfg := e.orchConfig(def)
	cfg.Broker = gate
	cfg.SweepInterval = time.Hour
	c := e.runOrchestrator(cfg)
	e.blackhole(Charge.Name())
	testkit.Run(t, e.inventory(false).Run)
	ids := make([]uuid.UUID, n)
	for i := range ids {
		ids[i] = e.start(c, def, Order{ID: uuid.NewString(), Qty: 1, Amount: 10, Address: "here"}, nil).ID
	}
	testkit.WaitFor(t, 30*time.Second, "the replies to wait in the reply queue", func() bool {
		return amqptest.QueueLength(t, e.broker.QueueName(orchestratorQueue.Name)) == n
	})
	return gate, ids
}

// TestRepliesArrivingTogetherShareATransaction shows group commit: replies
// that wait in the queue are applied several to a transaction, and each
// saga's state is what applying its reply on its own gives.
func TestRepliesArrivingTogetherShareATransaction(t *testing.T) {
	t.Parallel()
	const n = 40
	var rts dbtest.RoundTrips
	pool := dbtest.PoolWith(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = &rts })
	e := newEnvOnPool(t, pool)
	gate, ids := reservedSagas(t, e, n)

	rts.Start()
	close(gate.open)
	testkit.WaitFor(t, 30*time.Second, "every saga to reach its charge", func() bool {
		return e.count(`SELECT count(*) FROM %[1]s.sagabox_saga WHERE current_step = 1`) == n
	})
	rts.Stop()

	receives := 0
	for _, tx := range rts.Transactions() {
		if tx.Has("SagaReceive") {
			receives++
		}
	}
	t.Logf("%d replies applied in %d transactions", n, receives)
	require.LessOrEqual(t, receives, n/2, "waiting replies are applied several to a transaction")
	for _, id := range ids {
		var o Order
		var data json.RawMessage
		require.NoError(t, pool.QueryRow(context.Background(),
			`SELECT data FROM `+e.orch.Schema()+`.sagabox_saga WHERE id = $1`, id).Scan(&data))
		require.NoError(t, json.Unmarshal(data, &o))
		require.Equal(t, "r-"+o.ID, o.ReservationID, "saga %s has its own reply's data", id)
	}
	require.Equal(t, n, e.count(`SELECT count(*) FROM %[1]s.sagabox_inbox`), "every reply is in the inbox once")
}

// TestBatchAppliesOneReplyPerSaga shows what a batch leaves to be applied on
// its own: a repeated message, a second reply to a saga already in the
// batch (it needs the state the first one leaves) and anything that is not
// a reply. The rest is applied in the batch's transaction.
func TestBatchAppliesOneReplyPerSaga(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	gate, _ := reservedSagas(t, e, 3)
	_ = gate // never opened: the test takes the replies itself

	var mu sync.Mutex
	var got []*transport.Delivery
	stop := testkit.Run(t, func(ctx context.Context) error {
		return e.broker.Subscribe(ctx, orchestratorQueue, transport.HandlerFunc(func(_ context.Context, d *transport.Delivery) transport.Outcome {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, d)
			return transport.Ack()
		}), nil)
	})
	testkit.WaitFor(t, 30*time.Second, "the three replies", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == 3
	})
	require.NoError(t, stop())

	repeated := *got[0]
	second := *got[1]
	second.MessageID = uuid.New()
	notReply := *got[2]
	notReply.MessageID, notReply.Kind = uuid.New(), message.KindEvent
	batch := []*transport.Delivery{got[0], got[1], &repeated, &second, &notReply, got[2]}

	c := e.newOrchestrator(e.orchConfig(orderSaga(1, time.Hour, 1)))
	res, err := c.ProcessBatch(context.Background(), batch)
	require.NoError(t, err)
	require.Len(t, res, len(batch))
	for i, want := range []bool{false, false, true, true, true, false} {
		require.Equal(t, want, res[i].Defer, "delivery %d deferred", i)
		if !want {
			require.Equal(t, telemetry.OutcomeApplied, res[i].Outcome, "delivery %d", i)
		}
	}
	require.Equal(t, 3, e.count(`SELECT count(*) FROM %[1]s.sagabox_saga WHERE current_step = 1`), "the three sagas moved on")
	require.Equal(t, 3, e.count(`SELECT count(*) FROM %[1]s.sagabox_inbox`), "only the applied replies are in the inbox")
}
