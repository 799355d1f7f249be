package rabbitmq_test

import (
	"context"
	"sync"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/transport"
	"github.com/sagabox/sagabox/transport/rabbitmq"
	"github.com/sagabox/sagabox/transport/transporttest"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	for _, qt := range []rabbitmq.QueueType{rabbitmq.QueueTypeQuorum, rabbitmq.QueueTypeClassic} {
		t.Run(string(qt), func(t *testing.T) {
			t.Parallel()
			transporttest.Run(t, func(t *testing.T) transport.Broker {
				return newInspectable(t, rabbitmq.Config{QueueType: qt})
			})
		})
	}
}

// inspectable is a Broker with the transporttest.Inspector hooks, built on
// a raw connection of its own.
type inspectable struct {
	*rabbitmq.Broker
	t    *testing.T
	conn *amqp.Connection

	mu  sync.Mutex
	dls map[string]<-chan amqp.Delivery
}

var _ transporttest.Inspector = (*inspectable)(nil)

func newInspectable(t *testing.T, cfg rabbitmq.Config) *inspectable {
	b := amqptest.NewBroker(t, cfg)
	return &inspectable{
		Broker: b,
		t:      t,
		conn:   amqptest.Dial(t),
		dls:    map[string]<-chan amqp.Delivery{},
	}
}

func (in *inspectable) PublishRaw(_ context.Context, raw transporttest.RawMessage) error {
	p, err := rabbitmq.EncodeMessage(raw.Valid)
	if err != nil {
		return err
	}
	if raw.Body != nil {
		p.Body = raw.Body
	}
	if raw.ContentType != "" {
		p.ContentType = raw.ContentType
	}
	if raw.OmitMessageID {
		p.MessageId = ""
	}
	return amqptest.TryPublishRaw(in.conn, in.ExchangeName(transport.Exchange(raw.Valid.Kind)), raw.Valid.RoutingKey, p)
}

func (in *inspectable) NextDeadLetter(ctx context.Context, queue string) (transporttest.DeadLetter, error) {
	in.mu.Lock()
	ds, ok := in.dls[queue]
	if !ok {
		ds = amqptest.Consume(in.t, in.DeadLetterQueueName(queue))
		in.dls[queue] = ds
	}
	in.mu.Unlock()
	select {
	case d := <-ds:
		reason, _ := d.Headers[rabbitmq.HeaderDeadLetterReason].(string)
		return transporttest.DeadLetter{MessageID: d.MessageId, Type: d.Type, Reason: reason, Body: d.Body}, nil
	case <-ctx.Done():
		return transporttest.DeadLetter{}, ctx.Err()
	}
}
