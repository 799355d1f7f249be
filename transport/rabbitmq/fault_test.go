//go:build fault

package rabbitmq_test

import (
	"context"
	"errors"
	"os/exec"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/transport"
	"github.com/sagabox/sagabox/transport/rabbitmq"
	"github.com/sagabox/sagabox/transport/transporttest"
)

// TestGuaranteeNoLostMessageAcrossBrokerRestart restarts RabbitMQ
// (rabbitmqctl stop_app && start_app) while a publishing loop and a consumer
// run: both resume on their own and every confirmed message is consumed.
// It disturbs every connection on the broker: run it alone
// (go test -tags fault -run BrokerRestart).
func TestGuaranteeNoLostMessageAcrossBrokerRestart(t *testing.T) {
	cfg := amqptest.Config(t)
	b := amqptest.NewBroker(t, cfg)
	ctx := testCtx(t)
	require.NoError(t, b.Declare(ctx, spec))

	got := newIDSet()
	runSubscriber(t, b, spec, transport.HandlerFunc(func(_ context.Context, d *transport.Delivery) transport.Outcome {
		got.add(d.MessageID)
		return transport.Ack()
	}), &transport.SubscribeOpts{Concurrency: 4})

	restarted := make(chan struct{})
	var all []uuid.UUID
	var failures int
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		all, failures = publishThrough(ctx, t, b, restarted)
	}()

	got.waitFor(t, "traffic before the restart", func() bool { return got.len() >= 50 })
	amqptest.RestartBroker(t)
	close(restarted)
	<-pubDone

	t.Logf("confirmed %d messages, %d failed Publish calls during the restart", len(all), failures)
	require.Positive(t, failures, "the restart was noticed by the publisher")
	got.waitFor(t, "every confirmed message consumed", func() bool { return got.missing(all) == 0 })
}

// TestGuaranteeConsumptionContinuesUnderMemoryAlarm raises a real memory
// alarm (rabbitmqctl set_vm_memory_high_watermark 0), which makes RabbitMQ
// block every connection that publishes. Publishing fails fast with
// ErrBlocked, but the consumer, on its own connection, drains the queue and
// acknowledges everything while the alarm lasts: with one shared connection
// its acks would stall behind the block. It disturbs every publisher on the
// broker: run it alone.
func TestGuaranteeConsumptionContinuesUnderMemoryAlarm(t *testing.T) {
	cfg := amqptest.Config(t)
	b := amqptest.NewBroker(t, cfg)
	ctx := testCtx(t)
	require.NoError(t, b.Declare(ctx, spec))
	var backlog []message.Message
	for range 50 {
		backlog = append(backlog, transporttest.Command("svc.do"))
	}
	require.NoError(t, b.Publish(ctx, backlog...))

	watermark := func(v string) {
		t.Helper()
		out, err := exec.Command("rabbitmqctl", "set_vm_memory_high_watermark", v).CombinedOutput()
		require.NoError(t, err, "rabbitmqctl set_vm_memory_high_watermark %s: %s", v, out)
	}
	watermark("0")
	t.Cleanup(func() { watermark("0.4") })
	// Publishing fails fast once the broker has blocked the connection.
	require.Eventually(t, func() bool {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return errors.Is(b.Publish(pctx, transporttest.Command("svc.do")), rabbitmq.ErrBlocked)
	}, time.Minute, 100*time.Millisecond, "publishing is not blocked by the alarm")

	// One delivery at a time: each one after the first needs the previous
	// ack, so draining the backlog proves acks get through.
	got := newIDSet()
	runSubscriber(t, b, spec, transport.HandlerFunc(func(_ context.Context, d *transport.Delivery) transport.Outcome {
		got.add(d.MessageID)
		return transport.Ack()
	}), &transport.SubscribeOpts{Concurrency: 1, Prefetch: 1})
	got.waitFor(t, "the backlog to drain during the alarm", func() bool { return got.missing(msgIDs(backlog)) == 0 })
	require.Equal(t, 0, amqptest.QueueLength(t, b.QueueName(spec.Name)), "everything was acknowledged")

	watermark("0.4")
	require.Eventually(t, func() bool {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return b.Publish(pctx, transporttest.Command("svc.do")) == nil
	}, time.Minute, 100*time.Millisecond, "publishing resumes after the alarm")
}

func msgIDs(msgs []message.Message) []uuid.UUID {
	ids := make([]uuid.UUID, len(msgs))
	for i, m := range msgs {
		ids[i] = m.MessageID
	}
	return ids
}
