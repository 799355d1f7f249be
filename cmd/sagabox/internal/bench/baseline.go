package bench

// The hand-written baseline: the simplest correct three-step saga pipeline
// over pgx and amqp091-go directly, without any of sagabox's packages, which
// the engine is measured against. It is why this package may import
// amqp091-go (see .golangci.yml); the rest of the package uses it only to read
// the server's version and delete the engine's queues at the end.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sagabox/sagabox/transport/rabbitmq"
)

const (
	// GroupMaxBatch is the most deliveries a group-commit consumer applies in
	// one transaction.
	GroupMaxBatch = 64
	// GroupLinger is how long a group-commit consumer waits, after taking a
	// delivery, for more to join its transaction.
	GroupLinger = 2 * time.Millisecond
	// GroupConsumers is the number of group-commit consumers per queue, each
	// on its own AMQP channel.
	GroupConsumers = 2

	baselineRelayBatch   = 200                    // rows per relay claim, the engine's default
	baselineRelayWorkers = 2                      // batches in flight per outbox, the engine's default
	baselineRelayPoll    = 250 * time.Millisecond // poll floor under the in-process wake-ups
	baselineConfirmWait  = 5 * time.Second        // bound on the wait for one batch's confirms
)

// The three services and the route of each step: alpha handles steps 1 and
// 3, beta step 2, orch the replies.
const (
	svcOrch  = "orch"
	svcAlpha = "alpha"
	svcBeta  = "beta"
)

var (
	baselineServices = []string{svcOrch, svcAlpha, svcBeta}
	stepService      = [...]string{1: svcAlpha, 2: svcBeta, 3: svcAlpha}
)

const lastStep = 3

// blMessage is the body of every baseline message: a command for step Step
// of the saga, or its reply.
type blMessage struct {
	SagaID uuid.UUID `json:"saga_id"`
	Step   int       `json:"step"`
}

// baseline is a running hand-written pipeline.
type baseline struct {
	group      bool
	pool       *pgxpool.Pool
	pub, sub   *amqp.Connection
	exchange   string
	schemas    map[string]string // service → quoted schema
	wake       map[string]chan struct{}
	errs       chan error
	ctx        context.Context
	stop       context.CancelFunc
	wg         sync.WaitGroup
	consumerCh []*amqp.Channel
}

// openBaseline creates the baseline's schemas and topology, under a prefix
// unique to this run, and starts its consumers and relays. group selects
// the group-commit consumers.
func openBaseline(ctx context.Context, cfg SagaConfig, group bool) (_ *pipeline, err error) {
	kind := "baseline"
	if group {
		kind = "group"
	}
	prefix := "sagabox-bench-" + kind + "-" + uuid.NewString()[:8]
	b := &baseline{group: group, exchange: prefix, schemas: map[string]string{}, wake: map[string]chan struct{}{}, errs: make(chan error, 16)}
	b.ctx, b.stop = context.WithCancel(context.WithoutCancel(ctx))
	var undo []func()
	closeAll := func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	defer func() {
		if err != nil {
			closeAll()
		}
	}()

	if b.pool, err = newPool(ctx, cfg.DatabaseURL, cfg.PoolSize); err != nil {
		return nil, err
	}
	undo = append(undo, b.pool.Close)
	for _, svc := range baselineServices {
		schema := "bench_" + kind + "_" + svc + "_" + prefix[len(prefix)-8:]
		b.schemas[svc] = pgx.Identifier{schema}.Sanitize()
		b.wake[svc] = make(chan struct{}, 1)
		undo = append(undo, func() { dropSchema(b.pool, schema) })
		if err := b.createSchema(ctx, svc); err != nil {
			return nil, err
		}
	}

	if b.pub, err = dialAMQP(cfg.AMQPURL, prefix+".publish"); err != nil {
		return nil, err
	}
	undo = append(undo, func() { _ = b.pub.Close() })
	if b.sub, err = dialAMQP(cfg.AMQPURL, prefix+".consume"); err != nil {
		return nil, err
	}
	undo = append(undo, func() { _ = b.sub.Close() })
	undo = append(undo, func() { b.deleteTopology() })
	if err := b.declare(string(cfg.QueueType)); err != nil {
		return nil, err
	}

	// From here on goroutines run: stopping them comes before everything
	// above is undone.
	undo = append(undo, func() {
		b.stop()
		for _, ch := range b.consumerCh {
			_ = ch.Close() // ends the consumers' delivery loops
		}
		b.wg.Wait()
	})
	for _, svc := range baselineServices {
		for range baselineRelayWorkers {
			if err := b.startRelay(svc); err != nil {
				return nil, err
			}
		}
		if group {
			for range GroupConsumers {
				if err := b.startConsumer(svc, 1, 2*GroupMaxBatch); err != nil {
					return nil, err
				}
			}
		} else if err := b.startConsumer(svc, cfg.Workers, 2*cfg.Workers); err != nil {
			return nil, err
		}
	}
	orch := b.schemas[svcOrch]
	return &pipeline{
		name:     kind,
		pool:     b.pool,
		start:    b.start,
		countSQL: "SELECT count(*) FROM " + orch + ".saga WHERE status = 'completed'",
		doneSQL:  "SELECT id, finished_at FROM " + orch + ".saga WHERE status = 'completed'",
		errs:     b.errs,
		close:    closeAll,
	}, nil
}

func dialAMQP(url, name string) (*amqp.Connection, error) {
	conn, err := amqp.DialConfig(url, amqp.Config{
		Dial:       amqp.DefaultDial(10 * time.Second),
		Properties: amqp.Table{"connection_name": name},
	})
	if err != nil {
		return nil, fmt.Errorf("connect to rabbitmq at %s: %w", rabbitmq.RedactURL(url), rabbitmq.RedactError(url, err))
	}
	return conn, nil
}

// createSchema creates svc's schema: an inbox and an outbox, and for the
// orchestrator the saga table.
func (b *baseline) createSchema(ctx context.Context, svc string) error {
	s := b.schemas[svc]
	ddl := fmt.Sprintf(`CREATE SCHEMA %[1]s;
CREATE TABLE %[1]s.inbox (message_id uuid PRIMARY KEY);
CREATE TABLE %[1]s.outbox (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id    uuid NOT NULL,
    routing_key   text NOT NULL,
    payload       bytea NOT NULL,
    claimed_until timestamptz
);`, s)
	if svc == svcOrch {
		ddl += fmt.Sprintf(`
CREATE TABLE %[1]s.saga (
    id          uuid PRIMARY KEY,
    step        int NOT NULL,
    status      text NOT NULL,
    created_at  timestamptz NOT NULL,
    finished_at timestamptz
);`, s)
	}
	if _, err := b.pool.Exec(ctx, ddl); err != nil {
		return fmt.Errorf("create baseline schema %s: %w", s, err)
	}
	return nil
}

func (b *baseline) queue(svc string) string { return b.exchange + "." + svc }

// declare declares the run's direct exchange and one queue per service,
// bound with the service's name.
func (b *baseline) declare(queueType string) error {
	ch, err := b.pub.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	if err := ch.ExchangeDeclare(b.exchange, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", b.exchange, err)
	}
	for _, svc := range baselineServices {
		q := b.queue(svc)
		if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": queueType}); err != nil {
			return fmt.Errorf("declare queue %s: %w", q, err)
		}
		if err := ch.QueueBind(q, svc, b.exchange, false, nil); err != nil {
			return fmt.Errorf("bind queue %s: %w", q, err)
		}
	}
	return nil
}

// deleteTopology deletes the queues and the exchange (best effort: the run
// is over).
func (b *baseline) deleteTopology() {
	ch, err := b.pub.Channel()
	if err != nil {
		return
	}
	defer func() { _ = ch.Close() }()
	for _, svc := range baselineServices {
		_, _ = ch.QueueDelete(b.queue(svc), false, false, false)
	}
	_ = ch.ExchangeDelete(b.exchange, false, false)
}

// fail reports an error of a background loop, unless the pipeline is
// stopping (then errors are the shutdown's).
func (b *baseline) fail(err error) {
	if b.ctx.Err() != nil {
		return
	}
	select {
	case b.errs <- err:
	default:
	}
}

func (b *baseline) wakeRelay(svc string) {
	select {
	case b.wake[svc] <- struct{}{}:
	default:
	}
}

// exec runs batch, which begins and commits a transaction, in one round
// trip, and rolls back (keeping the connection) when a statement fails.
func (b *baseline) exec(ctx context.Context, batch *pgx.Batch) error {
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if err := conn.SendBatch(ctx, batch).Close(); err != nil {
		if conn.Conn().PgConn().TxStatus() != 'I' {
			_, _ = conn.Exec(ctx, "ROLLBACK")
		}
		return err
	}
	return nil
}

// start starts one saga in one round trip: the saga row and its first
// command in the outbox, in one transaction.
func (b *baseline) start(ctx context.Context) (uuid.UUID, error) {
	id, msgID := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	body, err := json.Marshal(blMessage{SagaID: id, Step: 1})
	if err != nil {
		return uuid.Nil, err
	}
	o := b.schemas[svcOrch]
	batch := &pgx.Batch{}
	batch.Queue("BEGIN")
	batch.Queue("INSERT INTO "+o+".saga (id, step, status, created_at) VALUES ($1::uuid, 1, 'running', $2::timestamptz)", id, time.Now())
	batch.Queue("INSERT INTO "+o+".outbox (message_id, routing_key, payload) VALUES ($1::uuid, $2::text, $3::bytea)", msgID, stepService[1], body)
	batch.Queue("COMMIT")
	if err := b.exec(ctx, batch); err != nil {
		return uuid.Nil, fmt.Errorf("start baseline saga %s: %w", id, err)
	}
	b.wakeRelay(svcOrch)
	return id, nil
}

// apply returns the one statement that applies delivery d on service svc:
// the message id goes into svc's inbox, and only if it was not there does
// the rest happen (ON CONFLICT DO NOTHING … RETURNING gates it), so a
// redelivered message changes nothing. A participant writes its reply to
// its outbox; the orchestrator moves the saga to the next step (only from
// the step the reply is for) and writes the next command, or completes the
// saga after the last step. It also returns the outbox to wake, if any.
func (b *baseline) apply(svc string, d *amqp.Delivery) (sql string, args []any, wake string, err error) {
	msgID, err := uuid.Parse(d.MessageId)
	if err != nil {
		return "", nil, "", fmt.Errorf("delivery on %s: message id %q: %w", svc, d.MessageId, err)
	}
	var m blMessage
	if err := json.Unmarshal(d.Body, &m); err != nil || m.Step < 1 || m.Step > lastStep {
		return "", nil, "", fmt.Errorf("message %s on %s: malformed body %q", msgID, svc, d.Body)
	}
	s := b.schemas[svc]
	newID := uuid.Must(uuid.NewV7())
	if svc != svcOrch {
		body, err := json.Marshal(m) // the reply names the same saga and step
		if err != nil {
			return "", nil, "", err
		}
		return `WITH seen AS (INSERT INTO ` + s + `.inbox (message_id) VALUES ($1::uuid) ON CONFLICT DO NOTHING RETURNING message_id)
INSERT INTO ` + s + `.outbox (message_id, routing_key, payload) SELECT $2::uuid, $3::text, $4::bytea FROM seen`,
			[]any{msgID, newID, svcOrch, body}, svc, nil
	}
	if m.Step == lastStep {
		return `WITH seen AS (INSERT INTO ` + s + `.inbox (message_id) VALUES ($1::uuid) ON CONFLICT DO NOTHING RETURNING message_id)
UPDATE ` + s + `.saga SET status = 'completed', finished_at = $3::timestamptz
WHERE id = $2::uuid AND step = $4::int AND status = 'running' AND EXISTS (SELECT FROM seen)`,
			[]any{msgID, m.SagaID, time.Now(), m.Step}, "", nil
	}
	next := m.Step + 1
	body, err := json.Marshal(blMessage{SagaID: m.SagaID, Step: next})
	if err != nil {
		return "", nil, "", err
	}
	return `WITH seen AS (INSERT INTO ` + s + `.inbox (message_id) VALUES ($1::uuid) ON CONFLICT DO NOTHING RETURNING message_id),
moved AS (UPDATE ` + s + `.saga SET step = $3::int WHERE id = $2::uuid AND step = $4::int AND status = 'running' AND EXISTS (SELECT FROM seen) RETURNING id)
INSERT INTO ` + s + `.outbox (message_id, routing_key, payload) SELECT $5::uuid, $6::text, $7::bytea FROM moved`,
		[]any{msgID, m.SagaID, next, m.Step, newID, stepService[next], body}, svcOrch, nil
}

// startConsumer consumes svc's queue on a channel of its own with manual
// acknowledgement: workers goroutines applying one delivery per transaction,
// or (group) one goroutine applying up to GroupMaxBatch per transaction.
func (b *baseline) startConsumer(svc string, workers, prefetch int) error {
	ch, err := b.sub.Channel()
	if err != nil {
		return fmt.Errorf("open consumer channel on %s: %w", svc, err)
	}
	b.consumerCh = append(b.consumerCh, ch)
	if err := ch.Qos(prefetch, 0, false); err != nil {
		return fmt.Errorf("set prefetch on %s: %w", svc, err)
	}
	deliveries, err := ch.Consume(b.queue(svc), "", false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume %s: %w", b.queue(svc), err)
	}
	for range workers {
		b.wg.Go(func() {
			if b.group {
				b.consumeGroups(svc, ch, deliveries)
				return
			}
			for d := range deliveries {
				b.handleOne(svc, &d)
			}
		})
	}
	return nil
}

// handleOne applies one delivery in one round trip [BEGIN; statement;
// COMMIT], then wakes the relay and acknowledges: never before the commit.
func (b *baseline) handleOne(svc string, d *amqp.Delivery) {
	sql, args, wake, err := b.apply(svc, d)
	if err != nil {
		b.fail(err)
		_ = d.Nack(false, false) // malformed: drop it
		return
	}
	batch := &pgx.Batch{}
	batch.Queue("BEGIN")
	batch.Queue(sql, args...)
	batch.Queue("COMMIT")
	if err := b.exec(b.ctx, batch); err != nil {
		b.fail(fmt.Errorf("apply message %s on %s: %w", d.MessageId, svc, err))
		_ = d.Nack(false, true)
		return
	}
	if wake != "" {
		b.wakeRelay(wake)
	}
	if err := d.Ack(false); err != nil {
		b.fail(fmt.Errorf("ack message %s on %s: %w", d.MessageId, svc, err))
	}
}

// consumeGroups takes a delivery, then more until GroupLinger has passed
// since the first or GroupMaxBatch are taken, applies them all in one round
// trip [BEGIN; one statement per delivery; COMMIT], and acknowledges them
// with one multiple-ack of the last tag (the channel is this consumer's
// alone, so that acks exactly this group).
func (b *baseline) consumeGroups(svc string, ch *amqp.Channel, deliveries <-chan amqp.Delivery) {
	timer := time.NewTimer(GroupLinger) // Reset discards a stale tick (Go 1.23+)
	defer timer.Stop()
	group := make([]amqp.Delivery, 0, GroupMaxBatch)
	for {
		d, ok := <-deliveries
		if !ok {
			return
		}
		group = append(group[:0], d)
		timer.Reset(GroupLinger)
	collect:
		for len(group) < GroupMaxBatch {
			select {
			case d, ok := <-deliveries:
				if !ok {
					return // the channel is closed: nothing can be acked any more
				}
				group = append(group, d)
			case <-timer.C:
				break collect
			}
		}
		batch := &pgx.Batch{}
		batch.Queue("BEGIN")
		wakes := map[string]bool{}
		for i := range group {
			sql, args, wake, err := b.apply(svc, &group[i])
			if err != nil {
				b.fail(err) // malformed: left out, acked with the group
				continue
			}
			batch.Queue(sql, args...)
			if wake != "" {
				wakes[wake] = true
			}
		}
		batch.Queue("COMMIT")
		last := group[len(group)-1].DeliveryTag
		if err := b.exec(b.ctx, batch); err != nil {
			b.fail(fmt.Errorf("apply %d messages on %s: %w", len(group), svc, err))
			_ = ch.Nack(last, true, true)
			continue
		}
		for w := range wakes {
			b.wakeRelay(w)
		}
		if err := ch.Ack(last, true); err != nil {
			b.fail(fmt.Errorf("ack %d messages on %s: %w", len(group), svc, err))
		}
	}
}

// startRelay starts one relay worker of svc's outbox on a confirm-mode
// channel of its own.
func (b *baseline) startRelay(svc string) error {
	ch, err := b.pub.Channel()
	if err != nil {
		return fmt.Errorf("open relay channel of %s: %w", svc, err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return fmt.Errorf("confirm mode on relay channel of %s: %w", svc, err)
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, 16))
	b.wg.Go(func() {
		for r := range returns { // closed with the channel
			b.fail(fmt.Errorf("message %s returned by the broker: %s", r.MessageId, r.ReplyText))
		}
	})
	b.wg.Go(func() {
		defer func() { _ = ch.Close() }()
		b.relay(svc, ch)
	})
	return nil
}

// relay publishes svc's outbox until the pipeline stops: it claims a batch,
// publishes it with pipelined confirms, deletes the rows the broker
// confirmed, and goes on at once when the batch was full, else on a wake-up
// (sent after each commit that wrote to the outbox) or after the poll
// floor.
func (b *baseline) relay(svc string, ch *amqp.Channel) {
	s := b.schemas[svc]
	claim := `UPDATE ` + s + `.outbox SET claimed_until = now() + interval '10 seconds'
WHERE id IN (SELECT id FROM ` + s + `.outbox WHERE claimed_until IS NULL OR claimed_until < now()
             ORDER BY id LIMIT $1::int FOR UPDATE SKIP LOCKED)
RETURNING id, message_id, routing_key, payload`
	del := `DELETE FROM ` + s + `.outbox WHERE id = ANY($1::bigint[])`
	poll := time.NewTimer(baselineRelayPoll)
	defer poll.Stop()
	for {
		n, err := b.relayOnce(ch, claim, del)
		if err != nil {
			if b.ctx.Err() != nil {
				return
			}
			b.fail(fmt.Errorf("relay of %s: %w", svc, err))
		}
		if n == baselineRelayBatch && err == nil {
			continue
		}
		poll.Reset(baselineRelayPoll)
		select {
		case <-b.ctx.Done():
			return
		case <-b.wake[svc]:
		case <-poll.C:
		}
	}
}

type outboxRow struct {
	id         int64
	messageID  uuid.UUID
	routingKey string
	payload    []byte
}

// relayOnce claims, publishes and settles one batch, and returns its size.
func (b *baseline) relayOnce(ch *amqp.Channel, claim, del string) (int, error) {
	ctx := b.ctx
	rows, err := b.pool.Query(ctx, claim, baselineRelayBatch)
	if err != nil {
		return 0, fmt.Errorf("claim outbox batch: %w", err)
	}
	batch, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (outboxRow, error) {
		var o outboxRow
		err := r.Scan(&o.id, &o.messageID, &o.routingKey, &o.payload)
		return o, err
	})
	if err != nil {
		return 0, fmt.Errorf("claim outbox batch: %w", err)
	}
	if len(batch) == 0 {
		return 0, nil
	}
	confirms := make([]*amqp.DeferredConfirmation, 0, len(batch))
	var pubErr error
	for _, o := range batch {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, b.exchange, o.routingKey, true, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent,
			ContentType:  "application/json",
			MessageId:    o.messageID.String(),
			Body:         o.payload,
		})
		if err != nil {
			pubErr = fmt.Errorf("publish message %s: %w", o.messageID, err)
			break
		}
		confirms = append(confirms, dc)
	}
	wctx, cancel := context.WithTimeout(ctx, baselineConfirmWait)
	defer cancel()
	confirmed := make([]int64, 0, len(confirms))
	for i, dc := range confirms {
		acked, err := dc.WaitContext(wctx)
		if err != nil {
			pubErr = errors.Join(pubErr, fmt.Errorf("confirm of message %s: %w", batch[i].messageID, err))
			break
		}
		if acked { // a nacked row stays claimed and is retried after the lease
			confirmed = append(confirmed, batch[i].id)
		}
	}
	if len(confirmed) > 0 {
		if _, err := b.pool.Exec(ctx, del, confirmed); err != nil {
			return len(batch), errors.Join(pubErr, fmt.Errorf("delete %d published rows: %w", len(confirmed), err))
		}
	}
	return len(batch), pubErr
}
