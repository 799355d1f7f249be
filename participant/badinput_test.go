package participant_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/participant"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

func amqptestConsume(t *testing.T, queue string) <-chan amqp.Delivery {
	t.Helper()
	return amqptest.Consume(t, queue)
}

type deadLetter struct {
	id, reason string
}

func nextDeadLetter(t *testing.T, ds <-chan amqp.Delivery) deadLetter {
	t.Helper()
	d := amqptest.Next(t, ds, waitFor)
	reason, _ := d.Headers[rabbitmq.HeaderDeadLetterReason].(string)
	return deadLetter{id: d.MessageId, reason: reason}
}

// Ten kinds of bad input published raw to the participant's queue each land
// in its dead-letter queue with a readable reason, and the queue keeps
// flowing: a good command sent right after each is answered. Envelope-level
// faults are caught by the adapter; payload-level ones (the body is decoded
// once, strictly, into the handler's type) by the participant, which also
// answers the saga with a failure reply.
func TestGuaranteePoisonInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.setStock("good", 1000)
	e.newClient(func(cfg *participant.Config) { cfg.MaxPayloadBytes = 4096 }, nil)
	queue := e.broker.QueueName(service)
	dlq := amqptestConsume(t, e.broker.DeadLetterQueueName(service))

	valid := func() (amqp.Publishing, uuid.UUID) {
		m := reserve(uuid.New(), "good", 1)
		p, err := rabbitmq.EncodeMessage(m)
		require.NoError(t, err)
		return p, m.MessageID
	}
	cases := []struct {
		name   string
		mutate func(p *amqp.Publishing)
		reason string
		// reply is the failure code of the participant's reply; empty when the
		// adapter dead-letters the message before the participant sees it.
		reply string
	}{
		{"garbage bytes", func(p *amqp.Publishing) { p.Body = []byte("lorem ipsum <<garbage>>") }, "payload does not decode", saga.CodeInvalidPayload},
		{"empty body", func(p *amqp.Publishing) { p.Body = nil }, "body is empty", ""},
		{"wrong shape", func(p *amqp.Publishing) { p.Body = []byte(`{"product":"good","amount":1}`) }, `unknown field "product"`, saga.CodeInvalidPayload},
		{"unknown type", func(p *amqp.Publishing) { p.Type = "inventory.teleport" }, `no command handler is registered for type "inventory.teleport"`, saga.CodeUnknownType},
		{"missing message id", func(p *amqp.Publishing) { p.MessageId = "" }, "message_id is missing", ""},
		{"huge payload", func(p *amqp.Publishing) {
			p.Body = []byte(fmt.Sprintf(`{"sku":%q,"qty":1}`, strings.Repeat("x", 8000)))
		}, "over the limit of 4096 bytes", saga.CodePayloadTooLarge},
		{"wrong content type", func(p *amqp.Publishing) { p.ContentType = "text/plain" }, `content_type "text/plain" is not application/json`, ""},
		{"truncated JSON", func(p *amqp.Publishing) { p.Body = []byte(`{"sku":"good","qty"`) }, "payload does not decode", saga.CodeInvalidPayload},
		{"invalid UTF-8", func(p *amqp.Publishing) { p.Body = []byte("{\"sku\":\"\xff\xfe\",\"qty\":1}") }, "not valid UTF-8", saga.CodeInvalidPayload},
		{"header of the wrong type", func(p *amqp.Publishing) { p.Headers[rabbitmq.HeaderStepIndex] = "one" }, "header x-sagabox-step-index has type string, want an integer", ""},
	}
	for _, tc := range cases {
		bad, badID := valid()
		tc.mutate(&bad)
		amqptest.PublishRaw(t, "", queue, bad)

		good := reserve(uuid.New(), "good", 1)
		e.publish(good)
		requireSuccess(t, e.replies.wait(t, good.MessageID))

		dead := nextDeadLetter(t, dlq)
		require.Contains(t, dead.reason, tc.reason, "case %q: dead-letter reason", tc.name)
		if bad.MessageId != "" {
			require.Equal(t, bad.MessageId, dead.id, "case %q", tc.name)
		}
		if tc.reply != "" {
			f := requireFailure(t, e.replies.wait(t, badID), tc.reply)
			require.Contains(t, f.Reason, tc.reason, "case %q: failure reply", tc.name)
			a, err := e.store.AttemptGet(t.Context(), badID)
			require.NoError(t, err, "case %q", tc.name)
			require.False(t, a.DeadLetteredAt.IsZero(), "case %q", tc.name)
		} else {
			require.Equal(t, 0, e.replies.count(badID), "case %q: no reply to a message the participant never saw", tc.name)
		}
	}
	require.Equal(t, 1000-len(cases), e.stock("good"), "every good command applied once, no bad one")
}
