package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime/debug"
	"sync"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/transport"
)

const (
	// panicRetryDelay is the Retry delay of a delivery whose handler
	// panicked.
	panicRetryDelay = time.Second
	// deadLetterRetryDelay is how long a delivery that could not be
	// dead-lettered waits before it is returned to its queue.
	deadLetterRetryDelay = time.Second
)

// Subscribe declares spec and hands every delivery of its queue to h, from
// opts.Concurrency goroutines with a prefetch of opts.Prefetch, until ctx is
// cancelled; then it waits for the handlers in flight and returns nil.
//
// The handler's Outcome decides: Ack acknowledges; Retry(0) returns the
// message to the queue at once; Retry(d) parks a copy of it in the retry
// queue for d rounded up to one of RetryDelays (the copy is confirmed, then
// the message acknowledged), from which it comes back to the queue with
// Delivery.Redelivered set and Delivery.Retries incremented; DeadLetter
// copies the message, with the reason, to the queue's dead-letter queue
// (confirmed) and then acknowledges it. A delivery that cannot be decoded is
// dead-lettered without calling h. A handler that panics is treated as
// Retry(1s) and logged.
//
// Subscribe consumes and acknowledges on the broker's consuming connection,
// which never publishes; the dead-letter and retry copies are published on
// the publishing connection. So a broker alarm, which blocks only publishing
// connections, never stalls consuming or acknowledging: while the publishing
// connection is blocked (or down) a copy fails at once and its delivery goes
// back to the queue instead (a dead letter after a second; a delayed retry
// after its delay), to be settled again once publishing is possible.
//
// When the consuming connection is lost Subscribe waits for the broker to
// reconnect and resumes; deliveries that were in flight are redelivered by
// RabbitMQ.
// It returns ErrClosed when the broker is closed, and an error when spec
// cannot be declared as asked (for instance a queue that exists with
// another type).
func (b *Broker) Subscribe(ctx context.Context, spec transport.QueueSpec, h transport.Handler, opts *transport.SubscribeOpts) error {
	if err := validateSpec(spec); err != nil {
		return fmt.Errorf("%w: %w", transport.ErrPermanent, err)
	}
	if h == nil {
		return errors.New("rabbitmq: subscribe: handler is nil")
	}
	var o transport.SubscribeOpts
	if opts != nil {
		o = *opts
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 1
	}
	if o.Prefetch <= 0 {
		o.Prefetch = 2 * o.Concurrency
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = 1
	}
	log := b.log.With("queue", b.QueueName(spec.Name))
	for attempt := 1; ; attempt++ {
		sess, err := b.awaitSession(ctx, &b.con)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		started, err := b.consume(ctx, sess, spec, h, o)
		if ctx.Err() != nil {
			return nil
		}
		if b.closed() {
			return ErrClosed
		}
		if started {
			attempt = 1
		} else if isPermanent(err) {
			if !errors.Is(err, transport.ErrPermanent) {
				err = fmt.Errorf("%w: %w", err, transport.ErrPermanent)
			}
			return err
		}
		if !b.sessionOver(sess) {
			// The channel failed on a live connection (or the consumer was
			// cancelled, e.g. its queue deleted): back off before retrying.
			log.Warn("rabbitmq consumer interrupted; resubscribing", "err", err)
			if !sleepCtx(ctx, backoff(b.cfg.ReconnectMin, b.cfg.ReconnectMax, attempt)) {
				return nil
			}
		}
	}
}

// isPermanent reports whether a declare or consume error will not go away
// by retrying.
func isPermanent(err error) bool {
	var aerr *amqp.Error
	if !errors.As(err, &aerr) {
		return false
	}
	switch aerr.Code {
	case amqp.PreconditionFailed, amqp.AccessRefused, amqp.NotAllowed:
		return true
	}
	return false
}

// consume runs o.Concurrency consumers of spec's queue on sess, each on a
// channel of its own, until ctx is done or a channel closes, then waits for
// their handlers. A batching subscription runs one consumer instead, whose
// batches are handled by o.Concurrency workers (consumeBatches). started
// reports whether consuming began.
func (b *Broker) consume(ctx context.Context, sess *session, spec transport.QueueSpec, h transport.Handler, o transport.SubscribeOpts) (started bool, err error) {
	ch, err := sess.conn.Channel()
	if err != nil {
		return false, fmt.Errorf("rabbitmq: subscribe %s: open channel: %w", spec.Name, err)
	}
	if err := b.declareSpec(ch, spec); err != nil {
		_ = ch.Close()
		return false, err
	}
	b.remember(spec)
	queue := b.QueueName(spec.Name)
	bh, batching := h.(transport.BatchHandler)
	batching = batching && o.MaxBatch > 1
	consumers := o.Concurrency
	prefetch := (o.Prefetch + o.Concurrency - 1) / o.Concurrency
	if batching {
		consumers, prefetch = 1, max(o.Prefetch, 2*o.MaxBatch*o.Concurrency)
	}

	// Each consumer has a channel of its own.
	workCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	closedErr := make(chan error, consumers)
	for i := range consumers {
		if i > 0 {
			if ch, err = sess.conn.Channel(); err != nil {
				stop()
				wg.Wait()
				return started, fmt.Errorf("rabbitmq: subscribe %s: open channel: %w", spec.Name, err)
			}
		}
		c := ch
		closed := c.NotifyClose(make(chan *amqp.Error, 1))
		if err := c.Qos(prefetch, 0, false); err != nil {
			_ = c.Close()
			stop()
			wg.Wait()
			return started, fmt.Errorf("rabbitmq: subscribe %s: qos: %w", spec.Name, err)
		}
		deliveries, err := c.Consume(queue, "", false, false, false, false, nil)
		if err != nil {
			_ = c.Close()
			stop()
			wg.Wait()
			return started, fmt.Errorf("rabbitmq: subscribe %s: consume: %w", spec.Name, err)
		}
		started = true
		wg.Go(func() {
			defer func() { _ = c.Close() }()
			if batching {
				b.consumeBatches(workCtx, spec.Name, queue, bh, deliveries, c, o)
			} else {
				b.consumeOne(workCtx, spec.Name, queue, h, deliveries)
			}
			// The channel closed, or the subscription ends: the other
			// consumers stop too, and the subscription starts over.
			stop()
			select {
			case cerr := <-closed:
				if cerr != nil {
					closedErr <- cerr
				}
			default:
			}
		})
	}
	wg.Wait()
	select {
	case cerr := <-closedErr:
		return true, cerr
	default:
		if ctx.Err() != nil {
			return true, nil
		}
		return true, errors.New("consumer cancelled by the broker")
	}
}

// consumeOne hands deliveries to h one at a time until ctx is done or the
// channel closes.
func (b *Broker) consumeOne(ctx context.Context, name, queue string, h transport.Handler, deliveries <-chan amqp.Delivery) {
	for {
		select {
		case <-ctx.Done():
			return
		case d, ok := <-deliveries:
			if !ok {
				return
			}
			b.handle(ctx, name, queue, h, d, nil)
		}
	}
}

// handle decodes d, runs h and settles d according to its outcome. With
// acks (a batching consumer's) an acknowledgement goes through acks, and a
// delivery settled otherwise is reported to it; without, d is acknowledged
// on its own.
func (b *Broker) handle(ctx context.Context, name, queue string, h transport.Handler, d amqp.Delivery, acks *ackWindow) {
	if b.dropProbe(queue, d, acks) {
		return
	}
	del, err := DecodeDelivery(d)
	if err != nil {
		b.malformed(ctx, queue, d, err)
		acks.settled(d.DeliveryTag)
		return
	}
	del.Queue = name
	out := b.call(ctx, queue, h, del)
	switch out.Action {
	case transport.ActionAck:
		if acks != nil {
			acks.ack(d.DeliveryTag)
			return
		}
		b.settle(d.Ack(false), queue, d, "ack")
	case transport.ActionDeadLetter:
		b.deadLetter(ctx, queue, d, &del.Envelope, out.Reason, true)
	default:
		if out.Action != transport.ActionRetry {
			b.log.Error("rabbitmq handler returned an unknown action; retrying", "queue", queue, "message_id", d.MessageId, "action", int(out.Action))
		}
		b.retry(ctx, name, queue, d, del, out.Delay)
	}
	acks.settled(d.DeliveryTag)
}

// malformed dead-letters a delivery that does not decode.
func (b *Broker) malformed(ctx context.Context, queue string, d amqp.Delivery, err error) {
	b.adapterDeadLetters.Add(ctx, 1, metric.WithAttributes(
		attribute.String("sagabox.component", "rabbitmq"),
		attribute.String("sagabox.dead_letter.reason", "malformed"),
		attribute.String("sagabox.queue", queue)))
	b.deadLetter(ctx, queue, d, nil, "malformed message: "+err.Error(), false)
}

// retry returns d to its queue: at once for a delay of 0 (nack with
// requeue); otherwise it parks a copy of d in the retry queue for the delay
// (published and confirmed on the publishing connection) and then
// acknowledges d, holding neither d nor the calling
// goroutine while the copy waits. The copy keeps d's body, properties and
// headers, with HeaderRetries incremented and HeaderRoutingKey set. If the
// copy cannot be confirmed, d waits out the delay here and goes back to its
// queue as before: it is never lost. On a quorum queue with a DeliveryLimit,
// a message already retried that many times is dead-lettered instead.
func (b *Broker) retry(ctx context.Context, name, queue string, d amqp.Delivery, del *transport.Delivery, delay time.Duration) {
	if delay <= 0 {
		b.settle(d.Nack(false, true), queue, d, "nack")
		return
	}
	if b.cfg.QueueType == QueueTypeQuorum && b.cfg.DeliveryLimit > 0 && del.Retries >= b.cfg.DeliveryLimit {
		b.adapterDeadLetters.Add(ctx, 1, metric.WithAttributes(
			attribute.String("sagabox.component", "rabbitmq"),
			attribute.String("sagabox.dead_letter.reason", "delivery_limit"),
			attribute.String("sagabox.queue", queue)))
		b.deadLetter(ctx, queue, d, &del.Envelope, fmt.Sprintf("delivery limit reached: retried %d times (Config.DeliveryLimit %d)", del.Retries, b.cfg.DeliveryLimit), false)
		return
	}
	rq := b.RetryQueueName(name, delay)
	attrs := []any{"queue", queue, "message_id", d.MessageId, "saga_id", del.SagaID.String(), "type", d.Type, "retry_queue", rq}
	headers := maps.Clone(d.Headers)
	if headers == nil {
		headers = amqp.Table{}
	}
	headers[HeaderRetries] = int64(del.Retries + 1)
	headers[HeaderRoutingKey] = del.RoutingKey
	err := headers.Validate()
	if err == nil {
		// The decision is taken: finish it even if ctx is being cancelled.
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.cfg.ConfirmTimeout)
		var failed map[int]error
		// The default exchange routes to the retry queue by its name.
		failed, err = b.publish(pctx, []pubItem{{exchange: "", key: rq, msg: copyOf(d, headers)}})
		cancel()
		if err == nil {
			err = failed[0]
		}
	}
	if err != nil {
		b.log.Warn("rabbitmq delayed retry could not be scheduled; holding the message for its delay", append(attrs, "retry_in", delay, "err", err)...)
		sleepCtx(ctx, delay)
		b.settle(d.Nack(false, true), queue, d, "nack")
		return
	}
	// If this ack is lost, d is redelivered and the copy comes back too:
	// one more duplicate, which receivers deduplicate.
	b.settle(d.Ack(false), queue, d, "ack")
}

// copyOf returns a persistent publishing with d's body, properties (but
// user id and expiration) and the given headers.
func copyOf(d amqp.Delivery, headers amqp.Table) amqp.Publishing {
	return amqp.Publishing{
		Headers:         headers,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    amqp.Persistent,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		AppId:           d.AppId,
		Body:            d.Body,
	}
}

// call runs h, turning a panic into Retry.
func (b *Broker) call(ctx context.Context, queue string, h transport.Handler, d *transport.Delivery) (out transport.Outcome) {
	defer func() {
		if r := recover(); r != nil {
			b.log.Error("rabbitmq handler panicked; retrying the message",
				"queue", queue, "message_id", d.MessageID.String(), "saga_id", d.SagaID.String(), "type", d.Type,
				"panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			out = transport.Retry(panicRetryDelay)
		}
	}()
	return h.HandleDelivery(ctx, d)
}

func (b *Broker) settle(err error, queue string, d amqp.Delivery, what string) {
	if err != nil {
		// The channel is gone: RabbitMQ redelivers the message.
		b.log.Debug("rabbitmq "+what+" failed; the message will be redelivered", "queue", queue, "message_id", d.MessageId, "err", err)
	}
}

// deadLetter publishes a copy of d, with reason, to the dead-letter exchange
// (routing key = queue), on the publishing connection, and acknowledges d
// (on the consuming connection) once the broker confirmed the copy. If the copy cannot be confirmed, d goes back to its queue. A dead
// letter the adapter decided on (a malformed message) is logged at Error; one
// the handler decided on was logged by the handler, and is logged here at
// Debug only, so that each dead letter is logged once.
func (b *Broker) deadLetter(ctx context.Context, queue string, d amqp.Delivery, env *message.Envelope, reason string, byHandler bool) {
	headers := maps.Clone(d.Headers)
	if headers == nil {
		headers = amqp.Table{}
	}
	now := time.Now().UTC()
	reason = headerText(reason)
	headers[HeaderDeadLetterReason] = reason
	headers[HeaderDeadLetterQueue] = queue
	headers[HeaderDeadLetterAt] = now.Format(time.RFC3339Nano)
	if headers.Validate() != nil {
		// Headers we cannot re-send as they are: keep ours only.
		headers = amqp.Table{
			HeaderDeadLetterReason: reason,
			HeaderDeadLetterQueue:  queue,
			HeaderDeadLetterAt:     now.Format(time.RFC3339Nano),
		}
	}
	msg := copyOf(d, headers)
	attrs := []any{"queue", queue, "message_id", d.MessageId, "type", d.Type, "reason", reason}
	if env != nil {
		attrs = append(attrs, "saga_id", env.SagaID.String())
	} else if s, ok := d.Headers[HeaderSagaID].(string); ok {
		attrs = append(attrs, "saga_id", s)
	}

	// The decision is taken: finish it even if ctx is being cancelled.
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.cfg.ConfirmTimeout)
	defer cancel()
	failed, err := b.publish(pctx, []pubItem{{exchange: b.ExchangeName(ExchangeDeadLetter), key: queue, msg: msg}})
	if err == nil {
		err = failed[0]
	}
	if err != nil {
		b.log.Error("rabbitmq dead-letter publish failed; returning the message to its queue", append(attrs, "err", err)...)
		sleepCtx(ctx, deadLetterRetryDelay)
		b.settle(d.Nack(false, true), queue, d, "nack")
		return
	}
	if byHandler {
		b.log.Debug("rabbitmq message dead-lettered", attrs...)
	} else {
		b.log.Error("rabbitmq message dead-lettered", attrs...)
	}
	b.settle(d.Ack(false), queue, d, "ack")
}

// maxReasonHeader is the most bytes of a dead-letter reason carried in a
// header: a frame over the broker's frame_max (128 KiB by default) closes
// the connection, and the message would then never be dead-lettered.
const maxReasonHeader = 4 << 10

// headerText returns s cut after maxReasonHeader bytes, with a note of its
// length.
func headerText(s string) string {
	if len(s) <= maxReasonHeader {
		return s
	}
	cut := maxReasonHeader
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (cut from %d bytes)", s[:cut], len(s))
}
