package rabbitmq_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/transport/rabbitmq"
	"github.com/sagabox/sagabox/transport/transporttest"
)

const benchBatch = 500

// BenchmarkPublishPipelinedConfirms publishes batches of 500 messages in one
// Publish call each: all sent, then all confirms awaited.
func BenchmarkPublishPipelinedConfirms(b *testing.B) {
	for _, qt := range []rabbitmq.QueueType{rabbitmq.QueueTypeQuorum, rabbitmq.QueueTypeClassic} {
		b.Run(string(qt), func(b *testing.B) { benchPublish(b, qt, benchBatch) })
	}
}

// BenchmarkPublishOneByOne is the baseline: the same 500 messages, one
// Publish call (one confirm round trip) each.
func BenchmarkPublishOneByOne(b *testing.B) {
	for _, qt := range []rabbitmq.QueueType{rabbitmq.QueueTypeQuorum, rabbitmq.QueueTypeClassic} {
		b.Run(string(qt), func(b *testing.B) { benchPublish(b, qt, 1) })
	}
}

func benchPublish(b *testing.B, qt rabbitmq.QueueType, perCall int) {
	br := amqptest.NewBroker(b, rabbitmq.Config{QueueType: qt})
	ctx := context.Background()
	require.NoError(b, br.Declare(ctx, spec))
	ch, err := amqptest.Dial(b).Channel()
	require.NoError(b, err)
	msgs := make([]message.Message, benchBatch)
	for i := range msgs {
		msgs[i] = transporttest.Command("svc.do")
		msgs[i].Payload = fmt.Appendf(nil, `{"order_id":"ord-%06d","sku":"A-1","qty":2,"note":"benchmark payload of a typical command"}`, i)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := 0; j < benchBatch; j += perCall {
			if err := br.Publish(ctx, msgs[j:j+perCall]...); err != nil {
				b.Fatal(err)
			}
		}
		if i%20 == 19 {
			b.StopTimer()
			_, err := ch.QueuePurge(br.QueueName(spec.Name), false)
			require.NoError(b, err)
			b.StartTimer()
		}
	}
	b.ReportMetric(float64(b.N*benchBatch)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkPublishConcurrentCallers measures several callers (relays)
// publishing batches of 50 at once, by size of the confirm-channel pool.
func BenchmarkPublishConcurrentCallers(b *testing.B) {
	for _, chans := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("channels=%d", chans), func(b *testing.B) {
			br := amqptest.NewBroker(b, rabbitmq.Config{PublishChannels: chans})
			ctx := context.Background()
			require.NoError(b, br.Declare(ctx, spec))
			const batch = 50
			b.SetParallelism(2) // 2 × GOMAXPROCS callers
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				msgs := make([]message.Message, batch)
				for pb.Next() {
					for i := range msgs {
						msgs[i] = transporttest.Command("svc.do")
					}
					if err := br.Publish(ctx, msgs...); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}
