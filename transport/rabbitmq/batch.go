package rabbitmq

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sagabox/sagabox/transport"
)

// consumeBatches hands deliveries to h in batches (see
// transport.SubscribeOpts.MaxBatch) until ctx is done or the channel closes.
//
// One collector takes the channel's deliveries and o.Concurrency workers
// handle the batches it forms. A batch goes to the first free worker: it
// holds what came while every worker was busy, up to MaxBatch, so batches
// grow with the load by themselves (and with no wait) and a lone delivery to
// an idle consumer is handled at once. Once deliveries come faster than one
// at a time the collector also lingers up to o.Linger for more before it
// hands a batch over. The workers' acknowledgements go through one
// ackWindow, which settles them with multiple-acks.
func (b *Broker) consumeBatches(ctx context.Context, name, queue string, h transport.BatchHandler, deliveries <-chan amqp.Delivery, ch *amqp.Channel, o transport.SubscribeOpts) {
	linger := o.Linger
	if linger <= 0 {
		linger = transport.DefaultLinger
	}
	acks := newAckWindow(b, ch, queue, o.MaxBatch*o.Concurrency)
	work := make(chan []amqp.Delivery)
	var workers sync.WaitGroup
	for range o.Concurrency {
		workers.Go(func() {
			for batch := range work {
				b.handleBatch(ctx, name, queue, h, batch, acks)
			}
		})
	}
	defer func() {
		close(work)
		workers.Wait()
	}()

	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	in := deliveries
	previous := 0
	var batch []amqp.Delivery
	take := func(d amqp.Delivery) {
		acks.received(d.DeliveryTag)
		batch = append(batch, d)
	}
	for {
		if len(batch) == 0 {
			select {
			case <-ctx.Done():
				return
			case d, ok := <-in:
				if !ok {
					return
				}
				take(d)
			}
		}
		// Take what is waiting.
		for in != nil && len(batch) < o.MaxBatch {
			d, ok, waiting := receiveWaiting(in)
			if !waiting {
				break
			}
			if !ok {
				in = nil
				break
			}
			take(d)
		}
		// Linger only once deliveries come faster than one at a time, so
		// that an idle queue's deliveries are handled at once.
		lingering := in != nil && len(batch) < o.MaxBatch && (previous > 1 || len(batch) > 1)
		if lingering {
			timer.Reset(linger)
		}
		// Until a worker takes the batch, it goes on growing.
		for handed := false; !handed; {
			next, out := in, work
			if len(batch) >= o.MaxBatch {
				next = nil
			}
			if lingering && next != nil {
				out = nil
			}
			select {
			case d, ok := <-next:
				if !ok {
					in = nil
					continue
				}
				take(d)
			case out <- batch:
				handed = true
			case <-timer.C:
				lingering = false
			case <-ctx.Done():
				// The batch is never handled: the channel's close returns
				// its deliveries to the queue.
				return
			}
		}
		timer.Stop()
		previous, batch = len(batch), nil
		if in == nil {
			return // the channel closed
		}
	}
}

// receiveWaiting takes a delivery from deliveries if one is waiting there:
// waiting is false when none is, ok false when deliveries is closed. amqp091
// hands deliveries over from a goroutine of its own that, after each
// hand-off, must run again before it offers the next, so a receive that
// finds nothing yields once and tries again: without that, a backlog
// already in the client's buffer looks empty and is taken one at a time.
func receiveWaiting(deliveries <-chan amqp.Delivery) (d amqp.Delivery, ok, waiting bool) {
	for try := 0; ; try++ {
		select {
		case d, ok = <-deliveries:
			return d, ok, true
		default:
		}
		if try == 1 {
			return d, false, false
		}
		runtime.Gosched()
	}
}

// handleBatch decodes batch, runs h on the deliveries that decode and
// settles each by its outcome: the acknowledged ones through acks, once the
// others are settled one by one.
func (b *Broker) handleBatch(ctx context.Context, name, queue string, h transport.BatchHandler, batch []amqp.Delivery, acks *ackWindow) {
	if len(batch) == 1 {
		b.handle(ctx, name, queue, h, batch[0], acks)
		return
	}
	raws := make([]amqp.Delivery, 0, len(batch))
	dels := make([]*transport.Delivery, 0, len(batch))
	for _, d := range batch {
		if b.dropProbe(queue, d, acks) {
			continue
		}
		del, err := DecodeDelivery(d)
		if err != nil {
			b.malformed(ctx, queue, d, err)
			acks.settled(d.DeliveryTag)
			continue
		}
		del.Queue = name
		raws, dels = append(raws, d), append(dels, del)
	}
	if len(dels) == 0 {
		return
	}
	outs := b.callBatch(ctx, queue, h, dels)
	acked := make([]uint64, 0, len(raws))
	for i, d := range raws {
		switch out := outs[i]; out.Action {
		case transport.ActionAck:
			acked = append(acked, d.DeliveryTag)
			continue
		case transport.ActionDeadLetter:
			b.deadLetter(ctx, queue, d, &dels[i].Envelope, out.Reason, true)
		default:
			b.retry(ctx, name, queue, d, dels[i], out.Delay)
		}
		acks.settled(d.DeliveryTag)
	}
	acks.ack(acked...)
}

// callBatch runs h on ds, turning a panic (or a wrong number of outcomes)
// into Retry for every delivery.
func (b *Broker) callBatch(ctx context.Context, queue string, h transport.BatchHandler, ds []*transport.Delivery) (outs []transport.Outcome) {
	retryAll := func() []transport.Outcome {
		outs := make([]transport.Outcome, len(ds))
		for i := range outs {
			outs[i] = transport.Retry(panicRetryDelay)
		}
		return outs
	}
	defer func() {
		if r := recover(); r != nil {
			b.log.Error("rabbitmq batch handler panicked; retrying its deliveries", "queue", queue, "deliveries", len(ds),
				"panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			outs = retryAll()
		}
	}()
	outs = h.HandleBatch(ctx, ds)
	if len(outs) != len(ds) {
		b.log.Error("rabbitmq batch handler returned the wrong number of outcomes; retrying its deliveries", "queue", queue, "deliveries", len(ds), "outcomes", len(outs))
		return retryAll()
	}
	return outs
}

// ackState is where a delivery of an ackWindow stands.
type ackState uint8

const (
	// ackHandling: its handler has not finished.
	ackHandling ackState = iota
	// ackWaiting: it is to be acknowledged.
	ackWaiting
	// ackSettled: it was settled on its own (nack, dead letter, retry).
	ackSettled
)

// ackWindow acknowledges the deliveries of one consuming channel whose
// batches are handled concurrently. A multiple-ack settles every delivery
// of the channel up to its tag, so it is sent only for a tag below which no
// delivery is still being handled: the window keeps the deliveries in the
// order they came, and acknowledges the settled run at their head with one
// multiple-ack of its last acknowledged tag. Should a slow handler hold the
// head while more than maxWaiting deliveries after it wait, they are
// acknowledged one by one, so that handled deliveries never fill the
// prefetch.
type ackWindow struct {
	b          *Broker
	ch         *amqp.Channel
	queue      string
	maxWaiting int

	mu      sync.Mutex
	order   []uint64 // tags received, oldest first, from the head on
	state   map[uint64]ackState
	waiting int // tags in state ackWaiting
}

func newAckWindow(b *Broker, ch *amqp.Channel, queue string, maxWaiting int) *ackWindow {
	return &ackWindow{b: b, ch: ch, queue: queue, maxWaiting: max(maxWaiting, 1), state: map[uint64]ackState{}}
}

// received adds a delivery, in the order of the channel.
func (w *ackWindow) received(tag uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.order = append(w.order, tag)
	w.state[tag] = ackHandling
}

// ack acknowledges the deliveries tags.
func (w *ackWindow) ack(tags ...uint64) {
	if len(tags) == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, tag := range tags {
		w.state[tag] = ackWaiting
	}
	w.waiting += len(tags)
	w.advance()
}

// settled records that the delivery tag was settled on its own. It is a
// no-op on a nil window (a consumer without batches).
func (w *ackWindow) settled(tag uint64) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.state[tag] = ackSettled
	w.advance()
}

// advance acknowledges the settled run at the head of the window, and the
// waiting deliveries one by one when too many wait behind a delivery still
// being handled. The frames go out under w.mu, so that a multiple-ack never
// follows one of a higher tag. w.mu is held.
func (w *ackWindow) advance() {
	var last uint64
	i := 0
	for ; i < len(w.order); i++ {
		tag := w.order[i]
		st := w.state[tag]
		if st == ackHandling {
			break
		}
		if st == ackWaiting {
			last = tag
			w.waiting--
		}
		delete(w.state, tag)
	}
	w.order = w.order[i:]
	if last != 0 {
		w.settle(w.ch.Ack(last, true), "multiple ack")
	}
	if w.waiting <= w.maxWaiting {
		return
	}
	for _, tag := range w.order {
		if w.state[tag] == ackWaiting {
			w.settle(w.ch.Ack(tag, false), "ack")
			w.state[tag] = ackSettled
		}
	}
	w.waiting = 0
}

func (w *ackWindow) settle(err error, what string) {
	if err != nil {
		// The channel is gone: RabbitMQ redelivers what it did not settle.
		w.b.log.Debug("rabbitmq "+what+" failed; the messages will be redelivered", "queue", w.queue, "err", err)
	}
}
