package participant_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/participant"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

// slowReserve is a Reserve handler that, for the SKU "slow", runs a
// statement far longer than the tests' HandlerTimeout and, when swallow is
// set, ignores that statement's error and returns success, as a careless
// handler would. Other SKUs take one from their stock. calls counts the
// runs for "slow".
func slowReserve(e *env, swallow bool, calls *atomic.Int32) func(context.Context, pgx.Tx, *participant.Request[ReserveReq]) (ReserveReply, error) {
	return func(ctx context.Context, tx pgx.Tx, req *participant.Request[ReserveReq]) (ReserveReply, error) {
		if req.Data.SKU == "slow" {
			calls.Add(1)
			_, err := tx.Exec(ctx, "SELECT pg_sleep(60)")
			if swallow {
				err = nil
			}
			return ReserveReply{}, err
		}
		var left int
		err := tx.QueryRow(ctx, "UPDATE "+e.table("stock")+" SET qty = qty - $2 WHERE sku = $1 RETURNING qty", req.Data.SKU, req.Data.Qty).Scan(&left)
		return ReserveReply{Remaining: left}, err
	}
}

// timeoutGroup returns a client, not started, whose one worker handles up
// to 16 deliveries a transaction, with a HandlerTimeout of 200ms and one
// attempt per message, and its broker.
func timeoutGroup(e *env) (*participant.Client, *rabbitmq.Broker) {
	e.t.Helper()
	b := e.newBroker()
	cfg := e.config(b)
	cfg.Workers, cfg.MaxBatch = 1, 16
	cfg.HandlerTimeout, cfg.Retry.MaxAttempts = 200*time.Millisecond, 1
	c, err := participant.NewClient(cfg)
	require.NoError(e.t, err)
	return c, b
}

// A handler that runs past Config.HandlerTimeout has failed, whatever it
// returns: its statement is cancelled, the run is counted against
// MaxAttempts, and after the last the command is dead-lettered and
// answered with a failure, instead of holding its worker, its transaction
// and its delivery for as long as the handler takes. Counting it matters:
// pgx closes the connection under the cancelled statement, and the commit's
// connection error would otherwise be retried, uncounted, for ever.
func TestHandlerTimeoutFailsTheRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.setStock("a", 5)
	var calls atomic.Int32
	e.newClient(func(cfg *participant.Config) {
		cfg.HandlerTimeout, cfg.Retry.MaxAttempts = 200*time.Millisecond, 2
	}, func(c *participant.Client) {
		participant.HandleCommand(c, Reserve, slowReserve(e, true, &calls))
	})
	slow, fast := reserve(uuid.New(), "slow", 1), reserve(uuid.New(), "a", 1)
	e.publish(slow, fast)

	f := requireFailure(t, e.replies.wait(t, slow.MessageID), saga.CodeDeadLettered)
	require.Contains(t, f.Reason, "gave up after 2 attempts")
	require.Contains(t, f.Reason, "returned after its timeout of 200ms (participant.Config.HandlerTimeout)")
	require.Equal(t, int32(2), calls.Load(), "each run counted")
	a, err := e.store.AttemptGet(context.Background(), slow.MessageID)
	require.NoError(t, err)
	require.Equal(t, 2, a.Attempts)
	requireSuccess(t, e.replies.wait(t, fast.MessageID))
	require.Equal(t, 4, e.stock("a"))
}

// In a group (Config.MaxBatch), a handler that times out fails alone: its
// run counts as its first attempt, and the group's other deliveries, whose
// transaction pgx closed under the handler, are handled again on their own,
// each applied once. The slow handler is not run a second time at once.
func TestHandlerTimeoutInAGroupFailsOnlyItsDelivery(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.setStock("a", 10)
	c, b := timeoutGroup(e)
	var calls atomic.Int32
	participant.HandleCommand(c, Reserve, slowReserve(e, false, &calls))
	require.NoError(t, b.Declare(context.Background(), c.QueueSpec()))
	msgs := []message.Message{reserve(uuid.New(), "a", 1), reserve(uuid.New(), "slow", 1), reserve(uuid.New(), "a", 1), reserve(uuid.New(), "a", 1)}
	e.publish(msgs...)
	e.start(c, b)

	f := requireFailure(t, e.replies.wait(t, msgs[1].MessageID), saga.CodeDeadLettered)
	require.Contains(t, f.Reason, "did not return within its timeout of 200ms")
	for _, m := range []message.Message{msgs[0], msgs[2], msgs[3]} {
		requireSuccess(t, e.replies.wait(t, m.MessageID))
		require.Equal(t, 1, e.outboxReplies(m.MessageID), "one reply to %s", m.MessageID)
	}
	require.Equal(t, 7, e.stock("a"), "every other command applied once")
	require.Equal(t, int32(1), calls.Load(), "the timed-out handler ran once: MaxAttempts 1")
}

// An outside call cut by HandlerTimeout has failed and is counted, even
// when the error it returns is a database client's connection error (here
// a pgx.Connect to a server that never answers): that is the call's
// failure, not the participant's database being down, which would be
// retried uncounted for ever.
func TestHandlerTimeoutCountsAnOutsideCall(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	accepted := make(chan net.Conn, 16) // held open, never answered
	go func() {
		defer close(accepted)
		for {
			conn, err := silent.Accept()
			if err != nil {
				return
			}
			accepted <- conn
		}
	}()
	t.Cleanup(func() {
		_ = silent.Close()
		for conn := range accepted {
			_ = conn.Close()
		}
	})
	var calls atomic.Int32
	e.newClient(func(cfg *participant.Config) {
		cfg.HandlerTimeout, cfg.Retry.MaxAttempts = 200*time.Millisecond, 2
	}, func(c *participant.Client) {
		participant.HandleOutsideCommand(c, Charge, func(ctx context.Context, _ *participant.OutsideRequest[ChargeReq]) (ChargeReply, error) {
			calls.Add(1)
			conn, err := pgx.Connect(ctx, fmt.Sprintf("postgres://ledger@%s/ledger?sslmode=disable", silent.Addr()))
			if err == nil {
				_ = conn.Close(ctx)
				return ChargeReply{}, errors.New("the silent server answered")
			}
			return ChargeReply{}, fmt.Errorf("ledger: %w", err)
		}, nil)
	})
	cmd := charge(uuid.New())
	e.publish(cmd)
	f := requireFailure(t, e.replies.wait(t, cmd.MessageID), saga.CodeDeadLettered)
	require.Contains(t, f.Reason, "gave up after 2 attempts")
	require.Contains(t, f.Reason, "did not return within its timeout of 200ms")
	require.Equal(t, int32(2), calls.Load(), "each call counted")
}

// A group whose handler times out keeps the failures of the handlers that
// ran before it: they count, as they would in a group that commits, and are
// retried after their backoff, not run again at once as if they had not
// run.
func TestHandlerTimeoutInAGroupKeepsEarlierFailures(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c, b := timeoutGroup(e)
	var slowCalls, badCalls atomic.Int32
	slow := slowReserve(e, false, &slowCalls)
	participant.HandleCommand(c, Reserve, func(ctx context.Context, tx pgx.Tx, req *participant.Request[ReserveReq]) (ReserveReply, error) {
		if req.Data.SKU == "bad" {
			badCalls.Add(1)
			return ReserveReply{}, errors.New("the warehouse system is down")
		}
		return slow(ctx, tx, req)
	})
	require.NoError(t, b.Declare(context.Background(), c.QueueSpec()))
	bad, slowMsg := reserve(uuid.New(), "bad", 1), reserve(uuid.New(), "slow", 1)
	e.publish(bad, slowMsg)
	e.start(c, b)
	f := requireFailure(t, e.replies.wait(t, bad.MessageID), saga.CodeDeadLettered)
	require.Contains(t, f.Reason, "the warehouse system is down")
	requireFailure(t, e.replies.wait(t, slowMsg.MessageID), saga.CodeDeadLettered)
	require.Equal(t, int32(1), badCalls.Load(), "the failed run counted: MaxAttempts 1")
	require.Equal(t, int32(1), slowCalls.Load())
}
