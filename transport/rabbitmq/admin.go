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

// Headers an operator's replay adds to a dead-lettered message it sends
// back to its queue: who replayed it, when, why, and how many times it was
// replayed in all.
const (
	HeaderReplayedBy     = "x-sagabox-replayed-by"
	HeaderReplayedAt     = "x-sagabox-replayed-at"
	HeaderReplayedReason = "x-sagabox-replayed-reason"
	HeaderReplays        = "x-sagabox-replays"
)

// Admin operates on a namespace's topology for tools (the sagabox CLI):
// queue depths, dead-letter queues and their replay, and teardown. AMQP
// cannot list queues, so every method takes the logical queue names (the
// names services subscribe with, e.g. "inventory"). It uses one plain
// connection, without the Broker's reconnects.
type Admin struct {
	cfg  Config
	conn *amqp.Connection
}

// DialAdmin connects to the broker of cfg (URL and Namespace; defaults as
// for New).
func DialAdmin(ctx context.Context, cfg Config) (*Admin, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	eps, err := cfg.endpoints()
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: invalid config: %w", err)
	}
	dc, verified := eps[0].dialConfig(amqp.Config{
		Properties: amqp.Table{"connection_name": "sagabox-admin"},
		Dial:       amqp.DefaultDial(10 * time.Second),
	})
	conn, err := amqp.DialConfig(cfg.URL, dc)
	if err != nil {
		return nil, dialError(&eps[0], err, verified.Load())
	}
	if err := ctx.Err(); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return &Admin{cfg: cfg, conn: conn}, nil
}

// Close closes the connection.
func (a *Admin) Close() error { return a.conn.Close() }

func (a *Admin) queueName(name string) string { return a.cfg.Namespace + "." + name }

func (a *Admin) deadLetterQueueName(name string) string { return a.queueName(name) + deadLetterSuffix }

// inspect returns the message count of queue, and false when it does not
// exist. A passive declare of a missing queue closes its channel, so each
// inspection has its own.
func (a *Admin) inspect(queue string) (int, bool, error) {
	ch, err := a.conn.Channel()
	if err != nil {
		return 0, false, fmt.Errorf("rabbitmq: open channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	var aerr *amqp.Error
	if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("rabbitmq: inspect queue %s: %w", queue, err)
	}
	return q.Messages, true, nil
}

// DeadLetterQueue is the dead-letter queue of a logical queue.
type DeadLetterQueue struct {
	// Name is the logical queue, Queue its dead-letter queue and Source the
	// queue its messages go back to on replay.
	Name, Queue, Source string
	// Messages is the dead-letter queue's depth; Exists is false when the
	// queue was never declared.
	Messages int
	Exists   bool
}

// DeadLetterQueues returns the dead-letter queue of each logical queue.
func (a *Admin) DeadLetterQueues(names []string) ([]DeadLetterQueue, error) {
	out := make([]DeadLetterQueue, len(names))
	for i, n := range names {
		out[i] = DeadLetterQueue{Name: n, Queue: a.deadLetterQueueName(n), Source: a.queueName(n)}
		var err error
		if out[i].Messages, out[i].Exists, err = a.inspect(out[i].Queue); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// DeadLetter is a message in a dead-letter queue.
type DeadLetter struct {
	MessageID, Type, Kind, SagaID, Step string
	// Reason is why it was dead-lettered (HeaderDeadLetterReason) and At
	// when (HeaderDeadLetterAt); Replays how often an operator replayed it.
	Reason  string
	At      time.Time
	Replays int
	Body    []byte
}

func deadLetterOf(d *amqp.Delivery) DeadLetter {
	str := func(k string) string { s, _ := d.Headers[k].(string); return s }
	dl := DeadLetter{MessageID: d.MessageId, Type: d.Type, Kind: str(HeaderKind), SagaID: str(HeaderSagaID), Step: str(HeaderStep),
		Reason: str(HeaderDeadLetterReason), Replays: replays(d.Headers), Body: d.Body}
	if t, err := time.Parse(time.RFC3339Nano, str(HeaderDeadLetterAt)); err == nil {
		dl.At = t
	}
	return dl
}

func replays(h amqp.Table) int {
	switch n := h[HeaderReplays].(type) {
	case int32:
		return int(n)
	case int64:
		return int(n)
	case int:
		return n
	}
	return 0
}

// Browse returns up to limit messages of the dead-letter queue of logical
// queue name, oldest first, and leaves them in the queue: it takes them
// unacknowledged and closes its channel, which returns them. The broker
// returns them asynchronously (a quorum queue through its log), so Browse
// waits, until ctx is done or for at most browseReturnWait, for the queue to
// count them again: a list or a replay right after it sees them.
func (a *Admin) Browse(ctx context.Context, name string, limit int) ([]DeadLetter, error) {
	queue := a.deadLetterQueueName(name)
	depth, ok, err := a.inspect(queue)
	if err == nil && !ok {
		err = fmt.Errorf("rabbitmq: queue %s does not exist: %w", queue, message.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	out, err := a.take(queue, limit)
	if err != nil || len(out) == 0 {
		return out, err
	}
	return out, a.awaitDepth(ctx, queue, depth)
}

// browseReturnWait bounds how long Browse waits for the messages it read to
// be counted in their queue again. Another consumer of the dead-letter queue
// can keep the depth below what Browse saw; Browse then returns after this.
const browseReturnWait = 5 * time.Second

// take reads up to limit messages of queue unacknowledged on a channel of
// its own, and closes the channel, which hands them back to the queue.
func (a *Admin) take(queue string, limit int) ([]DeadLetter, error) {
	ch, err := a.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: open channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	var out []DeadLetter
	for len(out) < limit {
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			return nil, fmt.Errorf("rabbitmq: read %s: %w", queue, err)
		}
		if !ok {
			break
		}
		out = append(out, deadLetterOf(&d))
	}
	return out, nil
}

// awaitDepth polls queue until it holds at least depth ready messages, ctx
// is done, or browseReturnWait has passed. Only an error reading the queue
// is returned: a depth that stays lower is someone else's doing.
func (a *Admin) awaitDepth(ctx context.Context, queue string, depth int) error {
	ctx, cancel := context.WithTimeout(ctx, browseReturnWait)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		n, _, err := a.inspect(queue)
		if err != nil {
			return err
		}
		if n >= depth {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// Replay moves up to limit messages of the dead-letter queue of logical
// queue name back to that queue, oldest first, each marked with who
// replayed it, when and why (the HeaderReplayed… headers; HeaderReplays
// counts replays). A message leaves the dead-letter queue only once the
// broker confirmed its copy in the queue: a failure leaves it where it was.
// It returns the messages replayed.
func (a *Admin) Replay(ctx context.Context, name string, limit int, actor, reason string) ([]DeadLetter, error) {
	queue, source := a.deadLetterQueueName(name), a.queueName(name)
	for _, q := range []string{queue, source} {
		if _, ok, err := a.inspect(q); err != nil || !ok {
			if err == nil {
				err = fmt.Errorf("rabbitmq: queue %s does not exist: %w", q, message.ErrNotFound)
			}
			return nil, err
		}
	}
	ch, err := a.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: open channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	if err := ch.Confirm(false); err != nil {
		return nil, fmt.Errorf("rabbitmq: confirm mode: %w", err)
	}
	var out []DeadLetter
	for len(out) < limit {
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			return out, fmt.Errorf("rabbitmq: read %s: %w", queue, err)
		}
		if !ok {
			break
		}
		headers := amqp.Table{}
		for k, v := range d.Headers {
			switch k {
			case HeaderDeadLetterReason, HeaderDeadLetterQueue, HeaderDeadLetterAt:
			default:
				headers[k] = v
			}
		}
		headers[HeaderReplayedBy] = actor
		headers[HeaderReplayedAt] = time.Now().UTC().Format(time.RFC3339Nano)
		headers[HeaderReplayedReason] = reason
		headers[HeaderReplays] = int64(replays(d.Headers) + 1)
		conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", source, true, false, copyOf(d, headers))
		if err == nil {
			var acked bool
			if acked, err = conf.WaitContext(ctx); err == nil && !acked {
				err = errors.New("the broker did not confirm it")
			}
		}
		if err != nil {
			_ = d.Nack(false, true)
			return out, fmt.Errorf("rabbitmq: replay message %s to %s: %w", d.MessageId, source, err)
		}
		if err := d.Ack(false); err != nil {
			return out, fmt.Errorf("rabbitmq: remove replayed message %s from %s: %w", d.MessageId, queue, err)
		}
		dl := deadLetterOf(&d)
		dl.Replays++
		out = append(out, dl)
	}
	return out, nil
}

// Topology is what Teardown found (and deleted unless it was a dry run).
type Topology struct {
	Queues    []string
	Exchanges []string
}

// Teardown deletes the namespace's exchanges and, for each logical queue
// name, the queue, its dead-letter queue and its retry queues, whatever
// messages they hold; with dryRun it only returns those that exist.
func (a *Admin) Teardown(names []string, dryRun bool) (Topology, error) {
	var top Topology
	for _, n := range names {
		queues := []string{a.queueName(n), a.deadLetterQueueName(n)}
		for _, d := range retryDelays {
			queues = append(queues, a.queueName(n)+retryInfix+delayLabel(d))
		}
		for _, q := range queues {
			_, ok, err := a.inspect(q)
			if err != nil {
				return top, err
			}
			if ok {
				top.Queues = append(top.Queues, q)
			}
		}
	}
	for _, x := range []string{transport.ExchangeCommands, transport.ExchangeReplies, transport.ExchangeEvents, ExchangeDeadLetter} {
		name := a.cfg.Namespace + "." + x
		ok, err := a.exchangeExists(name)
		if err != nil {
			return top, err
		}
		if ok {
			top.Exchanges = append(top.Exchanges, name)
		}
	}
	if dryRun {
		return top, nil
	}
	ch, err := a.conn.Channel()
	if err != nil {
		return top, fmt.Errorf("rabbitmq: open channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	for _, q := range top.Queues {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			return top, fmt.Errorf("rabbitmq: delete queue %s: %w", q, err)
		}
	}
	for _, x := range top.Exchanges {
		if err := ch.ExchangeDelete(x, false, false); err != nil {
			return top, fmt.Errorf("rabbitmq: delete exchange %s: %w", x, err)
		}
	}
	return top, nil
}

func (a *Admin) exchangeExists(name string) (bool, error) {
	ch, err := a.conn.Channel()
	if err != nil {
		return false, fmt.Errorf("rabbitmq: open channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	err = ch.ExchangeDeclarePassive(name, "direct", true, false, false, false, nil)
	var aerr *amqp.Error
	if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
		return false, nil
	}
	if err != nil {
		// A passive declare checks only existence; a kind mismatch is not
		// reported for passive declares.
		return false, fmt.Errorf("rabbitmq: inspect exchange %s: %w", name, err)
	}
	return true, nil
}
