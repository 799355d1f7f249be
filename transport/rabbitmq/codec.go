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
	id, err := checkProperties(d)
	if err != nil {
		return nil, err
	}
	h := &headerReader{t: d.Headers}
	env, err := h.envelope(d, id)
	if err != nil {
		return nil, err
	}
	retries, err := h.retries()
	if err != nil {
		return nil, err
	}
	if env.CreatedAt, err = h.createdAt(d.Timestamp); err != nil {
		return nil, err
	}
	if env.Headers, err = h.userHeaders(); err != nil {
		return nil, err
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

// checkProperties checks the body and the AMQP properties every sagabox
// message has (content type, message id, type) and returns the message id.
func checkProperties(d amqp.Delivery) (uuid.UUID, error) {
	if len(d.Body) == 0 {
		return uuid.Nil, errors.New("body is empty")
	}
	if d.ContentType == "" {
		return uuid.Nil, fmt.Errorf("content_type is missing (want %s)", ContentType)
	}
	if mt, _, err := mime.ParseMediaType(d.ContentType); err != nil || mt != ContentType {
		return uuid.Nil, fmt.Errorf("content_type %s is not %s", quote(d.ContentType), ContentType)
	}
	if d.MessageId == "" {
		return uuid.Nil, errors.New("message_id is missing")
	}
	id, err := uuid.Parse(d.MessageId)
	if err != nil || id == uuid.Nil {
		return uuid.Nil, fmt.Errorf("message_id %s is not a UUID", quote(d.MessageId))
	}
	if strings.TrimSpace(d.Type) == "" {
		return uuid.Nil, errors.New("type is missing")
	}
	return id, nil
}

// envelope reads the envelope of message id from d's properties and
// sagabox's headers: its version, checked, the saga fields, the trace
// context, and the first routing key of a message back from a retry queue.
// The creation time and the user headers are read on their own.
func (h *headerReader) envelope(d amqp.Delivery, id uuid.UUID) (message.Envelope, error) {
	version, err := h.version()
	if err != nil {
		return message.Envelope{}, err
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
	if env.SagaID, err = h.uuid(HeaderSagaID); err != nil {
		return message.Envelope{}, err
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
	return env, nil
}

// version reads the envelope version, which must be there and one this
// receiver reads. A version of the wrong type is left to h.err.
func (h *headerReader) version() (int, error) {
	version, ok := h.int(HeaderVersion)
	switch {
	case h.err != nil:
		return version, nil
	case !ok:
		return 0, fmt.Errorf("header %s is missing: not a sagabox envelope", HeaderVersion)
	case version < 1 || version > message.Version:
		return 0, fmt.Errorf("envelope version %d is not supported (this receiver reads 1..%d)", version, message.Version)
	}
	return version, nil
}

// retries reads how many delayed retries a message back from a retry queue
// had (0 for any other message).
func (h *headerReader) retries() (int, error) {
	retries, _ := h.int(HeaderRetries)
	if retries < 0 {
		return 0, fmt.Errorf("header %s %d is negative", HeaderRetries, retries)
	}
	return retries, nil
}

// createdAt reads the message's creation time, in UTC: the header, to the
// nanosecond, or else the AMQP timestamp (whole seconds), if any.
func (h *headerReader) createdAt(timestamp time.Time) (time.Time, error) {
	if s, ok := h.string(HeaderCreatedAt); ok {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return time.Time{}, fmt.Errorf("header %s %s is not an RFC 3339 time", HeaderCreatedAt, quote(s))
		}
		return t.UTC(), nil
	}
	if !timestamp.IsZero() {
		return timestamp.UTC(), nil
	}
	return time.Time{}, nil
}

// userHeaders reads the user headers (Envelope.Headers), nil if there are
// none.
func (h *headerReader) userHeaders() (map[string]string, error) {
	var out map[string]string
	for k := range h.t {
		user, found := strings.CutPrefix(k, HeaderUserPrefix)
		if !found {
			continue
		}
		if user == "" || strings.HasPrefix(user, message.ReservedHeaderPrefix) {
			return nil, fmt.Errorf("header %s: user header key is empty or reserved", quote(k))
		}
		v, _ := h.string(k)
		if out == nil {
			out = make(map[string]string)
		}
		out[user] = v
	}
	return out, nil
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

// uuid reads the UUID in header k (uuid.Nil if there is none). A value
// that is not a UUID is an error of its own, returned at once.
func (h *headerReader) uuid(k string) (uuid.UUID, error) {
	s, ok := h.string(k)
	if !ok {
		return uuid.Nil, nil
	}
	id, err := uuid.Parse(s)
	if err != nil {
		return uuid.Nil, fmt.Errorf("header %s %s is not a UUID", k, quote(s))
	}
	return id, nil
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
