package rabbitmq

import (
	"context"

	amqp "github.com/rabbitmq/amqp091-go"
)

// NewWithBlockedHook is New with the connection's blocked notifications
// read from hook instead of from RabbitMQ, so that tests can simulate a
// broker alarm without raising one for every connection on the broker.
func NewWithBlockedHook(ctx context.Context, cfg Config, hook chan amqp.Blocking) (*Broker, error) {
	return newBroker(ctx, cfg, hook)
}

// Validate exposes Config.validate.
func (c Config) Validate() error { return c.validate() }

// Backoff exposes backoff.
var Backoff = backoff
