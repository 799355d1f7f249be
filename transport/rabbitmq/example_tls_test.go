package rabbitmq_test

import (
	"context"
	"log"

	"github.com/sagabox/sagabox/transport/rabbitmq"
)

// A broker over TLS: the URL is amqps://, and RabbitMQ's URI query
// parameters name the CA that verifies the broker and the client
// certificate it asks for. A certificate that does not verify fails New
// with the host, the CA and what to do.
func Example_tls() {
	b, err := rabbitmq.New(context.Background(), rabbitmq.Config{
		URL: "amqps://inventory:secret@rabbit.internal:5671/shop" +
			"?cacertfile=/etc/sagabox/rabbit-ca.pem&certfile=/etc/sagabox/inventory.pem&keyfile=/etc/sagabox/inventory.key",
		Namespace: "shop",
	})
	if err != nil {
		log.Fatal(err) // never shows the password: amqps://inventory:***@rabbit.internal:5671/shop?…
	}
	defer func() { _ = b.Close() }()
}
