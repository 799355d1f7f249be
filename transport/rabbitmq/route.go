package rabbitmq

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sagabox/sagabox/transport"
)

// HeaderProbe marks a route probe (Broker.Routable, Admin.Routable): a
// message with no envelope that a subscriber of this adapter acknowledges
// and drops before decoding, so that no handler ever sees it and it is
// never dead-lettered.
const HeaderProbe = "x-sagabox-probe"

var (
	_ transport.RouteChecker = (*Broker)(nil)
	_ transport.RouteChecker = (*Admin)(nil)
)

// Routable implements transport.RouteChecker: for each command type (its
// routing key on the commands exchange), whether a queue is bound for it.
// AMQP has no query for bindings, so it publishes a probe per command,
// mandatory, on a confirm-mode channel of its own on the publishing
// connection: the broker returns the probe of a command no queue is bound
// for; the others land in a service queue, where a subscriber of this
// adapter drops them unseen (HeaderProbe). A subscriber built with a
// version of sagabox older than the probe dead-letters it as malformed.
// It waits for the publishing connection, and fails with ErrBlocked while
// a broker alarm blocks it.
func (b *Broker) Routable(ctx context.Context, commands []string) (map[string]bool, error) {
	if b.closed() {
		return nil, ErrClosed
	}
	sess, err := b.awaitSession(ctx, &b.pub)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: check routes: %w", err)
	}
	if reason, blocked := sess.blockState(); blocked != nil {
		return nil, fmt.Errorf("rabbitmq: check routes: %w: %s", ErrBlocked, reason)
	}
	return probeRoutes(ctx, sess.conn, b.ExchangeName(transport.ExchangeCommands), commands, b.cfg.ConfirmTimeout)
}

// Routable implements transport.RouteChecker as Broker.Routable does, for
// tools. When the namespace's commands exchange does not exist (no service
// of the namespace ever started), no command is routable.
func (a *Admin) Routable(ctx context.Context, commands []string) (map[string]bool, error) {
	exchange := a.cfg.Namespace + "." + transport.ExchangeCommands
	ok, err := a.exchangeExists(exchange)
	if err != nil {
		return nil, err
	}
	if !ok {
		out := make(map[string]bool, len(commands))
		for _, c := range commands {
			out[c] = false
		}
		return out, nil
	}
	return probeRoutes(ctx, a.conn, exchange, commands, a.cfg.ConfirmTimeout)
}

// probeRoutes publishes a probe per distinct command to exchange on a
// channel of its own on conn and reports which were routed to a queue.
func probeRoutes(ctx context.Context, conn *amqp.Connection, exchange string, commands []string, timeout time.Duration) (map[string]bool, error) {
	keys := slices.Clone(commands)
	slices.Sort(keys)
	keys = slices.Compact(keys)
	out := make(map[string]bool, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: check routes: open channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	if err := ch.Confirm(false); err != nil {
		return nil, fmt.Errorf("rabbitmq: check routes: confirm mode: %w", err)
	}
	// Buffered for every probe: the connection's reader hands each return
	// over before it reads the confirm that follows it, and never waits.
	returns := ch.NotifyReturn(make(chan amqp.Return, len(keys)))
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	byID := make(map[string]string, len(keys))
	dcs := make([]*amqp.DeferredConfirmation, 0, len(keys))
	for _, key := range keys {
		id := uuid.NewString()
		byID[id] = key
		dc, err := ch.PublishWithDeferredConfirm(exchange, key, true, false, amqp.Publishing{
			MessageId: id,
			Timestamp: time.Now(),
			Headers:   amqp.Table{HeaderProbe: "route"},
		})
		if err != nil {
			return nil, fmt.Errorf("rabbitmq: check the route of %q: %w", key, err)
		}
		dcs = append(dcs, dc)
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for i, dc := range dcs {
		select {
		case <-dc.Done():
		case cerr := <-closed:
			return nil, fmt.Errorf("rabbitmq: check routes: the broker closed the channel: %w", causeErr(cerr))
		case <-timer.C:
			return nil, fmt.Errorf("rabbitmq: check routes: no confirm from the broker within %s", timeout)
		case <-ctx.Done():
			return nil, fmt.Errorf("rabbitmq: check routes: %w", ctx.Err())
		}
		if !dc.Acked() {
			return nil, fmt.Errorf("rabbitmq: check the route of %q: %w", keys[i], ErrNacked)
		}
		out[keys[i]] = true
	}
	for {
		select {
		case r := <-returns:
			if key, ok := byID[r.MessageId]; ok {
				out[key] = false
			}
		default:
			return out, nil
		}
	}
}

// dropProbe acknowledges d and reports true if it is a route probe
// (HeaderProbe): it has no envelope and is no handler's business. With
// acks (a batching consumer's) the acknowledgement goes through acks.
func (b *Broker) dropProbe(queue string, d amqp.Delivery, acks *ackWindow) bool {
	if _, ok := d.Headers[HeaderProbe]; !ok {
		return false
	}
	if acks != nil {
		acks.ack(d.DeliveryTag)
		return true
	}
	b.settle(d.Ack(false), queue, d, "ack")
	return true
}
