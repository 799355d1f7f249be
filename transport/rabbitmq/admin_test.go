package rabbitmq_test

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

// Browse hands back what it read before it returns: the queue counts every
// message again at once, so a list or a replay right after a browse finds
// them. The broker returns a quorum queue's messages through its log, after
// the channel has closed.
func TestBrowseReturnsAfterTheMessagesAreBack(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	cfg := amqptest.Config(t)
	b := amqptest.NewBroker(t, cfg)
	require.NoError(t, b.Declare(ctx, spec))
	dlq := b.DeadLetterQueueName(spec.Name)
	const n = 3
	for range n {
		amqptest.PublishRaw(t, "", dlq, amqp.Publishing{MessageId: "m", Type: "svc.do", Body: []byte(`{}`), DeliveryMode: amqp.Persistent})
	}
	require.Eventually(t, func() bool { return amqptest.QueueLength(t, dlq) == n }, wait, 10*time.Millisecond)
	adm, err := rabbitmq.DialAdmin(ctx, rabbitmq.Config{URL: cfg.URL, Namespace: cfg.Namespace})
	require.NoError(t, err)
	t.Cleanup(func() { _ = adm.Close() })
	// A channel open beforehand counts the queue without the delay of a
	// new connection, which could hide a browse that returned too early.
	ch, err := amqptest.Dial(t).Channel()
	require.NoError(t, err)
	for i := range 20 {
		msgs, err := adm.Browse(ctx, spec.Name, n)
		require.NoError(t, err)
		require.Len(t, msgs, n)
		q, err := ch.QueueDeclarePassive(dlq, true, false, false, false, nil)
		require.NoError(t, err)
		require.Equal(t, n, q.Messages, "browse %d", i)
	}
}

// A tool checks routes from outside: no command is routable in a namespace
// no service ever started, and a command is once its queue is declared.
func TestAdminRoutable(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	cfg := amqptest.Config(t)
	adm, err := rabbitmq.DialAdmin(ctx, rabbitmq.Config{URL: cfg.URL, Namespace: cfg.Namespace})
	require.NoError(t, err)
	t.Cleanup(func() { _ = adm.Close() })
	got, err := adm.Routable(ctx, []string{"svc.do", "nobody.listens"})
	require.NoError(t, err)
	require.Equal(t, map[string]bool{"svc.do": false, "nobody.listens": false}, got, "no exchange yet")

	b := amqptest.NewBroker(t, cfg)
	require.NoError(t, b.Declare(ctx, spec))
	got, err = adm.Routable(ctx, []string{"svc.do", "nobody.listens"})
	require.NoError(t, err)
	require.Equal(t, map[string]bool{"svc.do": true, "nobody.listens": false}, got)
}
