package participant_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/participant"
	"github.com/sagabox/sagabox/saga"
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
	b := e.newBroker()
	cfg := e.config(b)
	cfg.Workers, cfg.MaxBatch = 1, 16
	cfg.HandlerTimeout, cfg.Retry.MaxAttempts = 200*time.Millisecond, 1
	c, err := participant.NewClient(cfg)
	require.NoError(t, err)
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
