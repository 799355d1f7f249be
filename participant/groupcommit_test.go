package participant_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/participant"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store/driver"
)

// TestGroupCommitIsolatesEachDelivery shows group commit at a participant
// (Config.MaxBatch): commands waiting in the queue are handled several to a
// transaction, and each keeps what it would get on its own. A handler that
// fails is rolled back to its savepoint, its writes with it, and retried on
// its own; one that rejects keeps its inbox record and barrier mark but
// none of its writes; the others commit.
func TestGroupCommitIsolatesEachDelivery(t *testing.T) {
	t.Parallel()
	var rts dbtest.RoundTrips
	pool := dbtest.PoolWith(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = &rts })
	e := newEnvOnPool(t, pool)
	const n = 30
	e.setStock("a", n)
	e.setStock("flaky", 10)
	e.setStock("none", 0)

	b := e.newBroker()
	cfg := e.config(b)
	cfg.Workers, cfg.MaxBatch = 1, 16
	c, err := participant.NewClient(cfg)
	require.NoError(t, err)
	// "flaky" fails its first attempt after writing; "none" rejects after
	// writing.
	var mu sync.Mutex
	var flakyAttempts []int
	participant.HandleCommand(c, Reserve, func(ctx context.Context, tx pgx.Tx, req *participant.Request[ReserveReq]) (ReserveReply, error) {
		if req.Data.SKU == "flaky" {
			mu.Lock()
			flakyAttempts = append(flakyAttempts, req.DeliveryAttempt)
			mu.Unlock()
		}
		var left int
		err := tx.QueryRow(ctx, "UPDATE "+e.table("stock")+" SET qty = qty - $2 WHERE sku = $1 RETURNING qty",
			req.Data.SKU, req.Data.Qty).Scan(&left)
		switch {
		case err != nil:
			return ReserveReply{}, err
		case req.Data.SKU == "flaky" && req.DeliveryAttempt == 1:
			return ReserveReply{}, errors.New("the warehouse system timed out")
		case left < 0:
			return ReserveReply{}, participant.RejectWithCode("out_of_stock", errors.New("not in stock"))
		}
		return ReserveReply{Remaining: left}, nil
	})
	ctx := context.Background()
	require.NoError(t, b.Declare(ctx, c.QueueSpec()))

	var msgs []message.Message
	for range n / 2 {
		msgs = append(msgs, reserve(uuid.New(), "a", 1))
	}
	flaky, none := reserve(uuid.New(), "flaky", 1), reserve(uuid.New(), "none", 1)
	msgs = append(msgs, flaky, none)
	for range n - n/2 {
		msgs = append(msgs, reserve(uuid.New(), "a", 1))
	}
	e.publish(msgs...)

	rts.Start()
	e.start(c, b)
	for _, m := range msgs {
		reply := e.replies.wait(t, m.MessageID)
		if m.MessageID == none.MessageID {
			requireFailure(t, reply, "out_of_stock")
		} else {
			requireSuccess(t, reply)
		}
	}
	rts.Stop()

	require.Equal(t, 0, e.stock("a"), "every command applied once")
	require.Equal(t, 9, e.stock("flaky"), "the failed attempt's write was rolled back")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []int{1, 2}, flakyAttempts, "the attempt that failed in its group counts: the handler runs again once, as attempt 2")
	require.Equal(t, 0, e.stock("none"), "the rejection's write was discarded")
	for _, m := range msgs {
		require.Equal(t, 1, e.outboxReplies(m.MessageID), "one reply to %s", m.MessageID)
		require.Equal(t, 0, e.duplicates(m.MessageID), "%s recorded once", m.MessageID)
	}
	deliveries, groups := 0, 0
	for _, tx := range rts.Transactions() {
		if tx.Has("DeliveryBeginAction") {
			deliveries++
		}
		if !tx.Has("DeliveryBeginMany") {
			continue
		}
		deliveries++
		groups++
		// One round trip begins the group with its inbox records and marks,
		// one finishes it with its replies and COMMIT; each handler's
		// savepoint goes out with its first statement's round trip before
		// it, and its release with the next one.
		handlers := 0
		for _, s := range tx.Statements() {
			if strings.HasPrefix(s, "UPDATE "+e.table("stock")) {
				handlers++
			}
		}
		require.Len(t, tx.RoundTrips, 2+2*handlers, "round trips of a group of %d handlers: %v", handlers, tx.RoundTrips)
		require.True(t, tx.Has("DeliveryFinishMany"), "a group finishes in one statement")
	}
	t.Logf("%d commands handled in %d transactions, %d of them groups", len(msgs), deliveries, groups)
	require.LessOrEqual(t, deliveries, len(msgs)/2, "waiting commands are handled several to a transaction")
	require.Positive(t, groups)
}

// TestGroupCommitRetriesADeadlockAtOnce: a handler of a group that fails
// with a deadlock (or a serialization failure) is run again at once, its
// failure not counted, as it would be on its own: with one attempt allowed,
// it still succeeds. Any other failure counts (TestGroupCommitIsolatesEachDelivery).
func TestGroupCommitRetriesADeadlockAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.setStock("a", 10)
	e.setStock("contended", 10)
	b := e.newBroker()
	cfg := e.config(b)
	cfg.Workers, cfg.MaxBatch = 1, 16
	cfg.Retry.MaxAttempts = 1
	c, err := participant.NewClient(cfg)
	require.NoError(t, err)
	var mu sync.Mutex
	calls := 0
	participant.HandleCommand(c, Reserve, func(ctx context.Context, tx pgx.Tx, req *participant.Request[ReserveReq]) (ReserveReply, error) {
		var left int
		if err := tx.QueryRow(ctx, "UPDATE "+e.table("stock")+" SET qty = qty - $2 WHERE sku = $1 RETURNING qty",
			req.Data.SKU, req.Data.Qty).Scan(&left); err != nil {
			return ReserveReply{}, err
		}
		if req.Data.SKU == "contended" {
			mu.Lock()
			defer mu.Unlock()
			if calls++; calls == 1 {
				// As PostgreSQL fails the victim of a deadlock.
				_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'deadlock detected' USING ERRCODE = '40P01'; END $$`)
				return ReserveReply{}, fmt.Errorf("reserve: %w", err)
			}
		}
		return ReserveReply{Remaining: left}, nil
	})
	msgs := []message.Message{reserve(uuid.New(), "a", 1), reserve(uuid.New(), "contended", 1), reserve(uuid.New(), "a", 1)}
	require.NoError(t, b.Declare(context.Background(), c.QueueSpec()))
	e.publish(msgs...)
	e.start(c, b)
	for _, m := range msgs {
		requireSuccess(t, e.replies.wait(t, m.MessageID))
	}
	require.Equal(t, 9, e.stock("contended"), "applied once, the deadlocked attempt rolled back")
	require.Equal(t, 8, e.stock("a"))
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 2, calls)
}

// TestGroupCommitDefersASecondMessageOfOneStep shows that a group applies
// at most one message of a message id and of a saga step: a duplicate
// copy, and a step's compensation queued right behind its action, are
// handled after the group commits, on their own, so they see what the first
// did. The duplicate counts itself and changes nothing; the compensation
// undoes the action (and in the other order, the late action is not
// applied).
func TestGroupCommitDefersASecondMessageOfOneStep(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.setStock("a", 100)
	const sagas = 6
	var msgs []message.Message
	var actions, comps []message.Message
	for i := range sagas {
		saga := uuid.New()
		a, c := reserve(saga, "a", 1), release(saga, "a", 1)
		actions, comps = append(actions, a), append(comps, c)
		if i%2 == 0 {
			msgs = append(msgs, a, a, c) // the action twice, then its compensation
		} else {
			msgs = append(msgs, c, a) // the compensation first: the action is never applied
		}
	}
	b := e.newBroker()
	cfg := e.config(b)
	cfg.Workers, cfg.MaxBatch = 1, 16
	c, err := participant.NewClient(cfg)
	require.NoError(t, err)
	inventory(e, c)
	require.NoError(t, b.Declare(context.Background(), c.QueueSpec()))
	e.publish(msgs...)
	e.start(c, b)
	for i := range sagas {
		reply := e.replies.wait(t, actions[i].MessageID)
		requireSuccess(t, e.replies.wait(t, comps[i].MessageID))
		if i%2 == 0 {
			requireSuccess(t, reply)
			require.Equal(t, 1, e.duplicates(actions[i].MessageID), "the copy of the action counted itself")
			require.Equal(t, map[message.Phase]driver.BarrierOutcome{
				message.PhaseAction: driver.BarrierApplied, message.PhaseCompensation: driver.BarrierApplied,
			}, e.barrier(actions[i].SagaID))
		} else {
			requireFailure(t, reply, saga.CodeCompensatedBeforeRun)
			require.Equal(t, map[message.Phase]driver.BarrierOutcome{
				message.PhaseAction: driver.BarrierBlocked, message.PhaseCompensation: driver.BarrierSkipped,
			}, e.barrier(actions[i].SagaID))
		}
	}
	require.Equal(t, 100, e.stock("a"), "every applied action was compensated once, no other one applied")
}
