package rabbitmq_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"

	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/internal/testkit/telemetrytest"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/transport"
	"github.com/sagabox/sagabox/transport/rabbitmq"
	"github.com/sagabox/sagabox/transport/transporttest"
)

const wait = 30 * time.Second

var spec = transport.QueueSpec{Name: "svc", Commands: []string{"svc.do"}}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*wait)
	t.Cleanup(cancel)
	return ctx
}

// runSubscriber runs Subscribe until the test ends and checks it returns nil.
func runSubscriber(t *testing.T, b transport.Subscriber, spec transport.QueueSpec, h transport.Handler, opts *transport.SubscribeOpts) {
	t.Helper()
	testkit.Run(t, func(ctx context.Context) error { return b.Subscribe(ctx, spec, h, opts) })
}

// idSet collects distinct message ids and signals every change.
type idSet struct {
	mu      sync.Mutex
	ids     map[uuid.UUID]bool
	changed chan struct{}
}

func newIDSet() *idSet { return &idSet{ids: map[uuid.UUID]bool{}, changed: make(chan struct{}, 1)} }

func (s *idSet) add(id uuid.UUID) {
	s.mu.Lock()
	s.ids[id] = true
	s.mu.Unlock()
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

func (s *idSet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ids)
}

func (s *idSet) missing(want []uuid.UUID) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, id := range want {
		if !s.ids[id] {
			n++
		}
	}
	return n
}

// waitFor waits until cond holds, re-checking on every change of s.
func (s *idSet) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(wait)
	for !cond() {
		select {
		case <-s.changed:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// publishUntilConfirmed publishes msgs, re-publishing the unconfirmed ones
// (as the relay does) until all are confirmed; it returns how many Publish
// calls failed.
func publishUntilConfirmed(ctx context.Context, t *testing.T, b transport.Publisher, msgs []message.Message) (failures int) {
	for len(msgs) > 0 {
		err := b.Publish(ctx, msgs...)
		if err == nil {
			return failures
		}
		failures++
		var rest []message.Message
		for i, ok := range transport.Confirmed(len(msgs), err) {
			if !ok {
				rest = append(rest, msgs[i])
			}
		}
		msgs = rest
		// Back off like the relay between attempts.
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			t.Errorf("publish: %v (last error %v)", ctx.Err(), err)
			return failures
		}
	}
	return failures
}

// publishThrough publishes batches of 5 commands, re-publishing unconfirmed
// ones, until 30 batches have been confirmed after disrupted is closed. It
// returns every confirmed message id and how many Publish calls failed.
func publishThrough(ctx context.Context, t *testing.T, b transport.Publisher, disrupted <-chan struct{}) (confirmed []uuid.UUID, failures int) {
	after := 0
	for after < 30 { // keep going well past the disruption
		batch := make([]message.Message, 5)
		for i := range batch {
			batch[i] = transporttest.Command("svc.do")
		}
		failures += publishUntilConfirmed(ctx, t, b, batch)
		for _, m := range batch {
			confirmed = append(confirmed, m.MessageID)
		}
		select {
		case <-disrupted:
			after++
		default:
		}
		if ctx.Err() != nil {
			return confirmed, failures
		}
	}
	return confirmed, failures
}

// TestGuaranteeNoLostMessageAcrossClosedConnection severs the broker's
// connection (rabbitmqctl close_connection, this test's connection only)
// while a publishing loop and a consumer run, and checks that both resume on
// their own and that every confirmed message is consumed.
func TestGuaranteeNoLostMessageAcrossClosedConnection(t *testing.T) {
	t.Parallel()
	cfg := amqptest.Config(t)
	b := amqptest.NewBroker(t, cfg)
	ctx := testCtx(t)
	require.NoError(t, b.Declare(ctx, spec))

	got := newIDSet()
	runSubscriber(t, b, spec, transport.HandlerFunc(func(_ context.Context, d *transport.Delivery) transport.Outcome {
		got.add(d.MessageID)
		return transport.Ack()
	}), &transport.SubscribeOpts{Concurrency: 4})

	severed := make(chan struct{})
	var all []uuid.UUID
	var failures int
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		all, failures = publishThrough(ctx, t, b, severed)
	}()

	got.waitFor(t, "traffic before the outage", func() bool { return got.len() >= 50 })
	require.GreaterOrEqual(t, amqptest.CloseConnections(t, cfg.ConnectionName), 1)
	close(severed)
	<-pubDone

	t.Logf("confirmed %d messages, %d failed Publish calls during the outage", len(all), failures)
	got.waitFor(t, "every confirmed message consumed", func() bool { return got.missing(all) == 0 })
}

// TestGuaranteePoisonInputDeadLettered sends six kinds of malformed raw
// input; each lands in the dead-letter queue with a readable reason and the
// good message sent right after it is handled.
func TestGuaranteePoisonInputDeadLettered(t *testing.T) {
	t.Parallel()
	meter := telemetrytest.NewMeter(t)
	b := amqptest.NewBroker(t, rabbitmq.Config{MeterProvider: meter.Provider})
	ctx := testCtx(t)
	require.NoError(t, b.Declare(ctx, spec))
	handled := make(chan uuid.UUID, 16)
	runSubscriber(t, b, spec, transport.HandlerFunc(func(_ context.Context, d *transport.Delivery) transport.Outcome {
		handled <- d.MessageID
		return transport.Ack()
	}), nil)
	dls := amqptest.Consume(t, b.DeadLetterQueueName(spec.Name))
	raw := amqptest.Dial(t)

	valid := func() amqp.Publishing {
		p, err := rabbitmq.EncodeMessage(transporttest.Command("svc.do"))
		require.NoError(t, err)
		return p
	}
	for _, tc := range []struct {
		name   string
		mut    func(p *amqp.Publishing)
		reason string
	}{
		{"empty body", func(p *amqp.Publishing) { p.Body = nil }, "body is empty"},
		{"JSON without envelope headers", func(p *amqp.Publishing) { p.Headers = nil }, "header x-sagabox-version is missing"},
		{"missing message id", func(p *amqp.Publishing) { p.MessageId = "" }, "message_id is missing"},
		{"wrong content type", func(p *amqp.Publishing) { p.ContentType = "application/xml" }, `content_type "application/xml" is not application/json`},
		{"header of the wrong type", func(p *amqp.Publishing) { p.Headers[rabbitmq.HeaderStepIndex] = "two" }, "header x-sagabox-step-index has type string, want an integer"},
		{"unknown envelope version", func(p *amqp.Publishing) { p.Headers[rabbitmq.HeaderVersion] = int64(2) }, "envelope version 2 is not supported"},
	} {
		bad := valid()
		tc.mut(&bad)
		require.NoError(t, amqptest.TryPublishRaw(raw, b.ExchangeName(transport.ExchangeCommands), "svc.do", bad), tc.name)
		good := transporttest.Command("svc.do")
		require.NoError(t, b.Publish(ctx, good), tc.name)

		dl := amqptest.Next(t, dls, wait)
		require.Equal(t, bad.MessageId, dl.MessageId, tc.name)
		reason, _ := dl.Headers[rabbitmq.HeaderDeadLetterReason].(string)
		require.True(t, strings.HasPrefix(reason, "malformed message: "+tc.reason), "%s: reason %q", tc.name, reason)
		require.Equal(t, b.QueueName(spec.Name), dl.Headers[rabbitmq.HeaderDeadLetterQueue], tc.name)
		require.NotEmpty(t, dl.Headers[rabbitmq.HeaderDeadLetterAt], tc.name)
		require.Equal(t, string(bad.Body), string(dl.Body), tc.name)

		select {
		case id := <-handled:
			require.Equal(t, good.MessageID, id, tc.name)
		case <-time.After(wait):
			t.Fatalf("%s: good message not handled", tc.name)
		}
	}
	// Each malformed delivery is counted once, as the library's other dead
	// letters are.
	require.EqualValues(t, 6, meter.Collect(t).Sum("sagabox.dead_letters",
		attribute.String("sagabox.component", "rabbitmq"), attribute.String("sagabox.dead_letter.reason", "malformed")))
}

// TestHandlerPanicRetries checks that a panicking handler does not kill the
// consumer: the delivery is retried.
func TestHandlerPanicRetries(t *testing.T) {
	t.Parallel()
	b := amqptest.NewBroker(t, rabbitmq.Config{})
	ctx := testCtx(t)
	require.NoError(t, b.Declare(ctx, spec))
	msg := transporttest.Command("svc.do")
	require.NoError(t, b.Publish(ctx, msg))
	var calls int
	acked := make(chan uuid.UUID, 1)
	runSubscriber(t, b, spec, transport.HandlerFunc(func(_ context.Context, d *transport.Delivery) transport.Outcome {
		calls++ // Concurrency 1: no race
		if calls == 1 {
			panic("boom")
		}
		acked <- d.MessageID
		return transport.Ack()
	}), nil)
	select {
	case id := <-acked:
		require.Equal(t, msg.MessageID, id)
	case <-time.After(wait):
		t.Fatal("message not retried after the handler panicked")
	}
}

// TestPublishFailsFastWhenBlocked simulates connection.blocked: a real broker
// alarm would block every connection on the shared broker, so the test feeds
// the notification through the hook that replaces the connection's
// NotifyBlocked channel.
func TestPublishFailsFastWhenBlocked(t *testing.T) {
	t.Parallel()
	cfg := amqptest.Config(t)
	hook := make(chan amqp.Blocking)
	b, err := rabbitmq.NewWithBlockedHook(testCtx(t), cfg, hook)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close(); amqptest.DeleteTopology(t, b) })
	ctx := testCtx(t)
	require.NoError(t, b.Declare(ctx, spec))
	require.NoError(t, b.Publish(ctx, transporttest.Command("svc.do")))

	hook <- amqp.Blocking{Active: true, Reason: "low on memory"}
	// The unbuffered send returns once the watcher has the notification;
	// it records it before reading the next one, so a second send (a
	// duplicate notification) proves the state is set.
	hook <- amqp.Blocking{Active: true, Reason: "low on memory"}
	err = b.Publish(ctx, transporttest.Command("svc.do"))
	require.ErrorIs(t, err, rabbitmq.ErrBlocked)
	require.ErrorContains(t, err, "low on memory")
	require.False(t, transport.Confirmed(1, err)[0])

	hook <- amqp.Blocking{Active: false}
	hook <- amqp.Blocking{Active: false}
	require.NoError(t, b.Publish(ctx, transporttest.Command("svc.do")))
}

// TestGuaranteeConsumptionContinuesWhilePublisherBlocked blocks the
// broker's publishing connection (through the hook, as above) and checks that
// its consumer still receives and acknowledges messages published through
// another broker: with Prefetch 1 each delivery after the first proves the
// previous ack went through. A dead letter decided meanwhile cannot be
// published yet: the delivery goes back to its queue, is not lost, and
// reaches the dead-letter queue once the connection is unblocked.
func TestGuaranteeConsumptionContinuesWhilePublisherBlocked(t *testing.T) {
	t.Parallel()
	cfg := amqptest.Config(t)
	hook := make(chan amqp.Blocking)
	b, err := rabbitmq.NewWithBlockedHook(testCtx(t), cfg, hook)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close(); amqptest.DeleteTopology(t, b) })
	ctx := testCtx(t)
	require.NoError(t, b.Declare(ctx, spec))
	other := amqptest.NewBroker(t, rabbitmq.Config{Namespace: cfg.Namespace, ConnectionName: cfg.ConnectionName + "-other"})
	dls := amqptest.Consume(t, b.DeadLetterQueueName(spec.Name))

	poison := transporttest.Command("svc.do")
	poisonSeen := make(chan struct{}, 1)
	got := newIDSet()
	runSubscriber(t, b, spec, transport.HandlerFunc(func(_ context.Context, d *transport.Delivery) transport.Outcome {
		if d.MessageID == poison.MessageID {
			select {
			case poisonSeen <- struct{}{}:
			default:
			}
			return transport.DeadLetter("poison")
		}
		got.add(d.MessageID)
		return transport.Ack()
	}), &transport.SubscribeOpts{Concurrency: 1, Prefetch: 1})

	hook <- amqp.Blocking{Active: true, Reason: "low on disk"}
	hook <- amqp.Blocking{Active: true, Reason: "low on disk"} // see TestPublishFailsFastWhenBlocked
	err = b.Publish(ctx, transporttest.Command("svc.do"))
	require.ErrorIs(t, err, rabbitmq.ErrBlocked)

	batch := make([]message.Message, 20)
	ids := make([]uuid.UUID, len(batch))
	for i := range batch {
		batch[i] = transporttest.Command("svc.do")
		ids[i] = batch[i].MessageID
	}
	require.NoError(t, other.Publish(ctx, batch...))
	got.waitFor(t, "every message consumed while the publisher is blocked", func() bool { return got.missing(ids) == 0 })

	// The dead-letter copy goes through the blocked publishing connection:
	// it fails, and the delivery is requeued and handled again.
	require.NoError(t, other.Publish(ctx, poison))
	for range 2 {
		select {
		case <-poisonSeen:
		case <-time.After(wait):
			t.Fatal("poison message not redelivered while the publisher is blocked")
		}
	}
	require.ErrorIs(t, b.Publish(ctx, transporttest.Command("svc.do")), rabbitmq.ErrBlocked)

	hook <- amqp.Blocking{Active: false}
	hook <- amqp.Blocking{Active: false}
	dl := amqptest.Next(t, dls, wait)
	require.Equal(t, poison.MessageID.String(), dl.MessageId)
	after := transporttest.Command("svc.do")
	require.NoError(t, b.Publish(ctx, after))
	got.waitFor(t, "a message published after unblocking", func() bool { return got.missing([]uuid.UUID{after.MessageID}) == 0 })
}

// TestPasswordNeverInErrors dials a closed port and a wrong password with a
// password in the URL: neither the error nor the logs contain it.
func TestPasswordNeverInErrors(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(amqptest.URL(t))
	require.NoError(t, err)
	const secret = "s3cr3t-Pa55"
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))

	closedPort := "amqp://sagabox:" + secret + "@127.0.0.1:1/"
	_, err = rabbitmq.New(testCtx(t), rabbitmq.Config{URL: closedPort, Logger: logger})
	require.Error(t, err)
	require.NotContains(t, err.Error(), secret)
	require.Contains(t, err.Error(), "amqp://sagabox:***@127.0.0.1:1/")
	require.Contains(t, err.Error(), `start it with "rabbitmq-server -detached"`)

	wrongPassword := "amqp://guest:" + secret + "@" + u.Host + "/"
	_, err = rabbitmq.New(testCtx(t), rabbitmq.Config{URL: wrongPassword, Logger: logger})
	require.Error(t, err)
	require.NotContains(t, err.Error(), secret)
	require.Contains(t, err.Error(), "guest:***@")

	_, err = rabbitmq.New(testCtx(t), rabbitmq.Config{URL: "http://u:" + secret + "@h/", Logger: logger})
	require.ErrorContains(t, err, "URL")
	require.NotContains(t, err.Error(), secret)
	require.NotContains(t, logs.String(), secret)
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	require.NoError(t, rabbitmq.Config{}.WithDefaults().Validate())
	for _, tc := range []struct {
		cfg  rabbitmq.Config
		want string
	}{
		{rabbitmq.Config{Namespace: "bad name"}, "Namespace"},
		{rabbitmq.Config{Namespace: "trailing."}, "Namespace"},
		{rabbitmq.Config{QueueType: "stream"}, "QueueType"},
		{rabbitmq.Config{ConfirmTimeout: -1}, "ConfirmTimeout"},
		{rabbitmq.Config{ReconnectMin: time.Second, ReconnectMax: time.Millisecond}, "ReconnectMax"},
		{rabbitmq.Config{PublishChannels: -1}, "PublishChannels"},
		{rabbitmq.Config{DeliveryLimit: -1}, "DeliveryLimit"},
		{rabbitmq.Config{URL: "nats://x"}, "URL"},
		{rabbitmq.Config{URLs: []string{"amqp://ok/", "nats://x"}}, "URL"},
	} {
		require.ErrorContains(t, tc.cfg.WithDefaults().Validate(), tc.want)
	}
}

func TestBackoff(t *testing.T) {
	t.Parallel()
	lo, hi := 100*time.Millisecond, 2*time.Second
	for attempt := 1; attempt < 40; attempt++ {
		d := rabbitmq.Backoff(lo, hi, attempt)
		require.GreaterOrEqual(t, d, lo/2)
		require.LessOrEqual(t, d, hi)
	}
	require.GreaterOrEqual(t, rabbitmq.Backoff(lo, hi, 30), hi/2)
}

func TestSubscribeReturnsErrClosed(t *testing.T) {
	t.Parallel()
	b := amqptest.NewBroker(t, rabbitmq.Config{})
	done := make(chan error, 1)
	started := make(chan struct{})
	ctx := testCtx(t)
	require.NoError(t, b.Declare(ctx, spec))
	require.NoError(t, b.Publish(ctx, transporttest.Command("svc.do")))
	go func() {
		var once sync.Once
		done <- b.Subscribe(ctx, spec, transport.HandlerFunc(func(context.Context, *transport.Delivery) transport.Outcome {
			once.Do(func() { close(started) })
			return transport.Ack()
		}), nil)
	}()
	<-started
	require.NoError(t, b.Close())
	require.NoError(t, b.Close(), "Close is idempotent")
	select {
	case err := <-done:
		require.ErrorIs(t, err, rabbitmq.ErrClosed)
	case <-time.After(wait):
		t.Fatal("Subscribe did not return after Close")
	}
	require.ErrorIs(t, b.Publish(ctx, transporttest.Command("svc.do")), rabbitmq.ErrClosed)
}

func TestDeclareConflictIsPermanent(t *testing.T) {
	t.Parallel()
	cfg := amqptest.Config(t)
	cfg.QueueType = rabbitmq.QueueTypeClassic
	classic := amqptest.NewBroker(t, cfg)
	ctx := testCtx(t)
	require.NoError(t, classic.Declare(ctx, spec))
	cfg.QueueType = rabbitmq.QueueTypeQuorum
	cfg.ConnectionName += "-q"
	quorum := amqptest.NewBroker(t, cfg)
	err := quorum.Declare(ctx, spec)
	require.ErrorContains(t, err, "exists with other arguments")
	err = quorum.Subscribe(ctx, spec, transport.HandlerFunc(func(context.Context, *transport.Delivery) transport.Outcome { return transport.Ack() }), nil)
	var aerr *amqp.Error
	require.True(t, errors.As(err, &aerr), "%v", err)
}

// A dead-letter reason too long for a header frame is cut, and the message
// is dead-lettered: sent whole, the copy's frame would exceed the broker's
// frame_max, the broker would close the connection, and the message would
// go back to its queue and fail the same way for ever.
func TestDeadLetterReasonIsCut(t *testing.T) {
	t.Parallel()
	b := amqptest.NewBroker(t, rabbitmq.Config{})
	ctx := testCtx(t)
	require.NoError(t, b.Declare(ctx, spec))
	dls := amqptest.Consume(t, b.DeadLetterQueueName(spec.Name))
	reason := strings.Repeat("é", 100<<10) // 200 KiB
	runSubscriber(t, b, spec, transport.HandlerFunc(func(context.Context, *transport.Delivery) transport.Outcome {
		return transport.DeadLetter(reason)
	}), nil)
	msg := transporttest.Command("svc.do")
	require.NoError(t, b.Publish(ctx, msg))
	d := amqptest.Next(t, dls, wait)
	require.Equal(t, msg.MessageID.String(), d.MessageId)
	got, _ := d.Headers[rabbitmq.HeaderDeadLetterReason].(string)
	require.Less(t, len(got), 5<<10)
	require.True(t, strings.HasPrefix(got, "éé"))
	require.True(t, strings.HasSuffix(got, fmt.Sprintf("… (cut from %d bytes)", len(reason))), "the header ends with the reason's length: %q", got[len(got)-40:])
	require.True(t, utf8.ValidString(got), "cut on a character boundary")
}
