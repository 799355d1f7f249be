package orchestrator_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/internal/testkit/servers"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/transport"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

// A broker outage longer than the step timeout, while sagas are in flight,
// compensates nothing: commands that wait in the outbox do not time out,
// their deadlines count from when they are published, and no deadline runs
// while the broker is away (a reply may be waiting in a participant's
// outbox). Every step has one attempt, so any time-out would compensate.
// The broker is a private node, killed with SIGKILL.
func TestBrokerOutageLongerThanTheTimeoutCompensatesNothing(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	node, err := servers.StartRabbitMQ(ctx, servers.RabbitMQOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, node.Close()) })

	e := newEnv(t)
	b, err := rabbitmq.New(ctx, rabbitmq.Config{URL: node.URL(), Namespace: amqptest.Namespace(t), QueueType: rabbitmq.QueueTypeQuorum, Logger: amqptest.Logger(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	e.broker = b

	// Short enough to pass several times over during the outage, long
	// enough for the participants to reconnect and answer once it ends on
	// a loaded machine.
	const timeout = 5 * time.Second
	def := orderSaga(1, timeout, 1)
	c := e.runOrchestrator(e.orchConfig(def))
	testkit.Run(t, e.inventory(true).Run)
	testkit.Run(t, e.payment(true).Run)

	const n = 30
	orders := make([]Order, n)
	started := make([]*orchestrator.Started, n)
	for i := range orders {
		orders[i] = Order{ID: "o" + string(rune('a'+i%26)) + string(rune('a'+i/26)), Qty: 1, Amount: 10, Address: "here"}
		started[i] = e.start(c, def, orders[i], nil)
	}
	// Kill the broker once the first sagas have made progress, while the
	// others are still on their way.
	testkit.WaitFor(t, time.Minute, "a first reservation", func() bool {
		return e.count(`SELECT count(*) FROM %[2]s.reservations`) > 0
	})
	require.NoError(t, node.Kill())
	time.Sleep(2 * timeout) // well past every step's timeout
	require.NoError(t, node.Start(ctx))

	e.waitSettled(n, 2*time.Minute)
	for i, st := range started {
		s, err := c.Get(context.Background(), st.ID)
		require.NoError(t, err)
		require.Equal(t, saga.StatusCompleted, s.Status, "order %s: %s", orders[i].ID, s.LastError)
		e.checkBusiness(orders[i], saga.StatusCompleted)
	}
}

// stalledPublisher is a broker whose publishing fails until open is closed,
// while its consumers keep working: a relay that cannot get its commands
// out (a blocked connection, a backlog), not a broker outage.
type stalledPublisher struct {
	transport.Broker
	open chan struct{}
}

func (b *stalledPublisher) Publish(ctx context.Context, msgs ...message.Message) error {
	select {
	case <-b.open:
		return b.Broker.Publish(ctx, msgs...)
	default:
		return errors.New("publishing stalled by the test")
	}
}

// Commands that wait in the orchestrator's outbox longer than their step's
// timeout do not time out: a saga is not due while its command is
// unpublished, and once it is published its deadline is pushed back by the
// wait. Every step has one attempt, so any time-out would compensate.
func TestCommandsHeldInTheOutboxDoNotTimeOut(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const timeout = 2 * time.Second
	def := orderSaga(1, timeout, 1)
	stalled := &stalledPublisher{Broker: e.broker, open: make(chan struct{})}
	cfg := e.orchConfig(def)
	cfg.Broker = stalled
	c := e.runOrchestrator(cfg)
	testkit.Run(t, e.inventory(true).Run)
	testkit.Run(t, e.payment(true).Run)

	const n = 10
	started := make([]*orchestrator.Started, n)
	orders := make([]Order, n)
	for i := range started {
		orders[i] = Order{ID: fmt.Sprintf("held-%d", i), Qty: 1, Amount: 10, Address: "here"}
		started[i] = e.start(c, def, orders[i], nil)
	}
	time.Sleep(2 * timeout) // the commands wait in the outbox past their timeout
	require.Equal(t, n, e.count(`SELECT count(*) FROM %[1]s.sagabox_outbox WHERE published_at IS NULL`), "nothing was published")
	close(stalled.open)

	e.waitSettled(n, time.Minute)
	for i, st := range started {
		s, err := c.Get(context.Background(), st.ID)
		require.NoError(t, err)
		require.Equal(t, saga.StatusCompleted, s.Status, "order %s: %s", orders[i].ID, s.LastError)
	}
}
