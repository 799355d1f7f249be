//go:build fault

package rabbitmq_test

import (
	"context"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/amqptest"
	"github.com/sagabox/sagabox/transport"
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
	var (
		mu        sync.Mutex
		confirmed []uuid.UUID
		failures  int
	)
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		after := 0
		for after < 30 {
			batch := make([]transport.Message, 5)
			for i := range batch {
				batch[i] = transporttest.Command("svc.do")
			}
			f := publishUntilConfirmed(ctx, t, b, batch)
			mu.Lock()
			failures += f
			for _, m := range batch {
				confirmed = append(confirmed, m.MessageID)
			}
			mu.Unlock()
			select {
			case <-restarted:
				after++
			default:
			}
			if ctx.Err() != nil {
				return
			}
		}
	}()

	got.waitFor(t, "traffic before the restart", func() bool { return got.len() >= 50 })
	amqptest.RestartBroker(t)
	close(restarted)
	<-pubDone

	mu.Lock()
	all := confirmed
	t.Logf("confirmed %d messages, %d failed Publish calls during the restart", len(all), failures)
	mu.Unlock()
	require.Positive(t, failures, "the restart was noticed by the publisher")
	got.waitFor(t, "every confirmed message consumed", func() bool { return got.missing(all) == 0 })
}
