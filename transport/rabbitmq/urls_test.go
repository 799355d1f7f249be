package rabbitmq_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/internal/testkit/servers"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/transport"
	"github.com/sagabox/sagabox/transport/transporttest"
)

// publishAndConsume publishes n commands through b until confirmed and waits
// until got has seen them all.
func publishAndConsume(ctx context.Context, t *testing.T, b transport.Publisher, got *idSet, n int) {
	t.Helper()
	msgs := make([]message.Message, n)
	ids := make([]uuid.UUID, n)
	for i := range msgs {
		msgs[i] = transporttest.Command("svc.do")
		ids[i] = msgs[i].MessageID
	}
	publishUntilConfirmed(ctx, t, b, msgs)
	got.waitFor(t, "every confirmed message consumed", func() bool { return got.missing(ids) == 0 })
}

// A broker whose first URL refuses connections connects to the next one.
func TestConnectsToTheNextURL(t *testing.T) {
	t.Parallel()
	cfg := amqptest.Config(t)
	cfg.URLs = []string{cfg.URL}
	cfg.URL = "amqp://guest:guest@127.0.0.1:1/"
	b := amqptest.NewBroker(t, cfg)
	ctx := testCtx(t)
	require.NoError(t, b.Declare(ctx, spec))
	got := newIDSet()
	runSubscriber(t, b, spec, transport.HandlerFunc(func(_ context.Context, d *transport.Delivery) transport.Outcome {
		got.add(d.MessageID)
		return transport.Ack()
	}), nil)
	publishAndConsume(ctx, t, b, got, 10)
}

// When the node a broker is connected to dies (kill -9 of a private node),
// both connections reconnect to the next URL, declare the topology there and
// carry messages again: a client of a RabbitMQ cluster outlives the loss of
// the node it used.
func TestReconnectsToTheNextURL(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	node, err := servers.StartRabbitMQ(ctx, servers.RabbitMQOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, node.Close()) })

	cfg := amqptest.Config(t)
	cfg.URLs = []string{cfg.URL}
	cfg.URL = node.URL()
	b := amqptest.NewBroker(t, cfg)
	require.NoError(t, b.Declare(ctx, spec))
	got := newIDSet()
	runSubscriber(t, b, spec, transport.HandlerFunc(func(_ context.Context, d *transport.Delivery) transport.Outcome {
		got.add(d.MessageID)
		return transport.Ack()
	}), nil)
	publishAndConsume(ctx, t, b, got, 10)

	require.NoError(t, node.Kill())
	publishAndConsume(ctx, t, b, got, 10)
	require.Zero(t, node.PID(), "the first node stayed down: the messages went through the second URL")
}
