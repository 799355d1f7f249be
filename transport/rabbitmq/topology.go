package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sagabox/sagabox/transport"
)

// ExchangeDeadLetter is the logical name of the exchange dead letters are
// published to, with the service queue's name as routing key.
const ExchangeDeadLetter = "dead-letter"

const deadLetterSuffix = ".dead-letter"

// retryDelays are the delays of the retry queues of every service queue,
// shortest first. A delayed Retry waits in the queue of the shortest delay
// not below the one asked for (the longest for longer delays).
var retryDelays = []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute}

const retryInfix = ".retry."

// RetryDelays returns the delays of the retry queues declared for every
// service queue: 1s, 5s, 30s and 2m. A delayed transport.Retry waits in the
// retry queue of the shortest of them that is not below the delay asked for,
// or of the longest.
func RetryDelays() []time.Duration { return slices.Clone(retryDelays) }

// retryDelay returns the retry queue delay used for a Retry of d > 0.
func retryDelay(d time.Duration) time.Duration {
	for _, r := range retryDelays {
		if d <= r {
			return r
		}
	}
	return retryDelays[len(retryDelays)-1]
}

// delayLabel names a retry delay in queue names: "1s", "30s", "2m".
func delayLabel(d time.Duration) string {
	if d >= time.Minute && d%time.Minute == 0 {
		return fmt.Sprintf("%dm", d/time.Minute)
	}
	return fmt.Sprintf("%ds", d/time.Second)
}

// RetryQueueName returns the name of the retry queue of a logical queue
// that holds messages retried with the given delay (rounded up to one of
// RetryDelays): "<namespace>.<name>.retry.<delay>", e.g.
// "sagabox.inventory.retry.5s". Messages expire from it after its delay
// and go back to "<namespace>.<name>".
func (b *Broker) RetryQueueName(name string, delay time.Duration) string {
	return b.cfg.Namespace + "." + name + retryInfix + delayLabel(retryDelay(delay))
}

// ExchangeName returns the exchange name of a logical exchange
// (transport.ExchangeCommands, ExchangeReplies, ExchangeEvents or
// ExchangeDeadLetter): "<namespace>.<logical>".
func (b *Broker) ExchangeName(logical string) string { return b.cfg.Namespace + "." + logical }

// QueueName returns the queue name of a logical queue: "<namespace>.<name>".
func (b *Broker) QueueName(name string) string { return b.cfg.Namespace + "." + name }

// DeadLetterQueueName returns the name of the dead-letter queue of a logical
// queue: "<namespace>.<name>.dead-letter".
func (b *Broker) DeadLetterQueueName(name string) string {
	return b.cfg.Namespace + "." + name + deadLetterSuffix
}

// DeclaredQueues returns the logical names of the queues declared through
// this broker (by Declare or Subscribe), in declaration order.
func (b *Broker) DeclaredQueues() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.queues)
}

// Declare creates the queue described by spec with its bindings and its
// dead-letter queue. It is idempotent, runs on the consuming connection (which
// a broker alarm never blocks), waits for it while it is being
// re-established, and is repeated by the broker after every reconnect of
// either connection.
func (b *Broker) Declare(ctx context.Context, spec transport.QueueSpec) error {
	if err := validateSpec(spec); err != nil {
		return fmt.Errorf("%w: %w", transport.ErrPermanent, err)
	}
	sess, err := b.awaitSession(ctx, &b.con)
	if err != nil {
		return fmt.Errorf("rabbitmq: declare queue %s: %w", spec.Name, err)
	}
	ch, err := sess.conn.Channel()
	if err != nil {
		return fmt.Errorf("rabbitmq: declare queue %s: open channel: %w", spec.Name, err)
	}
	defer func() { _ = ch.Close() }()
	if err := b.declareSpec(ch, spec); err != nil {
		return err
	}
	b.remember(spec)
	return nil
}

func (b *Broker) remember(spec transport.QueueSpec) {
	b.mu.Lock()
	defer b.mu.Unlock()
	old, ok := b.specs[spec.Name]
	if !ok {
		b.queues = append(b.queues, spec.Name)
		b.specs[spec.Name] = transport.QueueSpec{
			Name:     spec.Name,
			Commands: slices.Clone(spec.Commands),
			Replies:  spec.Replies,
			Events:   slices.Clone(spec.Events),
		}
		return
	}
	// Bindings are additive on the broker; keep the union.
	for _, c := range spec.Commands {
		if !slices.Contains(old.Commands, c) {
			old.Commands = append(old.Commands, c)
		}
	}
	for _, e := range spec.Events {
		if !slices.Contains(old.Events, e) {
			old.Events = append(old.Events, e)
		}
	}
	old.Replies = old.Replies || spec.Replies
	b.specs[spec.Name] = old
}

func validateSpec(spec transport.QueueSpec) error {
	var errs []error
	if !namespaceRE.MatchString(spec.Name) {
		errs = append(errs, fmt.Errorf("name %q: use letters, digits, '_', '-' and inner '.'", spec.Name))
	}
	if strings.HasSuffix(spec.Name, deadLetterSuffix) {
		errs = append(errs, fmt.Errorf("name %q must not end in %s", spec.Name, deadLetterSuffix))
	}
	for _, d := range retryDelays {
		if suffix := retryInfix + delayLabel(d); strings.HasSuffix(spec.Name, suffix) {
			errs = append(errs, fmt.Errorf("name %q must not end in %s", spec.Name, suffix))
		}
	}
	for _, c := range spec.Commands {
		if strings.TrimSpace(c) == "" {
			errs = append(errs, errors.New("commands: empty type"))
		}
	}
	for _, e := range spec.Events {
		if strings.TrimSpace(e) == "" {
			errs = append(errs, errors.New("events: empty pattern"))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("rabbitmq: invalid queue spec: %w", errors.Join(errs...))
	}
	return nil
}

// declareAll declares the exchanges and every remembered queue on conn.
func (b *Broker) declareAll(ctx context.Context, conn *amqp.Connection) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("rabbitmq: declare topology: open channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	for _, x := range []struct{ name, kind string }{
		{transport.ExchangeCommands, amqp.ExchangeDirect},
		{transport.ExchangeReplies, amqp.ExchangeDirect},
		{transport.ExchangeEvents, amqp.ExchangeTopic},
		{ExchangeDeadLetter, amqp.ExchangeDirect},
	} {
		if err := ch.ExchangeDeclare(b.ExchangeName(x.name), x.kind, true, false, false, false, nil); err != nil {
			return fmt.Errorf("rabbitmq: declare exchange %s: %w", b.ExchangeName(x.name), err)
		}
	}
	b.mu.Lock()
	specs := make([]transport.QueueSpec, 0, len(b.queues))
	for _, name := range b.queues {
		specs = append(specs, b.specs[name])
	}
	b.mu.Unlock()
	for _, spec := range specs {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := b.declareSpec(ch, spec); err != nil {
			return err
		}
	}
	return nil
}

// declareSpec declares the queue of spec, its dead-letter queue, its retry
// queues and its bindings on ch.
func (b *Broker) declareSpec(ch *amqp.Channel, spec transport.QueueSpec) error {
	q, dlq := b.QueueName(spec.Name), b.DeadLetterQueueName(spec.Name)
	fail := func(what string, err error) error {
		var aerr *amqp.Error
		if errors.As(err, &aerr) && aerr.Code == amqp.PreconditionFailed {
			return fmt.Errorf("rabbitmq: declare queue %s: %s: %w (it exists with other arguments, e.g. another queue type: delete it or use another Namespace): %w", spec.Name, what, err, transport.ErrPermanent)
		}
		if isPermanent(err) {
			return fmt.Errorf("rabbitmq: declare queue %s: %s: %w: %w", spec.Name, what, err, transport.ErrPermanent)
		}
		return fmt.Errorf("rabbitmq: declare queue %s: %s: %w", spec.Name, what, err)
	}
	dlqArgs := amqp.Table{amqp.QueueTypeArg: string(b.cfg.QueueType)}
	if _, err := ch.QueueDeclare(dlq, true, false, false, false, dlqArgs); err != nil {
		return fail("declare "+dlq, err)
	}
	if err := ch.QueueBind(dlq, q, b.ExchangeName(ExchangeDeadLetter), false, nil); err != nil {
		return fail("bind "+dlq, err)
	}
	args := amqp.Table{
		amqp.QueueTypeArg:           string(b.cfg.QueueType),
		"x-dead-letter-exchange":    b.ExchangeName(ExchangeDeadLetter),
		"x-dead-letter-routing-key": q,
	}
	if b.cfg.QueueType == QueueTypeQuorum && b.cfg.DeliveryLimit > 0 {
		args["x-delivery-limit"] = int64(b.cfg.DeliveryLimit)
	}
	if _, err := ch.QueueDeclare(q, true, false, false, false, args); err != nil {
		return fail("declare "+q, err)
	}
	for _, d := range retryDelays {
		rq := b.RetryQueueName(spec.Name, d)
		if _, err := ch.QueueDeclare(rq, true, false, false, false, b.retryQueueArgs(q, d)); err != nil {
			return fail("declare "+rq, err)
		}
	}
	for _, c := range spec.Commands {
		if err := ch.QueueBind(q, c, b.ExchangeName(transport.ExchangeCommands), false, nil); err != nil {
			return fail("bind command "+c, err)
		}
	}
	if spec.Replies {
		if err := ch.QueueBind(q, spec.Name, b.ExchangeName(transport.ExchangeReplies), false, nil); err != nil {
			return fail("bind replies", err)
		}
	}
	for _, e := range spec.Events {
		if err := ch.QueueBind(q, e, b.ExchangeName(transport.ExchangeEvents), false, nil); err != nil {
			return fail("bind events "+e, err)
		}
	}
	return nil
}

// retryQueueArgs returns the arguments of the retry queue of the service
// queue q with delay d. Nothing consumes it: its messages expire after d
// (a per-queue TTL, so the head is always the first to expire) and are
// dead-lettered through the default exchange straight to q. Quorum retry
// queues dead-letter at least once (RabbitMQ 3.10+): a message leaves the
// retry queue only once q has confirmed it, which needs x-overflow
// reject-publish.
func (b *Broker) retryQueueArgs(q string, d time.Duration) amqp.Table {
	args := amqp.Table{
		amqp.QueueTypeArg:           string(b.cfg.QueueType),
		amqp.QueueMessageTTLArg:     d.Milliseconds(),
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": q,
	}
	if b.cfg.QueueType == QueueTypeQuorum {
		args["x-dead-letter-strategy"] = "at-least-once"
		args[amqp.QueueOverflowArg] = amqp.QueueOverflowRejectPublish
	}
	return args
}
