package rabbitmq_test

import (
	"context"
	"log"

	"github.com/sagabox/sagabox/transport"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

func Example() {
	ctx := context.Background()
	b, err := rabbitmq.New(ctx, rabbitmq.Config{
		URL:       "amqp://guest:guest@127.0.0.1:5672/",
		Namespace: "shop",
	})
	if err != nil {
		log.Fatal(err) // says how to start RabbitMQ if it is not running
	}
	defer func() { _ = b.Close() }()

	// The inventory service consumes its commands until ctx is cancelled.
	spec := transport.QueueSpec{Name: "inventory", Commands: []string{"inventory.reserve", "inventory.release"}}
	err = b.Subscribe(ctx, spec, transport.HandlerFunc(func(ctx context.Context, d *transport.Delivery) transport.Outcome {
		log.Printf("%s %s for saga %s", d.Kind, d.Type, d.SagaID)
		return transport.Ack()
	}), &transport.SubscribeOpts{Concurrency: 4})
	if err != nil {
		log.Fatal(err)
	}
}
