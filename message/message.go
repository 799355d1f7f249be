// Package message is sagabox's message model: the envelope every command,
// compensation, reply and event carries, its kinds and version, its
// validation, and the sentinel errors shared by every package. It imports
// nothing else of sagabox's; transport, store and both clients speak in its
// types, so that one message keeps one shape from the outbox row to the
// handler.
//
// A message is completed and validated once on each side: Prepare when it is
// written to an outbox, Envelope.Validate when a broker adapter decodes it.
package message

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Version is the version of the envelope layout written by this package.
// Receivers reject envelopes with a higher version than they know.
const Version = 1

// ErrNotFound is wrapped by every error that reports a saga, message or
// other row that does not exist. Test for it with errors.Is.
var ErrNotFound = errors.New("not found")

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

// Phase is the phase of a saga step a command belongs to. Its values are
// those of saga.Phase.
type Phase string

// The phases of a step.
const (
	// PhaseAction: the step's action (a KindCommand message).
	PhaseAction Phase = "action"
	// PhaseCompensation: the step's compensation (a KindCompensation
	// message).
	PhaseCompensation Phase = "compensation"
)

// Phase returns the step phase of a command (PhaseAction) or compensation
// (PhaseCompensation), and "" for any other kind: a reply's phase is that
// of the message it answers.
func (k Kind) Phase() Phase {
	switch k {
	case KindCommand:
		return PhaseAction
	case KindCompensation:
		return PhaseCompensation
	}
	return ""
}

// KindOf returns the kind of the message that carries phase p of a step:
// KindCompensation for PhaseCompensation, KindCommand otherwise.
func KindOf(p Phase) Kind {
	if p == PhaseCompensation {
		return KindCompensation
	}
	return KindCommand
}

// Envelope is the metadata of a message. It is set once when the message is
// written to an outbox and never changes on redelivery.
type Envelope struct {
	// Version is the envelope layout version; Version when written.
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
	// Run is the run of the saga the command belongs to (saga.Instance.Run):
	// 0 until an operator restarts the saga. A participant keeps one barrier
	// mark per saga, run, step and phase; replies copy it.
	Run int
	// ReplyTo is the routing key replies to this message must be sent with.
	ReplyTo string
	// CorrelationID ties a reply to the message it answers (the command's
	// MessageID as a string).
	CorrelationID string
	// CreatedAt is when the message was written to the outbox.
	CreatedAt time.Time
	// TraceParent and TraceState carry the W3C trace context of the span
	// that wrote the message; set by whoever builds the message.
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

// Validate checks that the envelope has everything a receiver needs. Its
// errors name the field at fault.
func (e *Envelope) Validate() error {
	var errs []error
	if e.Version < 1 || e.Version > Version {
		errs = append(errs, fmt.Errorf("envelope version %d not supported (want 1..%d)", e.Version, Version))
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
	if e.Run < 0 {
		errs = append(errs, fmt.Errorf("run %d is negative", e.Run))
	}
	return errors.Join(errs...)
}

// Prepare fills in what the sender of m left empty and validates it; the
// outbox calls it once, when m is written. MessageID becomes a new UUIDv7
// (set here once, never changed on redelivery), Version the current one,
// CreatedAt now, RoutingKey the Type (but for replies, which need the
// ReplyTo of their command), OrderingKey the SagaID (or the MessageID
// without a saga), an empty Payload {}. The payload must be one valid JSON
// document; the trace context is the builder's to set.
func (m *Message) Prepare(now time.Time) error {
	if m.MessageID == uuid.Nil {
		id, err := uuid.NewV7()
		if err != nil {
			return fmt.Errorf("generate message id: %w", err)
		}
		m.MessageID = id
	}
	if m.Version == 0 {
		m.Version = Version
	}
	if m.CreatedAt.IsZero() {
		m.CreatedAt = now
	}
	if m.RoutingKey == "" && !m.Kind.IsReply() {
		m.RoutingKey = m.Type
	}
	if m.OrderingKey == "" {
		if m.SagaID != uuid.Nil {
			m.OrderingKey = m.SagaID.String()
		} else {
			m.OrderingKey = m.MessageID.String()
		}
	}
	if m.Payload == nil {
		m.Payload = []byte("{}")
	}
	if err := validJSON(m.Payload); err != nil {
		return err
	}
	if err := m.Validate(); err != nil {
		return err
	}
	if m.RoutingKey == "" {
		return errors.New("routing key is empty (a reply needs the ReplyTo of its command)")
	}
	for k := range m.Headers {
		if k == "" || strings.HasPrefix(k, ReservedHeaderPrefix) {
			return fmt.Errorf("header key %q is empty or reserved (%s)", k, ReservedHeaderPrefix)
		}
	}
	return nil
}

// ReservedHeaderPrefix starts the header keys that sagabox reserves for
// itself; Envelope.Headers may not use it.
const ReservedHeaderPrefix = "x-sagabox-"
