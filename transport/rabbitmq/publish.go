package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/transport"
)

// pubItem is one message of a batch, ready for the wire.
type pubItem struct {
	idx      int // index in the caller's batch
	exchange string
	key      string
	msg      amqp.Publishing
}

// pubRequest is a batch handed to a publisher goroutine.
type pubRequest struct {
	items    []pubItem
	deadline time.Time
	cancel   <-chan struct{} // the caller's ctx.Done()
	result   chan pubResult  // buffered: the publisher never blocks on it
}

type pubResult struct {
	failed map[int]error // by pubItem.idx
}

// Publish sends msgs to the exchange of their kind with their routing key,
// pipelined on a confirm-mode channel, and waits for every confirm, at most
// Config.ConfirmTimeout. It returns nil when all were confirmed and a
// *transport.PublishError naming the failed ones otherwise: unroutable
// (ErrUnroutable), refused (ErrNacked), messages that cannot be encoded, and
// messages whose confirm did not arrive in time. While the publishing
// connection is down or blocked by a broker alarm it fails at once with
// ErrNotConnected or ErrBlocked: nothing was published. Consuming goes on
// meanwhile, on the broker's other connection.
func (b *Broker) Publish(ctx context.Context, msgs ...message.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	failed := make(map[int]error)
	items := make([]pubItem, 0, len(msgs))
	for i, m := range msgs {
		p, err := EncodeMessage(m)
		if err != nil {
			failed[i] = fmt.Errorf("rabbitmq: %w", err)
			continue
		}
		items = append(items, pubItem{idx: i, exchange: b.ExchangeName(transport.Exchange(m.Kind)), key: m.RoutingKey, msg: p})
	}
	if len(items) > 0 {
		res, err := b.publish(ctx, items)
		if err != nil {
			if len(failed) == 0 {
				return err
			}
			for _, it := range items {
				failed[it.idx] = err
			}
		}
		for i, err := range res {
			failed[i] = err
		}
	}
	if len(failed) == 0 {
		return nil
	}
	return &transport.PublishError{Failed: failed}
}

// publish hands items to a publisher goroutine of the live session of the
// publishing connection and waits for its verdict. A non-nil error means
// none of items was published.
func (b *Broker) publish(ctx context.Context, items []pubItem) (map[int]error, error) {
	if b.closed() {
		return nil, ErrClosed
	}
	sess := b.pub.current()
	if sess == nil {
		return nil, ErrNotConnected
	}
	reason, blocked := sess.blockState()
	if blocked != nil {
		return nil, fmt.Errorf("%w: %s", ErrBlocked, reason)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("rabbitmq: publish: %w", err)
	}
	deadline := time.Now().Add(b.cfg.ConfirmTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	req := &pubRequest{items: items, deadline: deadline, cancel: ctx.Done(), result: make(chan pubResult, 1)}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()

	select {
	case sess.pubReq <- req:
	case <-ctx.Done():
		return nil, fmt.Errorf("rabbitmq: publish: %w", ctx.Err())
	case <-timer.C:
		return nil, fmt.Errorf("rabbitmq: publish: no publisher channel free within %s", b.cfg.ConfirmTimeout)
	case <-sess.lost:
		return nil, ErrNotConnected
	case <-b.done:
		return nil, ErrClosed
	}
	// From here the publisher owns the batch and replies by the deadline:
	// waiting for its reply rather than for ctx keeps the answer exact. The
	// grace period covers a publisher stuck writing to a socket the broker
	// stopped reading (a blocked connection).
	timer.Reset(time.Until(deadline) + publishGrace)
	select {
	case res := <-req.result:
		return res.failed, nil
	case <-timer.C:
		return nil, fmt.Errorf("rabbitmq: publish: no answer from the broker within %s; the batch may or may not have been published", b.cfg.ConfirmTimeout+publishGrace)
	}
}

// publishGrace is how long Publish waits past its deadline for a publisher
// to report.
const publishGrace = time.Second

// publisher serves batches on confirm-mode channels of sess until the
// connection is lost or the broker is closed, reopening its channel when the
// broker closes it.
func (b *Broker) publisher(sess *session) {
	defer sess.wg.Done()
	for {
		pc, err := openPubChannel(sess.conn)
		if err != nil {
			t := time.NewTimer(b.cfg.ReconnectMin)
			select {
			case <-t.C:
				continue
			case <-sess.lost:
				t.Stop()
				return
			}
		}
		reopen := b.servePublisher(sess, pc)
		pc.close()
		if !reopen {
			return
		}
	}
}

// pubChannel is a confirm-mode channel and its notifications. Only its
// publisher goroutine uses it.
type pubChannel struct {
	ch      *amqp.Channel
	returns chan amqp.Return
	closed  chan *amqp.Error
}

func openPubChannel(conn *amqp.Connection) (*pubChannel, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, err
	}
	return &pubChannel{
		ch: ch,
		// Unbuffered on purpose: the connection's reader hands a return to
		// us before it processes the confirm of the same message, so a
		// message is never seen confirmed before its return was seen.
		returns: ch.NotifyReturn(make(chan amqp.Return)),
		closed:  ch.NotifyClose(make(chan *amqp.Error, 1)),
	}, nil
}

// close closes the channel, draining returns meanwhile so that the
// connection's reader never waits on us.
func (pc *pubChannel) close() {
	if pc.ch.IsClosed() {
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = pc.ch.Close()
	}()
	returns := pc.returns
	for {
		select {
		case _, ok := <-returns:
			if !ok {
				returns = nil
			}
		case <-done:
			return
		}
	}
}

// servePublisher publishes batches on pc. It returns true to get a new
// channel, false when the session is over.
func (b *Broker) servePublisher(sess *session, pc *pubChannel) (reopen bool) {
	for {
		select {
		case req := <-sess.pubReq:
			if !b.publishBatch(pc, req) {
				return true
			}
		case r, ok := <-pc.returns:
			if !ok {
				return !b.sessionOver(sess)
			}
			b.logStrayReturn(r)
		case closeErr := <-pc.closed:
			b.log.Debug("rabbitmq publish channel closed", "err", closeErr)
			return !b.sessionOver(sess)
		case <-sess.lost:
			return false
		}
	}
}

func (b *Broker) sessionOver(sess *session) bool {
	select {
	case <-sess.lost:
		return true
	default:
		return sess.conn.IsClosed()
	}
}

// publishBatch publishes req on pc and replies. It returns false when pc is
// no longer usable (closed, or confirms outstanding after a timeout).
func (b *Broker) publishBatch(pc *pubChannel, req *pubRequest) (healthy bool) {
	bt := b.newPubBatch(pc, req)
	defer func() { req.result <- pubResult{failed: bt.failed} }()
	if bt.cancelledBeforeSending() {
		return true
	}
	confirms, sent := bt.send()
	settled := bt.awaitConfirms(confirms)
	return sent && settled
}

// pubBatch is a pubRequest on its way through a publisher channel: which
// messages the broker returned, and the verdict on each.
type pubBatch struct {
	b   *Broker
	pc  *pubChannel
	req *pubRequest
	// byID holds the positions in req.items of the message ids not returned
	// yet, for correlating returns; a batch may hold the same id twice.
	byID     map[string][]int
	returned map[int]error // by position in req.items: unroutable
	failed   map[int]error // by pubItem.idx: the reply
}

// newPubBatch starts the batch of req on pc, its messages indexed by id.
func (b *Broker) newPubBatch(pc *pubChannel, req *pubRequest) *pubBatch {
	bt := &pubBatch{b: b, pc: pc, req: req, byID: make(map[string][]int, len(req.items)),
		returned: make(map[int]error), failed: make(map[int]error)}
	for i, it := range req.items {
		bt.byID[it.msg.MessageId] = append(bt.byID[it.msg.MessageId], i)
	}
	return bt
}

// cancelledBeforeSending fails every message if the caller gave up before
// the batch reached the channel.
func (bt *pubBatch) cancelledBeforeSending() bool {
	select {
	case <-bt.req.cancel:
		for _, it := range bt.req.items {
			bt.failed[it.idx] = errors.New("rabbitmq: publish cancelled before sending")
		}
		return true
	default:
		return false
	}
}

// send publishes the messages in order and returns their deferred
// confirms (nil for those not sent). If the channel refuses one, it and the
// rest fail and sent is false: the channel is no longer usable.
func (bt *pubBatch) send() (confirms []*amqp.DeferredConfirmation, sent bool) {
	confirms = make([]*amqp.DeferredConfirmation, len(bt.req.items))
	for i, it := range bt.req.items {
		// A return may come back while we are still sending: take it now
		// so the connection's reader is never stalled by us.
		bt.takeWaitingReturns()
		dc, err := bt.pc.ch.PublishWithDeferredConfirm(it.exchange, it.key, true, false, it.msg)
		if err != nil {
			for _, rest := range bt.req.items[i:] {
				bt.failed[rest.idx] = fmt.Errorf("rabbitmq: publish message %s: %w", rest.msg.MessageId, err)
			}
			return confirms, false
		}
		confirms[i] = dc
	}
	return confirms, true
}

// awaitConfirms waits, until the request's deadline, for the confirm of
// each message sent and records its verdict. It returns false when the
// channel is no longer usable: it closed, or confirms are outstanding.
func (bt *pubBatch) awaitConfirms(confirms []*amqp.DeferredConfirmation) (healthy bool) {
	timer := time.NewTimer(time.Until(bt.req.deadline))
	defer timer.Stop()
	healthy = true
	var giveUp error
	for i, dc := range confirms {
		if dc == nil {
			continue
		}
		if giveUp == nil {
			giveUp = bt.awaitConfirm(dc, timer.C)
		}
		if !bt.settle(i, dc, giveUp) {
			healthy = false
		}
	}
	return healthy
}

// awaitConfirm waits for dc, taking returns meanwhile, and says why it gave
// up instead: the deadline passed or the caller cancelled.
func (bt *pubBatch) awaitConfirm(dc *amqp.DeferredConfirmation, deadline <-chan time.Time) (giveUp error) {
	for {
		select {
		case <-dc.Done():
			return nil
		case r, ok := <-bt.pc.returns:
			bt.takeReturn(r, ok)
		case <-deadline:
			return errors.New("rabbitmq: no confirm from the broker before the deadline (Config.ConfirmTimeout or ctx)")
		case <-bt.req.cancel:
			return errors.New("rabbitmq: publish cancelled before the broker confirmed")
		}
	}
}

// settle records the verdict on the message at position i, whose confirm
// is dc unless the wait gave up, and reports whether the channel is still
// usable.
func (bt *pubBatch) settle(i int, dc *amqp.DeferredConfirmation, giveUp error) (healthy bool) {
	it := bt.req.items[i]
	switch {
	case giveUp != nil:
		bt.failed[it.idx] = giveUp
		return false
	case bt.returned[i] != nil:
		bt.failed[it.idx] = bt.returned[i]
	case !dc.Acked():
		if bt.pc.ch.IsClosed() {
			bt.failed[it.idx] = fmt.Errorf("rabbitmq: message %s: channel closed before the broker confirmed", it.msg.MessageId)
			return false
		}
		bt.failed[it.idx] = fmt.Errorf("%w: message %s", ErrNacked, it.msg.MessageId)
	}
	return true
}

// takeWaitingReturns takes the returns the broker has sent so far, without
// waiting for more.
func (bt *pubBatch) takeWaitingReturns() {
	for {
		select {
		case r, ok := <-bt.pc.returns:
			bt.takeReturn(r, ok)
		default:
			return
		}
	}
}

// takeReturn records a return received from the channel (ok false: the
// channel closed its returns).
func (bt *pubBatch) takeReturn(r amqp.Return, ok bool) {
	if !ok {
		bt.pc.returns = nil
		return
	}
	pos := bt.byID[r.MessageId]
	if len(pos) == 0 {
		bt.b.logStrayReturn(r)
		return
	}
	bt.byID[r.MessageId] = pos[1:]
	bt.returned[pos[0]] = fmt.Errorf("%w: message %s to exchange %s with routing key %q: %s (no queue is bound for it)",
		ErrUnroutable, r.MessageId, r.Exchange, r.RoutingKey, r.ReplyText)
}

// logStrayReturn logs a return of a message whose batch was answered.
func (b *Broker) logStrayReturn(r amqp.Return) {
	b.log.Warn("rabbitmq return for a message no longer awaited", "message_id", r.MessageId, "reply_code", r.ReplyCode, "reply_text", r.ReplyText)
}
