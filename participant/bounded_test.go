package participant_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/participant"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/transport"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

// Handler bugs that fail the same way on every attempt are retried
// MaxAttempts times and then dead-lettered with a failure reply, like any
// other failing handler (DESIGN §4.8), even when the error they cause looks
// like a lost connection to pgx or cannot be stored as it is:
//   - a result left open (rows never closed): pgx then reports "conn busy"
//     on the next statement, an error it calls safe to retry;
//   - a query on a context the handler let expire: pgx reports it before
//     sending anything, also "safe to retry";
//   - an error text Postgres cannot store (a NUL byte, invalid UTF-8).
func TestGuaranteePoisonInputHandlerBugsBounded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.newClient(nil, func(c *participant.Client) {
		participant.HandleCommand(c, Reserve, func(ctx context.Context, tx pgx.Tx, req *participant.Request[ReserveReq]) (ReserveReply, error) {
			switch req.Data.SKU {
			case "rows-open":
				_, err := tx.Query(ctx, "SELECT 1") // never closed
				return ReserveReply{}, err
			case "ctx-expired":
				qctx, cancel := context.WithCancel(ctx)
				cancel()
				_, err := tx.Exec(qctx, "SELECT 1")
				return ReserveReply{}, err
			case "nul-error":
				return ReserveReply{}, errors.New("no such sku \x00 here")
			case "bad-utf8-error":
				return ReserveReply{}, errors.New("no such sku \xff\xfe here")
			}
			return ReserveReply{}, nil
		})
	})
	dlq := amqptestConsume(t, e.broker.DeadLetterQueueName(service))

	for _, sku := range []string{"rows-open", "ctx-expired", "nul-error", "bad-utf8-error"} {
		cmd := reserve(uuid.New(), sku, 1)
		e.publish(cmd)
		f := requireFailure(t, e.replies.wait(t, cmd.MessageID), saga.CodeDeadLettered)
		require.Contains(t, f.Reason, "gave up after 3 attempts", "sku %s", sku)
		require.Equal(t, cmd.MessageID.String(), nextDeadLetter(t, dlq).id, "sku %s", sku)
		a, err := e.store.AttemptGet(context.Background(), cmd.MessageID)
		require.NoError(t, err, "sku %s", sku)
		require.Equal(t, 3, a.Attempts, "sku %s", sku)
		require.False(t, a.DeadLetteredAt.IsZero(), "sku %s", sku)
	}

	// The queue still flows.
	ok := reserve(uuid.New(), "fine", 1)
	e.publish(ok)
	requireSuccess(t, e.replies.wait(t, ok.MessageID))
}

// A saga message whose envelope carries text Postgres cannot store (a NUL
// byte in the step, a step too long for the barrier's key) cannot be
// recorded in the inbox, so it cannot be answered either; it must still
// reach the dead-letter queue instead of being retried for ever, and the
// queue keeps flowing.
func TestGuaranteePoisonInputUnstorableEnvelope(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.setStock("good", 100)
	e.newClient(nil, nil)
	dlq := amqptestConsume(t, e.broker.DeadLetterQueueName(service))

	long := make([]byte, 4000) // random, so that Postgres cannot compress it
	_, _ = rand.Read(long)
	for name, step := range map[string]string{
		"nul in step":   "reserve\x00",
		"step too long": hex.EncodeToString(long),
	} {
		for _, kind := range []message.Kind{message.KindCommand, message.KindCompensation} {
			bad := reserve(uuid.New(), "good", 1)
			if kind == message.KindCompensation {
				bad = release(uuid.New(), "good", 1)
			}
			bad.Step = step
			e.publish(bad)
			dead := nextDeadLetter(t, dlq)
			require.Equal(t, bad.MessageID.String(), dead.id, "%s, %s", name, kind)

			good := reserve(uuid.New(), "good", 1)
			e.publish(good)
			requireSuccess(t, e.replies.wait(t, good.MessageID))
		}
	}
	require.Equal(t, 96, e.stock("good"))
}

// A message whose handler keeps failing waits for its next attempt without
// holding a worker (DESIGN §4.8: the queue keeps flowing). With one worker
// and a backoff of seconds, two good commands, each published once the one
// before was answered, are answered before the failing message's second
// attempt; the failing message still ends dead-lettered after MaxAttempts,
// with its failure reply. Only the order of events is asserted: a worker
// held for the backoff would take the failing message's second attempt
// before the second good command.
func TestGuaranteePoisonInputRetryingMessageDoesNotStallQueue(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.setStock("good", 10)
	var mu sync.Mutex
	var badAttempts []int // DeliveryAttempt of each run of the failing handler
	e.newClient(func(cfg *participant.Config) {
		cfg.Workers = 1
		// Delays drawn from [2.5s, 5s]: the 5s retry queue.
		cfg.Retry = saga.RetryPolicy{InitialInterval: 5 * time.Second, MaximumInterval: 5 * time.Second, MaxAttempts: 3}
	}, func(c *participant.Client) {
		participant.HandleCommand(c, Reserve, func(ctx context.Context, tx pgx.Tx, req *participant.Request[ReserveReq]) (ReserveReply, error) {
			if req.Data.SKU == "bad" {
				mu.Lock()
				badAttempts = append(badAttempts, req.DeliveryAttempt)
				mu.Unlock()
				return ReserveReply{}, errors.New("downstream is down")
			}
			return ReserveReply{Remaining: 1}, nil
		})
	})
	dlq := amqptestConsume(t, e.broker.DeadLetterQueueName(service))
	attempts := func(id uuid.UUID) int {
		a, err := e.store.AttemptGet(context.Background(), id)
		if errors.Is(err, message.ErrNotFound) {
			return 0
		}
		require.NoError(t, err)
		return a.Attempts
	}

	bad := reserve(uuid.New(), "bad", 1)
	e.publish(bad)
	testkit.WaitFor(t, waitFor, "the failing message's first attempt", func() bool { return attempts(bad.MessageID) >= 1 })
	for range 2 {
		good := reserve(uuid.New(), "good", 1)
		e.publish(good)
		requireSuccess(t, e.replies.wait(t, good.MessageID))
	}
	require.Equal(t, 1, attempts(bad.MessageID), "good commands published after the failing message's first attempt are answered before its second")
	require.Zero(t, e.replies.count(bad.MessageID), "the failing message is still retrying")

	f := requireFailure(t, e.replies.wait(t, bad.MessageID), saga.CodeDeadLettered)
	require.Contains(t, f.Reason, "gave up after 3 attempts")
	require.Equal(t, bad.MessageID.String(), nextDeadLetter(t, dlq).id)
	require.Equal(t, 3, attempts(bad.MessageID))
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []int{1, 2, 3}, badAttempts, "each attempt knows its number: the retried copies read as redelivered")
}

// A message that reaches the give-up path although another delivery of it
// was processed (a concurrent copy, a commit reported as failed that went
// through) is acknowledged as a duplicate, not dead-lettered: it is done,
// not poison. Here its attempts are at the limit and it comes back as a
// delayed-retry copy, as it would after a failed attempt.
func TestGiveUpOnAProcessedMessageAcknowledgesIt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.setStock("done", 10)
	e.newClient(func(cfg *participant.Config) { cfg.Workers = 1 }, nil)
	dlq := amqptestConsume(t, e.broker.DeadLetterQueueName(service))
	ctx := context.Background()

	cmd := reserve(uuid.New(), "done", 2)
	e.publish(cmd)
	requireSuccess(t, e.replies.wait(t, cmd.MessageID))
	for range 3 { // MaxAttempts in the tests' config
		_, err := e.store.AttemptRecord(ctx, &cmd.Envelope, "failed before it succeeded elsewhere")
		require.NoError(t, err)
	}

	copyOf, err := rabbitmq.EncodeMessage(cmd)
	require.NoError(t, err)
	copyOf.Headers[rabbitmq.HeaderRetries] = int32(1)
	copyOf.Headers[rabbitmq.HeaderRoutingKey] = cmd.RoutingKey
	amqptest.PublishRaw(t, e.broker.ExchangeName(transport.ExchangeCommands), cmd.RoutingKey, copyOf)
	// With one worker, a poison message published next is handled after
	// the copy: the first dead letter must be that one.
	poison := newMessage(uuid.New(), "reserve", message.KindCommand, "inventory.unknown", map[string]int{"n": 1})
	amqptest.PublishRaw(t, e.broker.ExchangeName(transport.ExchangeCommands), cmd.RoutingKey, mustEncode(t, poison))

	dead := nextDeadLetter(t, dlq)
	require.Equal(t, poison.MessageID.String(), dead.id, "the processed message was not dead-lettered")
	require.Equal(t, 1, e.duplicates(cmd.MessageID))
	require.Equal(t, 8, e.stock("done"), "applied once")
	require.Equal(t, 1, e.outboxReplies(cmd.MessageID))
}

func mustEncode(t *testing.T, m message.Message) amqp.Publishing {
	t.Helper()
	p, err := rabbitmq.EncodeMessage(m)
	require.NoError(t, err)
	return p
}
