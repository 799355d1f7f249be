// Package transport defines how sagabox moves messages (package message)
// between services: the small Publisher and Subscriber interfaces that a
// broker adapter implements, and what a handler tells the adapter to do with
// a delivery. The RabbitMQ adapter lives in transport/rabbitmq; every adapter
// must pass the conformance suite in transport/transporttest.
//
// Delivery is at-least-once. Receivers make the effect happen once by
// recording the message id in their inbox (see package participant).
package transport

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sagabox/sagabox/message"
)

// Exchange returns the logical exchange a message of kind k is published
// to: "commands" for commands and compensations, "replies" for replies and
// "events" for events.
func Exchange(k message.Kind) string {
	switch k {
	case message.KindCommand, message.KindCompensation:
		return ExchangeCommands
	case message.KindReplySuccess, message.KindReplyFailure:
		return ExchangeReplies
	default:
		return ExchangeEvents
	}
}

// Logical exchange names. Adapters prefix them with their namespace.
const (
	ExchangeCommands = "commands"
	ExchangeReplies  = "replies"
	ExchangeEvents   = "events"
)

// Publisher sends messages to the broker.
type Publisher interface {
	// Publish sends msgs, pipelined, and returns once the broker has confirmed
	// or refused every one of them, or ctx is done. It returns nil only when
	// every message was confirmed. When only some failed it returns a
	// *PublishError naming them; any other error means none can be assumed
	// published. A message that cannot be routed to any queue is an error.
	Publish(ctx context.Context, msgs ...message.Message) error
}

// ErrUnroutable marks the failure of a message no queue is bound for: the
// broker had nowhere to put it. Adapters wrap it in the per-message errors
// of a PublishError.
var ErrUnroutable = errors.New("transport: message unroutable")

// ErrPermanent marks an error that repeating the call repeats: an invalid
// QueueSpec, or a broker that refuses the request (a queue that exists with
// other arguments, no permission). Other errors of Declare and Subscribe
// are the broker's absence or restart, which waiting cures.
var ErrPermanent = errors.New("transport: permanent failure")

// PublishError reports the messages of a batch that were not confirmed.
// Messages not listed in Failed were confirmed by the broker.
type PublishError struct {
	// Failed maps the index of each unconfirmed message in the batch to why.
	Failed map[int]error
}

// Error implements error.
func (e *PublishError) Error() string {
	first := -1
	for i := range e.Failed {
		if first < 0 || i < first {
			first = i
		}
	}
	if first < 0 {
		return "publish: batch not confirmed"
	}
	return fmt.Sprintf("publish: %d of the batch not confirmed (first, message %d: %v)", len(e.Failed), first, e.Failed[first])
}

// Confirmed reports which of n messages of a batch were confirmed, given the
// error Publish returned for it.
func Confirmed(n int, err error) []bool {
	ok := make([]bool, n)
	if err == nil {
		for i := range ok {
			ok[i] = true
		}
		return ok
	}
	var pe *PublishError
	if errors.As(err, &pe) {
		for i := range ok {
			_, failed := pe.Failed[i]
			ok[i] = !failed
		}
	}
	return ok
}

// Action is what a Subscriber does with a delivery once its handler returns.
type Action int

// The possible actions.
const (
	// ActionAck removes the message from the queue.
	ActionAck Action = iota
	// ActionRetry returns the message to the queue after Outcome.Delay,
	// holding nothing meanwhile (see Retry).
	ActionRetry
	// ActionDeadLetter moves the message to the queue's dead-letter queue with
	// Outcome.Reason recorded, then removes it from the queue.
	ActionDeadLetter
)

// Outcome is a handler's verdict on one delivery.
type Outcome struct {
	Action Action
	// Delay is the least time before the message is delivered again
	// (ActionRetry only); 0 returns it to its queue at once.
	Delay time.Duration
	// Reason is recorded with a dead-lettered message (ActionDeadLetter only).
	Reason string
}

// Ack returns the outcome that removes a handled message from the queue.
func Ack() Outcome { return Outcome{Action: ActionAck} }

// Retry returns the outcome that redelivers a message after delay.
//
// With delay 0 the message goes back to its queue at once. With a positive
// delay the subscriber holds neither the message nor a handler goroutine
// while it waits, so the other messages of the queue keep flowing: the
// message is parked by the broker and comes back no sooner than delay (a
// backend may round delay up to one of a few fixed steps; the RabbitMQ
// adapter uses 1s, 5s, 30s and 2m), with Delivery.Redelivered set and
// Delivery.Retries one higher. As with any redelivery, the message may also
// come back twice; receivers deduplicate on its MessageID.
func Retry(delay time.Duration) Outcome { return Outcome{Action: ActionRetry, Delay: delay} }

// DeadLetter returns the outcome that moves a message to the dead-letter queue
// with reason recorded.
func DeadLetter(reason string) Outcome { return Outcome{Action: ActionDeadLetter, Reason: reason} }

// Delivery is a message received from a queue.
type Delivery struct {
	message.Message
	// Queue is the logical queue name the message was consumed from.
	Queue string
	// Redelivered is true when the message may have been delivered before:
	// the broker says so, or it comes back from a delayed Retry.
	Redelivered bool
	// Retries is how many times the message was sent back with a delayed
	// Retry before this delivery; 0 on its first delivery. Redeliveries by
	// the broker (Retry(0), a lost connection) do not count.
	Retries int
}

// Handler processes deliveries. It must be safe for concurrent use: a
// subscriber calls it from several goroutines.
type Handler interface {
	HandleDelivery(ctx context.Context, d *Delivery) Outcome
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, d *Delivery) Outcome

// HandleDelivery calls f(ctx, d).
func (f HandlerFunc) HandleDelivery(ctx context.Context, d *Delivery) Outcome { return f(ctx, d) }

// QueueSpec describes one service's queue and what is routed to it.
type QueueSpec struct {
	// Name is the logical queue name, usually the service name ("inventory").
	Name string
	// Commands lists the command and compensation types routed to the queue.
	Commands []string
	// Replies routes replies whose routing key is Name to the queue.
	Replies bool
	// Events lists event type patterns routed to the queue ("order.*").
	Events []string
}

// BatchHandler is a Handler that can also take several deliveries at once,
// so that it can apply them together (in one database transaction). A
// Subscriber hands batches to a BatchHandler when SubscribeOpts.MaxBatch is
// above 1.
type BatchHandler interface {
	Handler
	// HandleBatch handles ds and returns one outcome per delivery, in the
	// order of ds.
	HandleBatch(ctx context.Context, ds []*Delivery) []Outcome
}

// DefaultLinger is the default of SubscribeOpts.Linger.
const DefaultLinger = 2 * time.Millisecond

// SubscribeOpts tunes one subscription. A nil *SubscribeOpts uses defaults.
type SubscribeOpts struct {
	// Concurrency is how many deliveries (or batches) are handled at once.
	// Defaults to 1.
	Concurrency int
	// Prefetch is how many unacknowledged deliveries the broker may hand out.
	// Defaults to 2 × Concurrency, and to at least 2 × MaxBatch ×
	// Concurrency when batching.
	Prefetch int
	// MaxBatch, above 1 with a BatchHandler, is the most deliveries handed
	// to it at once. A batch goes to the first of the Concurrency handlers
	// that is free and holds the deliveries that came while all were busy,
	// so that batches grow with the load by themselves; once deliveries
	// come faster than one at a time (the previous batch had several, or
	// more are waiting now), it also waits up to Linger for more. An idle
	// queue's deliveries are handled one by one, at once. Concurrent
	// batches settle only their own deliveries. Defaults to 1 (no
	// batching).
	MaxBatch int
	// Linger bounds how long a batch waits for more deliveries. Defaults to
	// DefaultLinger (2ms).
	Linger time.Duration
}

// Subscriber consumes queues.
type Subscriber interface {
	// Declare creates the queue described by spec, its bindings, its
	// dead-letter queue and whatever the backend needs to delay retries. It
	// is idempotent.
	Declare(ctx context.Context, spec QueueSpec) error
	// Subscribe declares spec and hands each delivery to h until ctx is
	// cancelled, then waits for the handlers in flight and returns nil.
	// It survives broker restarts and closed connections on its own. A
	// delivery whose envelope cannot be decoded never reaches h: it is
	// dead-lettered with the reason.
	Subscribe(ctx context.Context, spec QueueSpec, h Handler, opts *SubscribeOpts) error
}

// Availability is implemented by a Broker that knows whether it is
// connected. The orchestrator stops its step timeouts from running while
// the broker is away: a participant cannot answer through a broker that is
// down, and its reply may be waiting in its outbox.
type Availability interface {
	// Unavailable returns since when the broker has been unreachable, or the
	// zero time while it is connected.
	Unavailable() time.Time
}

// RouteChecker is implemented by a Broker that can tell whether a command
// would reach a queue, without any Handler seeing anything. A command no
// queue takes (its service not deployed, a typo in its name) is retried as
// unroutable for ever and its saga waits: the orchestrator checks its
// definitions' commands when it starts, and `sagabox doctor` those the
// schema's recorded definitions name.
type RouteChecker interface {
	// Routable reports, for each of commands (command and compensation
	// types: their routing keys on the commands exchange), whether a queue
	// takes it. The map has one entry per distinct command.
	Routable(ctx context.Context, commands []string) (map[string]bool, error)
}

// Broker is a Publisher and Subscriber over one connection.
type Broker interface {
	Publisher
	Subscriber
	// Close releases the connection. Calls in flight fail.
	Close() error
}
