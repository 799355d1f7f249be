// Package transport defines how sagabox moves messages between services: the
// message envelope that every command, compensation, reply and event carries,
// and the small Publisher and Subscriber interfaces that a broker adapter
// implements. The RabbitMQ adapter lives in transport/rabbitmq; every adapter
// must pass the conformance suite in transport/transporttest.
//
// Delivery is at-least-once. Receivers make the effect happen once by
// recording Envelope.MessageID in their inbox (see package participant).
package transport

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
)

// EnvelopeVersion is the version of the envelope layout written by this
// package. Receivers reject envelopes with a higher version than they know.
const EnvelopeVersion = 1

// Kind says what role a message plays. It decides which exchange carries it
// and how a receiver treats it.
type Kind string

// The kinds of message sagabox sends.
const (
	// KindCommand asks a participant to perform a saga step's action.
	KindCommand Kind = "command"
	// KindCompensation asks a participant to undo a step's action.
	KindCompensation Kind = "compensation"
	// KindReplySuccess reports that a command or compensation succeeded.
	KindReplySuccess Kind = "reply-success"
	// KindReplyFailure reports that a command was rejected or a compensation
	// could not be performed.
	KindReplyFailure Kind = "reply-failure"
	// KindEvent is a plain domain event, outside of any saga.
	KindEvent Kind = "event"
)

// Valid reports whether k is one of the known kinds.
func (k Kind) Valid() bool {
	switch k {
	case KindCommand, KindCompensation, KindReplySuccess, KindReplyFailure, KindEvent:
		return true
	}
	return false
}

// IsReply reports whether k is a success or failure reply.
func (k Kind) IsReply() bool { return k == KindReplySuccess || k == KindReplyFailure }

// Envelope is the metadata of a message. It is set once when the message is
// written to an outbox and never changes on redelivery.
type Envelope struct {
	// Version is the envelope layout version; EnvelopeVersion when written.
	Version int
	// MessageID identifies the message; receivers deduplicate on it.
	MessageID uuid.UUID
	// Type is the stable message name, e.g. "inventory.reserve".
	Type string
	// Kind is the role of the message.
	Kind Kind
	// RoutingKey selects the receiving queue. For commands, compensations and
	// events it is normally Type; for replies it is the ReplyTo of the command.
	RoutingKey string
	// SagaID is the saga the message belongs to; uuid.Nil for plain events.
	SagaID uuid.UUID
	// SagaType is the saga definition name.
	SagaType string
	// Step is the saga step name.
	Step string
	// StepIndex is the position of the step in its definition.
	StepIndex int
	// Attempt is the attempt number of the command (1 for the first send).
	Attempt int
	// ReplyTo is the routing key replies to this message must be sent with.
	ReplyTo string
	// CorrelationID ties a reply to the message it answers (the command's
	// MessageID as a string).
	CorrelationID string
	// CreatedAt is when the message was written to the outbox.
	CreatedAt time.Time
	// TraceParent and TraceState carry the W3C trace context of the writer.
	TraceParent string
	TraceState  string
	// OrderingKey groups messages that must be published in the order they
	// were written. Empty means SagaID, or MessageID when there is no saga
	// (no ordering constraint).
	OrderingKey string
	// Headers holds additional string headers. Keys starting with "x-sagabox-"
	// are reserved.
	Headers map[string]string
}

// Message is an envelope and its JSON payload.
type Message struct {
	Envelope
	// Payload is the message body, a JSON document.
	Payload []byte
}

// Exchange returns the logical exchange a message of this kind is published
// to: "commands" for commands and compensations, "replies" for replies and
// "events" for events.
func (k Kind) Exchange() string {
	switch k {
	case KindCommand, KindCompensation:
		return ExchangeCommands
	case KindReplySuccess, KindReplyFailure:
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

// Validate checks that the envelope has everything a receiver needs. Its
// errors name the field at fault.
func (e *Envelope) Validate() error {
	var errs []error
	if e.Version < 1 || e.Version > EnvelopeVersion {
		errs = append(errs, fmt.Errorf("envelope version %d not supported (want 1..%d)", e.Version, EnvelopeVersion))
	}
	if e.MessageID == uuid.Nil {
		errs = append(errs, errors.New("message_id is missing"))
	}
	if strings.TrimSpace(e.Type) == "" {
		errs = append(errs, errors.New("type is missing"))
	}
	if !e.Kind.Valid() {
		errs = append(errs, fmt.Errorf("kind %q is not one of command, compensation, reply-success, reply-failure, event", e.Kind))
	}
	if e.Kind == KindCommand || e.Kind == KindCompensation || e.Kind.IsReply() {
		if e.SagaID == uuid.Nil {
			errs = append(errs, fmt.Errorf("saga_id is missing on a %s", e.Kind))
		}
		if e.Step == "" {
			errs = append(errs, fmt.Errorf("step is missing on a %s", e.Kind))
		}
	}
	if e.StepIndex < 0 {
		errs = append(errs, fmt.Errorf("step_index %d is negative", e.StepIndex))
	}
	return errors.Join(errs...)
}

// Publisher sends messages to the broker.
type Publisher interface {
	// Publish sends msgs, pipelined, and returns once the broker has confirmed
	// or refused every one of them, or ctx is done. It returns nil only when
	// every message was confirmed. When only some failed it returns a
	// *PublishError naming them; any other error means none can be assumed
	// published. A message that cannot be routed to any queue is an error.
	Publish(ctx context.Context, msgs ...Message) error
}

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
	Message
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

// SubscribeOpts tunes one subscription. A nil *SubscribeOpts uses defaults.
type SubscribeOpts struct {
	// Concurrency is how many deliveries are handled at once. Defaults to 1.
	Concurrency int
	// Prefetch is how many unacknowledged deliveries the broker may hand out.
	// Defaults to 2 × Concurrency.
	Prefetch int
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

// Broker is a Publisher and Subscriber over one connection.
type Broker interface {
	Publisher
	Subscriber
	// Close releases the connection. Calls in flight fail.
	Close() error
}
