package rabbitmq

import (
	"errors"
	"fmt"
	"math"
	"mime"
	"strings"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/transport"
)

// ContentType is the content type of every message body sagabox publishes.
const ContentType = "application/json"

// Header names of the envelope fields that have no AMQP property. User
// headers (Envelope.Headers) travel as HeaderUserPrefix + key.
const (
	HeaderVersion     = "x-sagabox-version"
	HeaderKind        = "x-sagabox-kind"
	HeaderSagaID      = "x-sagabox-saga-id"
	HeaderSagaType    = "x-sagabox-saga-type"
	HeaderStep        = "x-sagabox-step"
	HeaderStepIndex   = "x-sagabox-step-index"
	HeaderAttempt     = "x-sagabox-attempt"
	HeaderRun         = "x-sagabox-run"
	HeaderCreatedAt   = "x-sagabox-created-at"
	HeaderTraceParent = "traceparent"
	HeaderTraceState  = "tracestate"
	HeaderUserPrefix  = "x-sagabox-header-"

	// HeaderRetries and HeaderRoutingKey are set on the copy of a message
	// that a delayed Retry parks in a retry queue: how many delayed retries
	// the message has had (transport.Delivery.Retries), and the routing key
	// it was first published with, which dead-lettering out of the retry
	// queue replaces.
	HeaderRetries    = "x-sagabox-retries"
	HeaderRoutingKey = "x-sagabox-routing-key"

	// HeaderDeadLetterReason, HeaderDeadLetterQueue and HeaderDeadLetterAt
	// are added to a message copied to a dead-letter queue.
	HeaderDeadLetterReason = "x-sagabox-dead-letter-reason"
	HeaderDeadLetterQueue  = "x-sagabox-dead-letter-queue"
	HeaderDeadLetterAt     = "x-sagabox-dead-letter-at"
)

// EncodeMessage maps a message to an AMQP publishing: the ids go to AMQP
// properties, the other envelope fields to headers, the payload to the body.
// The publishing is persistent. A message is validated once, when it is
// written to an outbox (message.Message.Prepare); EncodeMessage checks only
// what the mapping itself needs, and fails when the message id, type or
// payload is missing or a user header key is reserved.
func EncodeMessage(m message.Message) (amqp.Publishing, error) {
	switch {
	case m.MessageID == uuid.Nil:
		return amqp.Publishing{}, errors.New("message id is missing")
	case m.Type == "":
		return amqp.Publishing{}, fmt.Errorf("message %s: type is missing", m.MessageID)
	case len(m.Payload) == 0:
		return amqp.Publishing{}, fmt.Errorf("message %s: payload is empty", m.MessageID)
	}
	h := amqp.Table{
		HeaderVersion:   int64(m.Version),
		HeaderKind:      string(m.Kind),
		HeaderStepIndex: int64(m.StepIndex),
		HeaderAttempt:   int64(m.Attempt),
	}
	if m.SagaID != uuid.Nil {
		h[HeaderSagaID] = m.SagaID.String()
	}
	if m.Run > 0 {
		h[HeaderRun] = int64(m.Run)
	}
	setString(h, HeaderSagaType, m.SagaType)
	setString(h, HeaderStep, m.Step)
	setString(h, HeaderTraceParent, m.TraceParent)
	setString(h, HeaderTraceState, m.TraceState)
	var ts time.Time
	if !m.CreatedAt.IsZero() {
		h[HeaderCreatedAt] = m.CreatedAt.UTC().Format(time.RFC3339Nano)
		ts = m.CreatedAt.UTC().Truncate(time.Second)
	}
	for k, v := range m.Headers {
		if k == "" || strings.HasPrefix(k, message.ReservedHeaderPrefix) {
			return amqp.Publishing{}, fmt.Errorf("message %s: header key %q is empty or reserved (%s)", m.MessageID, k, message.ReservedHeaderPrefix)
		}
		h[HeaderUserPrefix+k] = v
	}
	return amqp.Publishing{
		Headers:       h,
		ContentType:   ContentType,
		DeliveryMode:  amqp.Persistent,
		CorrelationId: m.CorrelationID,
		ReplyTo:       m.ReplyTo,
		MessageId:     m.MessageID.String(),
		Timestamp:     ts,
		Type:          m.Type,
		Body:          m.Payload,
	}, nil
}

func setString(h amqp.Table, k, v string) {
	if v != "" {
		h[k] = v
	}
}

// DecodeDelivery maps an AMQP delivery back to a transport.Delivery (its
// Queue left empty). A message back from a retry queue gets its first
// routing key (HeaderRoutingKey), its Retries count (HeaderRetries) and
// Redelivered set. It rejects, with an error a person can act on: an empty
// body, a content type other than application/json, a missing or malformed
// message id, a missing type, an envelope or retry header of the wrong type,
// an unknown envelope version and an envelope that fails
// message.Envelope.Validate. The body itself is not parsed here: the
// receiver decodes it once, strictly, into the type it expects, and treats a
// body that is not that JSON as poison.
func DecodeDelivery(d amqp.Delivery) (*transport.Delivery, error) {
	if len(d.Body) == 0 {
		return nil, errors.New("body is empty")
	}
	if d.ContentType == "" {
		return nil, fmt.Errorf("content_type is missing (want %s)", ContentType)
	}
	if mt, _, err := mime.ParseMediaType(d.ContentType); err != nil || mt != ContentType {
		return nil, fmt.Errorf("content_type %s is not %s", quote(d.ContentType), ContentType)
	}
	if d.MessageId == "" {
		return nil, errors.New("message_id is missing")
	}
	id, err := uuid.Parse(d.MessageId)
	if err != nil || id == uuid.Nil {
		return nil, fmt.Errorf("message_id %s is not a UUID", quote(d.MessageId))
	}
	if strings.TrimSpace(d.Type) == "" {
		return nil, errors.New("type is missing")
	}

	h := headerReader{t: d.Headers}
	version, ok := h.int(HeaderVersion)
	if !ok && h.err == nil {
		return nil, fmt.Errorf("header %s is missing: not a sagabox envelope", HeaderVersion)
	}
	if h.err == nil && (version < 1 || version > message.Version) {
		return nil, fmt.Errorf("envelope version %d is not supported (this receiver reads 1..%d)", version, message.Version)
	}
	env := message.Envelope{
		Version:       version,
		MessageID:     id,
		Type:          d.Type,
		RoutingKey:    d.RoutingKey,
		ReplyTo:       d.ReplyTo,
		CorrelationID: d.CorrelationId,
	}
	kind, _ := h.string(HeaderKind)
	env.Kind = message.Kind(kind)
	if s, ok := h.string(HeaderSagaID); ok {
		sid, err := uuid.Parse(s)
		if err != nil {
			return nil, fmt.Errorf("header %s %s is not a UUID", HeaderSagaID, quote(s))
		}
		env.SagaID = sid
	}
	env.SagaType, _ = h.string(HeaderSagaType)
	env.Step, _ = h.string(HeaderStep)
	env.StepIndex, _ = h.int(HeaderStepIndex)
	env.Attempt, _ = h.int(HeaderAttempt)
	env.Run, _ = h.int(HeaderRun)
	env.TraceParent, _ = h.string(HeaderTraceParent)
	env.TraceState, _ = h.string(HeaderTraceState)
	if rk, ok := h.string(HeaderRoutingKey); ok {
		env.RoutingKey = rk
	}
	retries, _ := h.int(HeaderRetries)
	if retries < 0 {
		return nil, fmt.Errorf("header %s %d is negative", HeaderRetries, retries)
	}
	if s, ok := h.string(HeaderCreatedAt); ok {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return nil, fmt.Errorf("header %s %s is not an RFC 3339 time", HeaderCreatedAt, quote(s))
		}
		env.CreatedAt = t.UTC()
	} else if !d.Timestamp.IsZero() {
		env.CreatedAt = d.Timestamp.UTC()
	}
	for k := range d.Headers {
		user, found := strings.CutPrefix(k, HeaderUserPrefix)
		if !found {
			continue
		}
		if user == "" || strings.HasPrefix(user, message.ReservedHeaderPrefix) {
			return nil, fmt.Errorf("header %s: user header key is empty or reserved", quote(k))
		}
		v, _ := h.string(k)
		if env.Headers == nil {
			env.Headers = make(map[string]string)
		}
		env.Headers[user] = v
	}
	if h.err != nil {
		return nil, h.err
	}
	if err := env.Validate(); err != nil {
		return nil, fmt.Errorf("invalid envelope: %w", err)
	}
	return &transport.Delivery{
		Message:     message.Message{Envelope: env, Payload: d.Body},
		Redelivered: d.Redelivered || retries > 0,
		Retries:     retries,
	}, nil
}

// headerReader reads typed header values, remembering the first type error.
type headerReader struct {
	t   amqp.Table
	err error
}

func (h *headerReader) string(k string) (string, bool) {
	v, ok := h.t[k]
	if !ok || v == nil {
		return "", false
	}
	switch v := v.(type) {
	case string:
		return v, true
	case []byte:
		return string(v), true
	}
	h.fail(k, v, "a string")
	return "", false
}

func (h *headerReader) int(k string) (int, bool) {
	v, ok := h.t[k]
	if !ok || v == nil {
		return 0, false
	}
	var n int64
	switch v := v.(type) {
	case int:
		n = int64(v)
	case int8:
		n = int64(v)
	case int16:
		n = int64(v)
	case int32:
		n = int64(v)
	case int64:
		n = v
	case uint8:
		n = int64(v)
	case uint16:
		n = int64(v)
	case uint32:
		n = int64(v)
	default:
		h.fail(k, v, "an integer")
		return 0, false
	}
	if n > math.MaxInt32 || n < math.MinInt32 {
		if h.err == nil {
			h.err = fmt.Errorf("header %s value %d is out of range", k, n)
		}
		return 0, false
	}
	return int(n), true
}

func (h *headerReader) fail(k string, v any, want string) {
	if h.err == nil {
		h.err = fmt.Errorf("header %s has type %T, want %s", k, v, want)
	}
}

// quote quotes s for an error message, shortened so that a huge or binary
// value keeps the message readable.
func quote(s string) string {
	const limit = 64
	if len(s) > limit {
		return fmt.Sprintf("%q…", s[:limit])
	}
	return fmt.Sprintf("%q", s)
}
