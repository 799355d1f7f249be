// Package transporttest is the conformance suite every transport backend
// must pass. A backend's tests call Run with a function that returns a
// broker connected to a fresh, isolated namespace (cleaned up when the test
// ends) that also implements Inspector:
//
//	func TestConformance(t *testing.T) {
//		transporttest.Run(t, func(t *testing.T) transport.Broker { return newInspectableBroker(t) })
//	}
package transporttest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/transport"
)

// Timeout bounds every wait of the suite.
const Timeout = 30 * time.Second

// Inspector is what the suite needs from a backend beyond transport.Broker:
// a way to put malformed input on the wire and a way to read dead letters.
// Backends implement it in their tests, typically by wrapping their broker.
type Inspector interface {
	// PublishRaw puts raw on the wire as the backend would publish
	// raw.Valid, with the corruptions raw asks for, bypassing every check
	// of the Publisher. It returns once the broker has accepted it.
	PublishRaw(ctx context.Context, raw RawMessage) error
	// NextDeadLetter returns the next message of the dead-letter queue of
	// the logical queue, waiting for one until ctx is done.
	NextDeadLetter(ctx context.Context, queue string) (DeadLetter, error)
}

// RawMessage describes malformed input: a valid message and what to break.
type RawMessage struct {
	// Valid is the message the raw one derives from; it decides routing.
	Valid message.Message
	// Body, when non-nil, replaces the encoded body (an empty, non-nil
	// slice sends an empty body).
	Body []byte
	// ContentType, when not empty, replaces the content type.
	ContentType string
	// OmitMessageID sends the message without a message id.
	OmitMessageID bool
}

// DeadLetter is a message read from a dead-letter queue.
type DeadLetter struct {
	// MessageID is the message id as sent ("" if there was none).
	MessageID string
	// Type is the message type as sent.
	Type string
	// Reason is why it was dead-lettered.
	Reason string
	// Body is the message body as sent.
	Body []byte
}

// Run runs the conformance suite. newBroker must return a broker in a
// namespace of its own that also implements Inspector; the suite's
// subtests run in parallel, each with its own broker. A broker that
// implements transport.RouteChecker is checked against it too.
func Run(t *testing.T, newBroker func(t *testing.T) transport.Broker) {
	s := suite{newBroker: newBroker}
	for _, tc := range []struct {
		name string
		fn   func(*testing.T)
	}{
		{"RoundTripPreservesEnvelope", s.roundTrip},
		{"BatchPipelinedAllDelivered", s.batch},
		{"UnroutableFailsOnlyThatMessage", s.unroutable},
		{"RetryRedelivers", s.retry},
		{"DelayedRetryHoldsNoWorker", s.delayedRetry},
		{"DeadLetterRecordsReason", s.deadLetter},
		{"MalformedInputDeadLettered", s.malformed},
		{"BodyIsTheReceiversToDecode", s.bodyPassedThrough},
		{"SubscribeReturnsOnCancelAfterDraining", s.cancel},
		{"ConcurrencyRespected", s.concurrency},
		{"BatchesSettleEachOutcome", s.batches},
		{"IdleQueueHandsBatchesOfOne", s.idleBatches},
		{"ConcurrentBatchesSettleOnlyTheirOwn", s.concurrentBatches},
		{"BatchConcurrencyRespected", s.batchConcurrency},
		{"SubscribeReturnsOnCancelAfterDrainingBatches", s.cancelBatches},
		{"DeclareIdempotent", s.declareIdempotent},
		{"RoutesCheckedUnseen", s.routes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t)
		})
	}
}

type suite struct {
	newBroker func(t *testing.T) transport.Broker
}

func (s suite) broker(t *testing.T) (transport.Broker, Inspector) {
	b := s.newBroker(t)
	in, ok := b.(Inspector)
	require.True(t, ok, "transporttest: the broker (%T) must implement transporttest.Inspector", b)
	return b, in
}

// spec is the queue every subtest uses; namespaces keep them apart.
var spec = transport.QueueSpec{
	Name:     "svc",
	Commands: []string{"svc.do", "svc.undo"},
	Replies:  true,
	Events:   []string{"thing.*"},
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	t.Cleanup(cancel)
	return ctx
}

// Command returns a valid command for spec with every field set.
func Command(typ string) message.Message {
	id := uuid.Must(uuid.NewV7())
	return message.Message{
		Envelope: message.Envelope{
			Version:       message.Version,
			MessageID:     id,
			Type:          typ,
			Kind:          message.KindCommand,
			RoutingKey:    typ,
			SagaID:        uuid.Must(uuid.NewV7()),
			SagaType:      "checkout",
			Step:          "reserve",
			StepIndex:     2,
			Attempt:       3,
			Run:           1,
			ReplyTo:       "orchestrator",
			CorrelationID: id.String(),
			CreatedAt:     time.Now().UTC(),
			TraceParent:   "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			TraceState:    "vendor=value",
			Headers:       map[string]string{"tenant": "acme", "note": "ünïcode"},
		},
		Payload: []byte(`{"sku":"A-1","qty":2,"tags":["x","y"]}`),
	}
}

// subscribe runs Subscribe in a goroutine; stop cancels it and returns its
// result. Cleanup stops it too.
func subscribe(t *testing.T, b transport.Broker, h transport.Handler, opts *transport.SubscribeOpts) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Subscribe(ctx, spec, h, opts) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(Timeout):
				err = errors.New("transporttest: Subscribe did not return after its ctx was cancelled")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// collector is a handler that acks and hands deliveries to the test.
type collector struct{ ch chan *transport.Delivery }

func newCollector() *collector { return &collector{ch: make(chan *transport.Delivery, 1024)} }

func (c *collector) HandleDelivery(_ context.Context, d *transport.Delivery) transport.Outcome {
	c.ch <- d
	return transport.Ack()
}

func (c *collector) next(t *testing.T) *transport.Delivery {
	t.Helper()
	select {
	case d := <-c.ch:
		return d
	case <-time.After(Timeout):
		t.Fatal("transporttest: no delivery in time")
		return nil
	}
}

func (s suite) roundTrip(t *testing.T) {
	b, _ := s.broker(t)
	ctx := ctxT(t)
	require.NoError(t, b.Declare(ctx, spec))

	cmd := Command("svc.do")
	comp := Command("svc.undo")
	comp.Kind = message.KindCompensation
	reply := Command("orchestrator.reply")
	reply.Kind, reply.RoutingKey = message.KindReplySuccess, spec.Name
	reply.Headers = nil
	event := Command("thing.happened")
	event.Kind, event.SagaID, event.SagaType, event.Step, event.StepIndex = message.KindEvent, uuid.Nil, "", "", 0
	event.TraceParent, event.TraceState, event.ReplyTo, event.CorrelationID = "", "", "", ""
	sent := []message.Message{cmd, comp, reply, event}
	require.NoError(t, b.Publish(ctx, sent...))

	c := newCollector()
	stop := subscribe(t, b, c, nil)
	got := map[uuid.UUID]*transport.Delivery{}
	for range sent {
		d := c.next(t)
		got[d.MessageID] = d
	}
	require.NoError(t, stop())
	for _, want := range sent {
		d := got[want.MessageID]
		require.NotNil(t, d, "message %s (%s) not delivered", want.MessageID, want.Kind)
		require.Equal(t, spec.Name, d.Queue)
		require.True(t, want.CreatedAt.Equal(d.CreatedAt), "created_at: want %s, got %s", want.CreatedAt, d.CreatedAt)
		gotEnv := d.Envelope
		gotEnv.CreatedAt = want.CreatedAt
		require.Equal(t, want.Envelope, gotEnv)
		require.JSONEq(t, string(want.Payload), string(d.Payload))
	}
}

func (s suite) batch(t *testing.T) {
	b, _ := s.broker(t)
	ctx := ctxT(t)
	require.NoError(t, b.Declare(ctx, spec))
	const n = 300
	msgs := make([]message.Message, n)
	for i := range msgs {
		msgs[i] = Command("svc.do")
		msgs[i].Payload = fmt.Appendf(nil, `{"i":%d}`, i)
	}
	require.NoError(t, b.Publish(ctx, msgs...))

	c := newCollector()
	subscribe(t, b, c, &transport.SubscribeOpts{Concurrency: 4})
	seen := map[uuid.UUID]bool{}
	for len(seen) < n {
		seen[c.next(t).MessageID] = true
	}
	for _, m := range msgs {
		require.True(t, seen[m.MessageID])
	}
}

func (s suite) unroutable(t *testing.T) {
	b, _ := s.broker(t)
	ctx := ctxT(t)
	require.NoError(t, b.Declare(ctx, spec))
	msgs := []message.Message{Command("svc.do"), Command("nobody.listens"), Command("svc.do")}
	err := b.Publish(ctx, msgs...)
	var pe *transport.PublishError
	require.ErrorAs(t, err, &pe)
	require.Len(t, pe.Failed, 1, "only the unroutable message fails: %v", err)
	require.Error(t, pe.Failed[1])
	require.Equal(t, []bool{true, false, true}, transport.Confirmed(len(msgs), err))

	c := newCollector()
	subscribe(t, b, c, nil)
	got := map[uuid.UUID]bool{c.next(t).MessageID: true, c.next(t).MessageID: true}
	require.True(t, got[msgs[0].MessageID])
	require.True(t, got[msgs[2].MessageID])
}

func (s suite) retry(t *testing.T) {
	for _, tc := range []struct {
		name        string
		delay       time.Duration
		wantRetries int
	}{
		{"at once", 0, 0},
		{"delayed", 10 * time.Millisecond, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, _ := s.broker(t)
			ctx := ctxT(t)
			require.NoError(t, b.Declare(ctx, spec))
			msg := Command("svc.do")
			require.NoError(t, b.Publish(ctx, msg))

			var calls atomic.Int32
			seen := make(chan *transport.Delivery, 2)
			subscribe(t, b, transport.HandlerFunc(func(_ context.Context, d *transport.Delivery) transport.Outcome {
				seen <- d
				if calls.Add(1) == 1 {
					return transport.Retry(tc.delay)
				}
				return transport.Ack()
			}), nil)
			first, second := next(t, seen), next(t, seen)
			require.Equal(t, msg.MessageID, first.MessageID)
			require.Equal(t, msg.MessageID, second.MessageID)
			require.False(t, first.Redelivered)
			require.Zero(t, first.Retries)
			require.True(t, second.Redelivered)
			require.Equal(t, tc.wantRetries, second.Retries)
			require.Equal(t, first.Envelope, second.Envelope, "the envelope never changes on redelivery")
			require.Equal(t, first.Payload, second.Payload)
		})
	}
}

// delayedRetry checks that a delayed Retry holds no handler goroutine while
// it waits (DESIGN §4.8: the queue keeps flowing). With a single handler
// goroutine, message A is retried with a delay once; B, published after A
// was handled, and then C, published after B was handled, must both be
// handled before A comes back. Only the order of events is asserted: an
// adapter that held its only goroutine for the delay could not handle B
// before A's delay ended, and A would be back before C.
func (s suite) delayedRetry(t *testing.T) {
	b, _ := s.broker(t)
	ctx := ctxT(t)
	require.NoError(t, b.Declare(ctx, spec))
	a := Command("svc.do")
	require.NoError(t, b.Publish(ctx, a))

	var retried atomic.Bool
	seen := make(chan *transport.Delivery, 16)
	subscribe(t, b, transport.HandlerFunc(func(_ context.Context, d *transport.Delivery) transport.Outcome {
		seen <- d
		if d.MessageID == a.MessageID && retried.CompareAndSwap(false, true) {
			return transport.Retry(5 * time.Second)
		}
		return transport.Ack()
	}), &transport.SubscribeOpts{Concurrency: 1})

	first := next(t, seen)
	require.Equal(t, a.MessageID, first.MessageID)
	require.False(t, first.Redelivered)
	for _, label := range []string{"B", "C"} {
		m := Command("svc.do")
		require.NoError(t, b.Publish(ctx, m))
		got := next(t, seen)
		require.Equal(t, m.MessageID, got.MessageID,
			"message %s, published while A waits for its delayed retry, must be handled before A comes back (got %s, A is %s)", label, got.MessageID, a.MessageID)
	}
	back := next(t, seen)
	require.Equal(t, a.MessageID, back.MessageID, "A comes back after its delay")
	require.True(t, back.Redelivered)
	require.Equal(t, 1, back.Retries)
	require.Equal(t, first.Envelope, back.Envelope, "the envelope never changes on redelivery")
	require.Equal(t, first.Payload, back.Payload)
}

func next[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(Timeout):
		t.Fatal("transporttest: timed out")
		var zero T
		return zero
	}
}

// batchHandler records the batches it is handed and answers each delivery
// with outcome.
type batchHandler struct {
	mu      sync.Mutex
	sizes   []int
	seen    map[uuid.UUID]int
	outcome func(d *transport.Delivery) transport.Outcome
	handled chan uuid.UUID
}

func newBatchHandler(outcome func(d *transport.Delivery) transport.Outcome) *batchHandler {
	return &batchHandler{seen: map[uuid.UUID]int{}, outcome: outcome, handled: make(chan uuid.UUID, 1024)}
}

func (h *batchHandler) HandleDelivery(ctx context.Context, d *transport.Delivery) transport.Outcome {
	return h.HandleBatch(ctx, []*transport.Delivery{d})[0]
}

func (h *batchHandler) HandleBatch(_ context.Context, ds []*transport.Delivery) []transport.Outcome {
	h.mu.Lock()
	h.sizes = append(h.sizes, len(ds))
	outs := make([]transport.Outcome, len(ds))
	for i, d := range ds {
		h.seen[d.MessageID]++
		outs[i] = h.outcome(d)
	}
	h.mu.Unlock()
	for _, d := range ds {
		h.handled <- d.MessageID
	}
	return outs
}

func (h *batchHandler) snapshot() ([]int, map[uuid.UUID]int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	seen := make(map[uuid.UUID]int, len(h.seen))
	for k, v := range h.seen {
		seen[k] = v
	}
	return append([]int(nil), h.sizes...), seen
}

// batches checks batching: a backlog is handed over in batches of at most
// MaxBatch; in one batch, acknowledged deliveries are settled together and
// the others by their own outcome (a retried one comes back, once it is
// acknowledged it does not).
func (s suite) batches(t *testing.T) {
	b, _ := s.broker(t)
	ctx := ctxT(t)
	require.NoError(t, b.Declare(ctx, spec))
	const n, maxBatch = 60, 8
	msgs := make([]message.Message, n)
	retried := map[uuid.UUID]bool{}
	for i := range msgs {
		msgs[i] = Command("svc.do")
		if i%5 == 0 {
			retried[msgs[i].MessageID] = true
		}
	}
	require.NoError(t, b.Publish(ctx, msgs...))
	h := newBatchHandler(func(d *transport.Delivery) transport.Outcome {
		if retried[d.MessageID] && !d.Redelivered {
			return transport.Retry(0)
		}
		return transport.Ack()
	})
	stop := subscribe(t, b, h, &transport.SubscribeOpts{Concurrency: 2, MaxBatch: maxBatch})
	for range n + len(retried) {
		next(t, h.handled)
	}
	require.NoError(t, stop())
	sizes, seen := h.snapshot()
	biggest := 0
	for _, size := range sizes {
		require.LessOrEqual(t, size, maxBatch)
		biggest = max(biggest, size)
	}
	require.Greater(t, biggest, 1, "a backlog is handed over in batches: %v", sizes)
	for _, m := range msgs {
		want := 1
		if retried[m.MessageID] {
			want = 2
		}
		require.Equal(t, want, seen[m.MessageID], "message %s", m.MessageID)
	}

	// Nothing acknowledged comes back.
	again := newBatchHandler(func(*transport.Delivery) transport.Outcome { return transport.Ack() })
	probe := Command("svc.do")
	require.NoError(t, b.Publish(ctx, probe))
	stop = subscribe(t, b, again, &transport.SubscribeOpts{MaxBatch: maxBatch})
	require.Equal(t, probe.MessageID, next(t, again.handled), "only the probe is left in the queue")
	require.NoError(t, stop())
}

// concurrentBatches checks that batches handled at once settle only their
// own deliveries: while one delivery is still being handled, the batches of
// the deliveries after it are acknowledged (they do not come back), and the
// one being handled is settled by its own outcome (asked to be retried, it
// comes back).
func (s suite) concurrentBatches(t *testing.T) {
	b, _ := s.broker(t)
	ctx := ctxT(t)
	require.NoError(t, b.Declare(ctx, spec))
	slow := Command("svc.do")
	taken, release := make(chan struct{}), make(chan struct{})
	handled := make(chan uuid.UUID, 1024)
	var mu sync.Mutex
	seen := map[uuid.UUID]int{}
	h := batchFunc(func(ds []*transport.Delivery) []transport.Outcome {
		outs := make([]transport.Outcome, len(ds))
		for i, d := range ds {
			mu.Lock()
			seen[d.MessageID]++
			mu.Unlock()
			outs[i] = transport.Ack()
			if d.MessageID == slow.MessageID && !d.Redelivered {
				close(taken)
				<-release
				outs[i] = transport.Retry(0)
			}
		}
		for _, d := range ds {
			handled <- d.MessageID
		}
		return outs
	})
	stop := subscribe(t, b, h, &transport.SubscribeOpts{Concurrency: 2, MaxBatch: 4})
	require.NoError(t, b.Publish(ctx, slow))
	next(t, taken)
	// More than MaxBatch × Concurrency deliveries wait behind the slow one.
	const n = 20
	others := make([]message.Message, n)
	for i := range others {
		others[i] = Command("svc.do")
	}
	require.NoError(t, b.Publish(ctx, others...))
	for range n {
		require.NotEqual(t, slow.MessageID, next(t, handled))
	}
	close(release)
	require.Equal(t, slow.MessageID, next(t, handled), "the slow delivery's own batch")
	require.Equal(t, slow.MessageID, next(t, handled), "the slow delivery, retried, comes back")
	require.NoError(t, stop())
	mu.Lock()
	for _, m := range others {
		require.Equal(t, 1, seen[m.MessageID], "message %s", m.MessageID)
	}
	mu.Unlock()

	// Nothing acknowledged comes back.
	again := newBatchHandler(func(*transport.Delivery) transport.Outcome { return transport.Ack() })
	probe := Command("svc.do")
	require.NoError(t, b.Publish(ctx, probe))
	stop = subscribe(t, b, again, &transport.SubscribeOpts{MaxBatch: 4})
	require.Equal(t, probe.MessageID, next(t, again.handled), "only the probe is left in the queue")
	require.NoError(t, stop())
}

// batchFunc is a BatchHandler of a function.
type batchFunc func(ds []*transport.Delivery) []transport.Outcome

func (f batchFunc) HandleDelivery(_ context.Context, d *transport.Delivery) transport.Outcome {
	return f([]*transport.Delivery{d})[0]
}

func (f batchFunc) HandleBatch(_ context.Context, ds []*transport.Delivery) []transport.Outcome {
	return f(ds)
}

// idleBatches checks that deliveries that come one at a time are handed
// over one at a time, at once: batching never holds a lone delivery.
func (s suite) idleBatches(t *testing.T) {
	b, _ := s.broker(t)
	ctx := ctxT(t)
	require.NoError(t, b.Declare(ctx, spec))
	h := newBatchHandler(func(*transport.Delivery) transport.Outcome { return transport.Ack() })
	stop := subscribe(t, b, h, &transport.SubscribeOpts{MaxBatch: 16, Linger: time.Hour})
	for range 5 {
		m := Command("svc.do")
		require.NoError(t, b.Publish(ctx, m))
		require.Equal(t, m.MessageID, next(t, h.handled), "a lone delivery is handled without waiting for the linger")
	}
	require.NoError(t, stop())
	sizes, _ := h.snapshot()
	require.Equal(t, []int{1, 1, 1, 1, 1}, sizes)
}

func (s suite) deadLetter(t *testing.T) {
	b, in := s.broker(t)
	ctx := ctxT(t)
	require.NoError(t, b.Declare(ctx, spec))
	poison, good := Command("svc.do"), Command("svc.do")
	require.NoError(t, b.Publish(ctx, poison, good))

	acked := make(chan uuid.UUID, 2)
	subscribe(t, b, transport.HandlerFunc(func(_ context.Context, d *transport.Delivery) transport.Outcome {
		if d.MessageID == poison.MessageID {
			return transport.DeadLetter("insufficient stock for sku A-1")
		}
		acked <- d.MessageID
		return transport.Ack()
	}), nil)
	require.Equal(t, good.MessageID, next(t, acked), "the queue keeps flowing")
	dl, err := in.NextDeadLetter(ctx, spec.Name)
	require.NoError(t, err)
	require.Equal(t, poison.MessageID.String(), dl.MessageID)
	require.Equal(t, poison.Type, dl.Type)
	require.Contains(t, dl.Reason, "insufficient stock for sku A-1")
	require.JSONEq(t, string(poison.Payload), string(dl.Body))
}

func (s suite) malformed(t *testing.T) {
	b, in := s.broker(t)
	ctx := ctxT(t)
	require.NoError(t, b.Declare(ctx, spec))
	cases := []struct {
		name string
		raw  func(m message.Message) RawMessage
		want string // in the reason, case-insensitive
	}{
		{"empty body", func(m message.Message) RawMessage { return RawMessage{Valid: m, Body: []byte{}} }, "empty"},
		{"wrong content type", func(m message.Message) RawMessage { return RawMessage{Valid: m, ContentType: "text/plain"} }, "content"},
		{"missing message id", func(m message.Message) RawMessage { return RawMessage{Valid: m, OmitMessageID: true} }, "message"},
	}

	handled := make(chan uuid.UUID, len(cases))
	subscribe(t, b, transport.HandlerFunc(func(_ context.Context, d *transport.Delivery) transport.Outcome {
		handled <- d.MessageID
		return transport.Ack()
	}), nil)
	for _, tc := range cases {
		bad, good := Command("svc.do"), Command("svc.do")
		require.NoError(t, in.PublishRaw(ctx, tc.raw(bad)), tc.name)
		require.NoError(t, b.Publish(ctx, good), tc.name)
		dl, err := in.NextDeadLetter(ctx, spec.Name)
		require.NoError(t, err, tc.name)
		require.NotEmpty(t, dl.Reason, tc.name)
		require.Contains(t, strings.ToLower(dl.Reason), tc.want, "%s: reason %q", tc.name, dl.Reason)
		if !tc.raw(bad).OmitMessageID {
			require.Equal(t, bad.MessageID.String(), dl.MessageID, tc.name)
		}
		require.Equal(t, good.MessageID, next(t, handled), "%s: the good message after it is handled", tc.name)
	}
}

// bodyPassedThrough checks that the adapter does not parse the body: the
// receiver decodes it once, into the type it expects, and a body that is
// not JSON is its poison to handle.
func (s suite) bodyPassedThrough(t *testing.T) {
	b, in := s.broker(t)
	ctx := ctxT(t)
	require.NoError(t, b.Declare(ctx, spec))
	bodies := map[uuid.UUID][]byte{}
	got := make(chan *transport.Delivery, 4)
	subscribe(t, b, transport.HandlerFunc(func(_ context.Context, d *transport.Delivery) transport.Outcome {
		got <- d
		return transport.Ack()
	}), nil)
	for _, body := range [][]byte{{0x00, 0x9f, 0x92, 'x', 0xff}, []byte(`{"sku":"A-1","qty":`), []byte("{\"sku\":\"\xff\xfe\"}")} {
		m := Command("svc.do")
		bodies[m.MessageID] = body
		require.NoError(t, in.PublishRaw(ctx, RawMessage{Valid: m, Body: body}))
	}
	for range bodies {
		select {
		case d := <-got:
			require.Equal(t, bodies[d.MessageID], d.Payload, "the body reaches the handler as it was published")
		case <-ctx.Done():
			t.Fatal("a delivery with a body that is not JSON did not reach the handler")
		}
	}
}

func (s suite) cancel(t *testing.T) {
	b, _ := s.broker(t)
	ctx := ctxT(t)
	require.NoError(t, b.Declare(ctx, spec))
	require.NoError(t, b.Publish(ctx, Command("svc.do")))

	started, release, handlerDone := make(chan struct{}), make(chan struct{}), make(chan struct{})
	stop := subscribe(t, b, transport.HandlerFunc(func(_ context.Context, d *transport.Delivery) transport.Outcome {
		close(started)
		<-release
		close(handlerDone)
		return transport.Ack()
	}), nil)
	requireStopWaits(t, stop, started, release, handlerDone, "its handler finished")
}

// requireStopWaits stops a subscription while its handler is blocked
// (started closed, waiting for release) and fails unless Subscribe returns
// only after the handler is done (handlerDone closed) and without error.
func requireStopWaits(t *testing.T, stop func() error, started, release, handlerDone chan struct{}, what string) {
	t.Helper()
	next(t, started)
	returned := make(chan error, 1)
	go func() { returned <- stop() }()
	close(release)
	require.NoError(t, next(t, returned))
	select {
	case <-handlerDone:
	default:
		t.Fatal("Subscribe returned before " + what)
	}
}

func (s suite) concurrency(t *testing.T) {
	b, _ := s.broker(t)
	ctx := ctxT(t)
	require.NoError(t, b.Declare(ctx, spec))
	const conc, n = 3, 9
	msgs := make([]message.Message, n)
	for i := range msgs {
		msgs[i] = Command("svc.do")
	}
	require.NoError(t, b.Publish(ctx, msgs...))

	var active, peak atomic.Int32
	reached := make(chan struct{})
	var once sync.Once
	done := make(chan struct{}, n)
	subscribe(t, b, transport.HandlerFunc(func(ctx context.Context, d *transport.Delivery) transport.Outcome {
		a := active.Add(1)
		for p := peak.Load(); a > p && !peak.CompareAndSwap(p, a); p = peak.Load() {
		}
		if a == conc {
			once.Do(func() { close(reached) })
		}
		select {
		case <-reached:
		case <-ctx.Done():
		}
		active.Add(-1)
		done <- struct{}{}
		return transport.Ack()
	}), &transport.SubscribeOpts{Concurrency: conc})
	for range n {
		next(t, done)
	}
	require.EqualValues(t, conc, peak.Load(), "handlers run at most Concurrency at once, and that many")
}

// batchConcurrency checks that a batching subscription hands out at most
// Concurrency batches at once, and that many when deliveries wait.
func (s suite) batchConcurrency(t *testing.T) {
	b, _ := s.broker(t)
	ctx := ctxT(t)
	require.NoError(t, b.Declare(ctx, spec))
	const conc, maxBatch, n = 3, 2, 24
	msgs := make([]message.Message, n)
	for i := range msgs {
		msgs[i] = Command("svc.do")
	}
	require.NoError(t, b.Publish(ctx, msgs...))

	var active atomic.Int32
	release := make(chan struct{})
	done := make(chan struct{}, n)
	subscribe(t, b, batchFunc(func(ds []*transport.Delivery) []transport.Outcome {
		active.Add(1)
		<-release
		active.Add(-1)
		outs := make([]transport.Outcome, len(ds))
		for i := range ds {
			outs[i] = transport.Ack()
			done <- struct{}{}
		}
		return outs
	}), &transport.SubscribeOpts{Concurrency: conc, MaxBatch: maxBatch})
	var freed sync.Once
	free := func() { freed.Do(func() { close(release) }) }
	t.Cleanup(free) // before the subscription's own cleanup, should a check fail
	require.Eventually(t, func() bool { return active.Load() >= conc }, Timeout, 10*time.Millisecond,
		"Concurrency batches are handled at once while deliveries wait")
	require.Never(t, func() bool { return active.Load() > conc }, 300*time.Millisecond, 10*time.Millisecond,
		"no more than Concurrency batches at once")
	free()
	for range n {
		next(t, done)
	}
}

// cancelBatches checks that a batching subscription returns on cancel only
// once its batches in flight are handled, and that what they acknowledged
// does not come back.
func (s suite) cancelBatches(t *testing.T) {
	b, _ := s.broker(t)
	ctx := ctxT(t)
	require.NoError(t, b.Declare(ctx, spec))
	first := Command("svc.do")
	require.NoError(t, b.Publish(ctx, first))

	started, release, handlerDone := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var once sync.Once
	stop := subscribe(t, b, batchFunc(func(ds []*transport.Delivery) []transport.Outcome {
		once.Do(func() {
			close(started)
			<-release
			close(handlerDone)
		})
		outs := make([]transport.Outcome, len(ds))
		for i := range outs {
			outs[i] = transport.Ack()
		}
		return outs
	}), &transport.SubscribeOpts{Concurrency: 2, MaxBatch: 8})
	requireStopWaits(t, stop, started, release, handlerDone, "its batch was handled")

	again := newBatchHandler(func(*transport.Delivery) transport.Outcome { return transport.Ack() })
	probe := Command("svc.do")
	require.NoError(t, b.Publish(ctx, probe))
	stop = subscribe(t, b, again, &transport.SubscribeOpts{MaxBatch: 8})
	require.Equal(t, probe.MessageID, next(t, again.handled), "the batch handled before the cancel was acknowledged")
	require.NoError(t, stop())
}

func (s suite) declareIdempotent(t *testing.T) {
	b, _ := s.broker(t)
	ctx := ctxT(t)
	require.NoError(t, b.Declare(ctx, spec))
	require.NoError(t, b.Declare(ctx, spec))
	require.NoError(t, b.Publish(ctx, Command("svc.do")))
	c := newCollector()
	subscribe(t, b, c, nil)
	c.next(t)
}

// routes checks a transport.RouteChecker: a command is routable once a
// queue takes it and not before, a command no queue takes never is, and
// whatever the check does never reaches a handler (single or batched) nor
// a dead-letter queue.
func (s suite) routes(t *testing.T) {
	b, in := s.broker(t)
	rc, ok := b.(transport.RouteChecker)
	if !ok {
		t.Logf("transporttest: %T does not implement transport.RouteChecker: nothing to check", b)
		return
	}
	ctx := ctxT(t)
	before, err := rc.Routable(ctx, []string{"svc.do", "nobody.listens"})
	require.NoError(t, err)
	require.Equal(t, map[string]bool{"svc.do": false, "nobody.listens": false}, before, "no queue declared yet")

	require.NoError(t, b.Declare(ctx, spec))
	got, err := rc.Routable(ctx, []string{"svc.do", "svc.undo", "nobody.listens", "svc.do"})
	require.NoError(t, err)
	require.Equal(t, map[string]bool{"svc.do": true, "svc.undo": true, "nobody.listens": false}, got)
	empty, err := rc.Routable(ctx, nil)
	require.NoError(t, err)
	require.Empty(t, empty)

	// The probes wait in the queue ahead of these; a batching subscriber
	// takes them together.
	first := []message.Message{Command("svc.do"), Command("svc.undo"), Command("svc.do")}
	require.NoError(t, b.Publish(ctx, first...))
	marker := Command("svc.do")
	h := newBatchHandler(func(d *transport.Delivery) transport.Outcome {
		if d.MessageID == marker.MessageID {
			return transport.DeadLetter("marker")
		}
		return transport.Ack()
	})
	subscribe(t, b, h, &transport.SubscribeOpts{MaxBatch: 8})
	for range first {
		next(t, h.handled)
	}
	// An idle queue hands its deliveries one by one.
	_, err = rc.Routable(ctx, []string{"svc.do"})
	require.NoError(t, err)
	last := Command("svc.do")
	require.NoError(t, b.Publish(ctx, last))
	require.Equal(t, last.MessageID, next(t, h.handled))
	_, seen := h.snapshot()
	want := map[uuid.UUID]int{last.MessageID: 1}
	for _, m := range first {
		want[m.MessageID] = 1
	}
	require.Equal(t, want, seen, "the handler saw the commands and nothing else")

	// Nothing was dead-lettered before the marker.
	require.NoError(t, b.Publish(ctx, marker))
	dl, err := in.NextDeadLetter(ctx, spec.Name)
	require.NoError(t, err)
	require.Equal(t, marker.MessageID.String(), dl.MessageID, "a probe was dead-lettered")
}
