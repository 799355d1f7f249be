package rabbitmq_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"

	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/internal/testkit/telemetrytest"
	"github.com/sagabox/sagabox/transport"
	"github.com/sagabox/sagabox/transport/rabbitmq"
	"github.com/sagabox/sagabox/transport/transporttest"
)

func TestRetryQueueNames(t *testing.T) {
	t.Parallel()
	require.Equal(t, []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute}, rabbitmq.RetryDelays())
	ns := amqptest.Namespace(t)
	b := amqptest.NewBroker(t, rabbitmq.Config{Namespace: ns})
	for delay, want := range map[time.Duration]string{
		time.Millisecond:               "inventory.retry.1s",
		time.Second:                    "inventory.retry.1s",
		time.Second + time.Millisecond: "inventory.retry.5s",
		5 * time.Second:                "inventory.retry.5s",
		16 * time.Second:               "inventory.retry.30s",
		30 * time.Second:               "inventory.retry.30s",
		31 * time.Second:               "inventory.retry.2m",
		time.Hour:                      "inventory.retry.2m",
	} {
		require.Equal(t, ns+"."+want, b.RetryQueueName("inventory", delay), "delay %s", delay)
	}
	for _, name := range []string{"inventory.retry.1s", "inventory.retry.2m"} {
		err := b.Declare(testCtx(t), transport.QueueSpec{Name: name})
		require.ErrorContains(t, err, "must not end in .retry.", name)
	}
}

// TestRetryQueuesDeclared checks the retry queues of both queue types: they
// exist, are durable with the queue type asked for, and a message parked in
// one expires back into its service queue.
func TestRetryQueuesDeclared(t *testing.T) {
	t.Parallel()
	for _, qt := range []rabbitmq.QueueType{rabbitmq.QueueTypeQuorum, rabbitmq.QueueTypeClassic} {
		t.Run(string(qt), func(t *testing.T) {
			t.Parallel()
			b := amqptest.NewBroker(t, rabbitmq.Config{QueueType: qt})
			ctx := testCtx(t)
			require.NoError(t, b.Declare(ctx, spec))
			ch, err := amqptest.Dial(t).Channel()
			require.NoError(t, err)
			for _, d := range rabbitmq.RetryDelays() {
				// A passive declare fails (and closes the channel) when the
				// queue is missing.
				_, err := ch.QueueDeclarePassive(b.RetryQueueName(spec.Name, d), true, false, false, false, nil)
				require.NoError(t, err, "retry queue %s", b.RetryQueueName(spec.Name, d))
			}
			// Re-declaring with the same arguments is accepted (reconnects
			// do it); another type would not be.
			require.NoError(t, b.Declare(ctx, spec))

			msg := transporttest.Command("svc.do")
			p, err := rabbitmq.EncodeMessage(msg)
			require.NoError(t, err)
			amqptest.PublishRaw(t, "", b.RetryQueueName(spec.Name, time.Second), p)
			back := amqptest.Next(t, amqptest.Consume(t, b.QueueName(spec.Name)), wait)
			require.Equal(t, msg.MessageID.String(), back.MessageId)
		})
	}
}

// TestDelayedRetryParksACopy looks at the copy a delayed Retry parks: it is
// in the retry queue of the smallest delay not below the one asked for, and
// carries the original body, properties and headers, the retry count and the
// first routing key.
func TestDelayedRetryParksACopy(t *testing.T) {
	t.Parallel()
	b := amqptest.NewBroker(t, rabbitmq.Config{})
	ctx := testCtx(t)
	require.NoError(t, b.Declare(ctx, spec))
	msg := transporttest.Command("svc.do")
	require.NoError(t, b.Publish(ctx, msg))
	want, err := rabbitmq.EncodeMessage(msg)
	require.NoError(t, err)

	handled := make(chan *transport.Delivery, 4)
	runSubscriber(t, b, spec, transport.HandlerFunc(func(_ context.Context, d *transport.Delivery) transport.Outcome {
		handled <- d
		return transport.Retry(2 * time.Second) // the 5s queue
	}), nil)
	first := next(t, handled)
	require.Zero(t, first.Retries)

	// Taking the copy from the retry queue stops it from coming back.
	parked := amqptest.Next(t, amqptest.Consume(t, b.RetryQueueName(spec.Name, 5*time.Second)), wait)
	require.Equal(t, want.MessageId, parked.MessageId)
	require.Equal(t, want.Body, parked.Body)
	require.Equal(t, want.Type, parked.Type)
	require.Equal(t, want.CorrelationId, parked.CorrelationId)
	require.Equal(t, want.ReplyTo, parked.ReplyTo)
	require.Equal(t, want.ContentType, parked.ContentType)
	require.Equal(t, amqp.Persistent, parked.DeliveryMode)
	for k, v := range want.Headers {
		require.Equal(t, v, parked.Headers[k], "header %s", k)
	}
	require.EqualValues(t, 1, parked.Headers[rabbitmq.HeaderRetries])
	require.Equal(t, "svc.do", parked.Headers[rabbitmq.HeaderRoutingKey])
	require.Zero(t, amqptest.QueueLength(t, b.QueueName(spec.Name)), "the original was acknowledged")
}

// TestDelayedRetryFallsBackToRequeue: when the copy cannot be parked (here
// its retry queue was deleted, so the copy is unroutable) the message is
// returned to its queue instead, never lost.
func TestDelayedRetryFallsBackToRequeue(t *testing.T) {
	t.Parallel()
	b := amqptest.NewBroker(t, rabbitmq.Config{})
	ctx := testCtx(t)
	require.NoError(t, b.Declare(ctx, spec))
	msg := transporttest.Command("svc.do")
	require.NoError(t, b.Publish(ctx, msg))
	raw, err := amqptest.Dial(t).Channel()
	require.NoError(t, err)

	var calls atomic.Int32
	handled := make(chan *transport.Delivery, 4)
	runSubscriber(t, b, spec, transport.HandlerFunc(func(_ context.Context, d *transport.Delivery) transport.Outcome {
		handled <- d
		if calls.Add(1) == 1 {
			// Subscribe declared the retry queues before consuming.
			if _, err := raw.QueueDelete(b.RetryQueueName(spec.Name, time.Second), false, false, false); err != nil {
				t.Errorf("delete the retry queue: %v", err)
			}
			return transport.Retry(10 * time.Millisecond)
		}
		return transport.Ack()
	}), nil)
	first, second := next(t, handled), next(t, handled)
	require.Equal(t, msg.MessageID, first.MessageID)
	require.Equal(t, msg.MessageID, second.MessageID)
	require.True(t, second.Redelivered, "returned by the broker")
	require.Zero(t, second.Retries, "not through a retry queue")
}

// TestDelayedRetryDeliveryLimit: on a quorum queue with a DeliveryLimit, a
// message retried that many times with a delay is dead-lettered by the
// adapter, as the broker does for redeliveries it counts.
func TestDelayedRetryDeliveryLimit(t *testing.T) {
	t.Parallel()
	meter := telemetrytest.NewMeter(t)
	b := amqptest.NewBroker(t, rabbitmq.Config{QueueType: rabbitmq.QueueTypeQuorum, DeliveryLimit: 1, MeterProvider: meter.Provider})
	ctx := testCtx(t)
	require.NoError(t, b.Declare(ctx, spec))
	dls := amqptest.Consume(t, b.DeadLetterQueueName(spec.Name))
	msg := transporttest.Command("svc.do")
	require.NoError(t, b.Publish(ctx, msg))

	handled := make(chan *transport.Delivery, 4)
	runSubscriber(t, b, spec, transport.HandlerFunc(func(_ context.Context, d *transport.Delivery) transport.Outcome {
		handled <- d
		return transport.Retry(time.Millisecond)
	}), nil)
	dl := amqptest.Next(t, dls, wait)
	require.Equal(t, msg.MessageID.String(), dl.MessageId)
	reason, _ := dl.Headers[rabbitmq.HeaderDeadLetterReason].(string)
	require.True(t, strings.HasPrefix(reason, "delivery limit reached: retried 1 times"), "reason %q", reason)
	require.Equal(t, 0, next(t, handled).Retries)
	require.Equal(t, 1, next(t, handled).Retries)
	require.EqualValues(t, 1, meter.Collect(t).Sum("sagabox.dead_letters",
		attribute.String("sagabox.component", "rabbitmq"), attribute.String("sagabox.dead_letter.reason", "delivery_limit")))
}

func next(t *testing.T, ch <-chan *transport.Delivery) *transport.Delivery {
	t.Helper()
	select {
	case d := <-ch:
		return d
	case <-time.After(wait):
		t.Fatal("no delivery in time")
		return nil
	}
}
