package rabbitmq_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/transport/rabbitmq"
	"github.com/sagabox/sagabox/transport/transporttest"
)

// asDelivery is what the broker hands a consumer for a publishing.
func asDelivery(p amqp.Publishing, key string) amqp.Delivery {
	return amqp.Delivery{
		Headers:       p.Headers,
		ContentType:   p.ContentType,
		DeliveryMode:  p.DeliveryMode,
		CorrelationId: p.CorrelationId,
		ReplyTo:       p.ReplyTo,
		MessageId:     p.MessageId,
		Timestamp:     p.Timestamp,
		Type:          p.Type,
		RoutingKey:    key,
		Body:          p.Body,
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	t.Parallel()
	m := transporttest.Command("inventory.reserve")
	m.CreatedAt = time.Date(2025, 3, 1, 12, 0, 0, 123456789, time.UTC)
	p, err := rabbitmq.EncodeMessage(m)
	require.NoError(t, err)
	require.Equal(t, amqp.Persistent, p.DeliveryMode)
	require.Equal(t, "application/json", p.ContentType)
	require.Equal(t, m.MessageID.String(), p.MessageId)
	require.Equal(t, m.CorrelationID, p.CorrelationId)
	require.Equal(t, m.TraceParent, p.Headers["traceparent"])
	require.Equal(t, "acme", p.Headers["x-sagabox-header-tenant"])
	require.NoError(t, p.Headers.Validate())

	d, err := rabbitmq.DecodeDelivery(asDelivery(p, m.RoutingKey))
	require.NoError(t, err)
	require.Equal(t, m, d.Message)
}

// A message back from a retry queue arrives with the retry queue's
// dead-letter routing key and the broker's redelivered flag unset; its
// envelope is the one first published, and it reads as redelivered.
func TestDecodeRetriedCopy(t *testing.T) {
	t.Parallel()
	m := transporttest.Command("inventory.reserve")
	p, err := rabbitmq.EncodeMessage(m)
	require.NoError(t, err)
	p.Headers[rabbitmq.HeaderRetries] = int64(2)
	p.Headers[rabbitmq.HeaderRoutingKey] = m.RoutingKey

	d, err := rabbitmq.DecodeDelivery(asDelivery(p, "sagabox.inventory"))
	require.NoError(t, err)
	require.Equal(t, m, d.Message)
	require.True(t, d.Redelivered)
	require.Equal(t, 2, d.Retries)

	delete(p.Headers, rabbitmq.HeaderRetries)
	delete(p.Headers, rabbitmq.HeaderRoutingKey)
	first, err := rabbitmq.DecodeDelivery(asDelivery(p, m.RoutingKey))
	require.NoError(t, err)
	require.False(t, first.Redelivered)
	require.Zero(t, first.Retries)
}

func TestEncodeRejects(t *testing.T) {
	t.Parallel()
	for name, mut := range map[string]func(*message.Message){
		"invalid envelope": func(m *message.Message) { m.MessageID = uuid.Nil },
		"empty payload":    func(m *message.Message) { m.Payload = nil },
		"reserved header":  func(m *message.Message) { m.Headers = map[string]string{"x-sagabox-kind": "x"} },
	} {
		m := transporttest.Command("a.b")
		mut(&m)
		_, err := rabbitmq.EncodeMessage(m)
		require.Error(t, err, name)
	}
}

func TestDecodeDeliveryErrors(t *testing.T) {
	t.Parallel()
	good := func() amqp.Delivery {
		p, err := rabbitmq.EncodeMessage(transporttest.Command("svc.do"))
		require.NoError(t, err)
		return asDelivery(p, "svc.do")
	}
	for _, tc := range []struct {
		name string
		mut  func(*amqp.Delivery)
		want string
	}{
		{"empty body", func(d *amqp.Delivery) { d.Body = nil }, "body is empty"},
		{"content type", func(d *amqp.Delivery) { d.ContentType = "text/plain" }, `content_type "text/plain" is not application/json`},
		{"no content type", func(d *amqp.Delivery) { d.ContentType = "" }, "content_type is missing"},
		{"no message id", func(d *amqp.Delivery) { d.MessageId = "" }, "message_id is missing"},
		{"bad message id", func(d *amqp.Delivery) { d.MessageId = "42" }, `message_id "42" is not a UUID`},
		{"no type", func(d *amqp.Delivery) { d.Type = "" }, "type is missing"},
		{"no version", func(d *amqp.Delivery) { delete(d.Headers, rabbitmq.HeaderVersion) }, "x-sagabox-version is missing"},
		{"future version", func(d *amqp.Delivery) { d.Headers[rabbitmq.HeaderVersion] = int32(7) }, "envelope version 7 is not supported"},
		{"step index string", func(d *amqp.Delivery) { d.Headers[rabbitmq.HeaderStepIndex] = "2" }, "x-sagabox-step-index has type string, want an integer"},
		{"bad saga id", func(d *amqp.Delivery) { d.Headers[rabbitmq.HeaderSagaID] = "x" }, "x-sagabox-saga-id"},
		{"bad created at", func(d *amqp.Delivery) { d.Headers[rabbitmq.HeaderCreatedAt] = "yesterday" }, "x-sagabox-created-at"},
		{"unknown kind", func(d *amqp.Delivery) { d.Headers[rabbitmq.HeaderKind] = "shout" }, `kind "shout"`},
		{"command without saga", func(d *amqp.Delivery) { delete(d.Headers, rabbitmq.HeaderSagaID) }, "saga_id is missing"},
		{"user header not string", func(d *amqp.Delivery) { d.Headers["x-sagabox-header-n"] = int64(1) }, "want a string"},
		{"retries not a number", func(d *amqp.Delivery) { d.Headers[rabbitmq.HeaderRetries] = "1" }, "x-sagabox-retries has type string, want an integer"},
		{"negative retries", func(d *amqp.Delivery) { d.Headers[rabbitmq.HeaderRetries] = int64(-1) }, "x-sagabox-retries -1 is negative"},
		{"routing key not a string", func(d *amqp.Delivery) { d.Headers[rabbitmq.HeaderRoutingKey] = int64(1) }, "x-sagabox-routing-key has type int64, want a string"},
	} {
		d := good()
		tc.mut(&d)
		_, err := rabbitmq.DecodeDelivery(d)
		require.ErrorContains(t, err, tc.want, tc.name)
	}
	// The body is the receiver's to decode, once, into the type it
	// expects: the adapter passes it on as it came.
	for _, body := range []string{"{", "\"\xff\"", "lorem"} {
		d := good()
		d.ContentType, d.Body = "application/json; charset=utf-8", []byte(body)
		got, err := rabbitmq.DecodeDelivery(d)
		require.NoError(t, err, "body %q", body)
		require.Equal(t, body, string(got.Payload))
	}
}

func FuzzDecodeDelivery(f *testing.F) {
	good := transporttest.Command("svc.do")
	id, sagaID := good.MessageID.String(), good.SagaID.String()
	now := time.Now().UTC().Format(time.RFC3339Nano)
	type seed struct {
		body, contentType, messageID, typ, kind, sagaID, createdAt string
		version, stepIndex                                         int64
		stepIndexAsString                                          bool
		userKey, userVal                                           string
	}
	for _, s := range []seed{
		{`{"sku":"A-1"}`, "application/json", id, "svc.do", "command", sagaID, now, 1, 2, false, "tenant", "acme"},
		{`{"a":1}`, "application/json; charset=utf-8", id, "order.placed", "event", "", "", 1, 0, false, "", ""},
		{`[1,2,3]`, "application/json", id, "svc.do", "reply-failure", sagaID, "2024-01-02T03:04:05.999999999+02:00", 1, 7, false, "k", ""},
		{"\x00\x9f\x92\x96", "application/json", id, "svc.do", "command", sagaID, now, 1, 2, false, "", ""},
		{"", "application/json", id, "svc.do", "command", sagaID, now, 1, 2, false, "", ""},
		{`{"sku":`, "application/json", id, "svc.do", "command", sagaID, now, 1, 2, false, "", ""},
		{"\"\xff\xfe\"", "application/json", id, "svc.do", "command", sagaID, now, 1, 2, false, "", ""},
		{`{}`, "text/plain", id, "svc.do", "command", sagaID, now, 1, 2, false, "", ""},
		{`{}`, "application/json", "", "svc.do", "command", sagaID, now, 1, 2, false, "", ""},
		{`{}`, "application/json", "not-a-uuid", "svc.do", "command", sagaID, now, 1, 2, false, "", ""},
		{`{}`, "application/json", id, "", "command", sagaID, now, 1, 2, false, "", ""},
		{`{}`, "application/json", id, "svc.do", "command", sagaID, now, 1, 2, true, "", ""},
		{`{}`, "application/json", id, "svc.do", "command", sagaID, now, 99, 2, false, "", ""},
		{`{}`, "application/json", id, "svc.do", "command", sagaID, now, 0, 2, false, "", ""},
		{`{}`, "application/json", id, "svc.do", "command", "", now, 1, -1, false, "", ""},
		{`{}`, "application/json", id, "svc.do", "command", sagaID, "garbage", 1, 2, false, "", ""},
		{`{}`, "application/json", id, "svc.do", "command", sagaID, now, 1, 1 << 40, false, "x-sagabox-evil", "1"},
	} {
		f.Add([]byte(s.body), s.contentType, s.messageID, s.typ, s.kind, s.sagaID, s.createdAt, s.version, s.stepIndex, s.stepIndexAsString, s.userKey, s.userVal)
	}
	f.Fuzz(func(t *testing.T, body []byte, contentType, messageID, typ, kind, sagaID, createdAt string, version, stepIndex int64, stepIndexAsString bool, userKey, userVal string) {
		h := amqp.Table{rabbitmq.HeaderKind: kind, rabbitmq.HeaderStepIndex: stepIndex, rabbitmq.HeaderStep: "reserve"}
		if version != 0 {
			h[rabbitmq.HeaderVersion] = version
		}
		if stepIndexAsString {
			h[rabbitmq.HeaderStepIndex] = "2"
		}
		if sagaID != "" {
			h[rabbitmq.HeaderSagaID] = sagaID
		}
		if createdAt != "" {
			h[rabbitmq.HeaderCreatedAt] = createdAt
		}
		if userKey != "" {
			h[rabbitmq.HeaderUserPrefix+userKey] = userVal
		}
		in := amqp.Delivery{Headers: h, ContentType: contentType, MessageId: messageID, Type: typ, RoutingKey: typ, Body: body}
		d, err := rabbitmq.DecodeDelivery(in)
		if err != nil {
			require.Nil(t, d)
			require.NotEmpty(t, err.Error())
			return
		}
		// A decoded delivery re-encodes, and decodes to the same message.
		p, err := rabbitmq.EncodeMessage(d.Message)
		require.NoError(t, err)
		require.NoError(t, p.Headers.Validate())
		again, err := rabbitmq.DecodeDelivery(asDelivery(p, d.RoutingKey))
		require.NoError(t, err)
		require.True(t, d.CreatedAt.Equal(again.CreatedAt))
		require.Equal(t, d.Message, again.Message)
	})
}
