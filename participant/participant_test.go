package participant_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/participant"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/store/driver"
	"github.com/sagabox/sagabox/transport"
)

// A command delivered twice, or five times, reserves stock once and is
// answered once; the inbox counts the duplicates.
func TestGuaranteeNoDoubleEffectDuplicateCommands(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.setStock("twice", 100)
	e.setStock("five", 100)
	e.newClient(nil, nil)

	twice := reserve(uuid.New(), "twice", 1)
	five := reserve(uuid.New(), "five", 10)
	var batch []message.Message
	for range 2 {
		batch = append(batch, twice)
	}
	for range 5 {
		batch = append(batch, five)
	}
	e.publish(batch...)

	testkit.WaitFor(t, waitFor, "1 and 4 duplicates counted", func() bool {
		return e.duplicates(twice.MessageID) == 1 && e.duplicates(five.MessageID) == 4
	})
	r1, r2 := e.replies.wait(t, twice.MessageID), e.replies.wait(t, five.MessageID)
	requireSuccess(t, r1)
	requireSuccess(t, r2)
	require.JSONEq(t, `{"remaining":99}`, string(r1.Payload))
	require.JSONEq(t, `{"remaining":90}`, string(r2.Payload))

	require.Equal(t, 99, e.stock("twice"), "effect applied once")
	require.Equal(t, 90, e.stock("five"), "effect applied once")
	require.Equal(t, 1, e.outboxReplies(twice.MessageID), "one reply per distinct effect")
	require.Equal(t, 1, e.outboxReplies(five.MessageID), "one reply per distinct effect")

	// The reply answers its command: same type, correlation, saga and step.
	require.Equal(t, Reserve.Name(), r1.Type)
	require.Equal(t, twice.SagaID, r1.SagaID)
	require.Equal(t, twice.Step, r1.Step)
	require.Equal(t, twice.StepIndex, r1.StepIndex)
	require.Equal(t, twice.Attempt, r1.Attempt)
	require.Equal(t, orch, r1.RoutingKey)

	stats, err := e.store.Store.InboxStats(context.Background(), 0)
	require.NoError(t, err)
	require.Equal(t, int64(2), stats.Total)
	require.Equal(t, int64(5), stats.Duplicates)
}

// A participant that commits and dies before acknowledging gets the message
// again after a restart: the redelivery is recognised as a duplicate, and
// the reply, committed with the effect, still arrives.
func TestGuaranteeNoDoubleEffectCrashBetweenCommitAndAck(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.setStock("crash", 10)

	b1 := e.newBroker()
	c1, err := participant.NewClient(e.config(b1))
	require.NoError(t, err)
	inventory(e, c1)
	committed := make(chan struct{})
	frozen := make(chan struct{})
	defer close(frozen) // the first client stays frozen after its commit until the test is over
	var once sync.Once
	participant.SetTestHookAfterCommit(c1, func(*transport.Delivery) {
		once.Do(func() { close(committed) })
		<-frozen
	})
	e.start(c1, b1)

	cmd := reserve(uuid.New(), "crash", 3)
	e.publish(cmd)
	select {
	case <-committed:
	case <-t.Context().Done():
		t.Fatal("test ended before the commit")
	}
	// "Crash": the connection goes away with the delivery unacknowledged and
	// the relay not woken.
	require.NoError(t, b1.Close())
	require.Equal(t, 0, e.duplicates(cmd.MessageID))

	e.newClient(nil, nil)
	testkit.WaitFor(t, waitFor, "the redelivery is deduplicated", func() bool { return e.duplicates(cmd.MessageID) == 1 })
	requireSuccess(t, e.replies.wait(t, cmd.MessageID))
	require.Equal(t, 7, e.stock("crash"), "effect applied once")
	require.Equal(t, 1, e.outboxReplies(cmd.MessageID))
}

// The barrier (DESIGN §4.6): re-sent actions run once, a compensation
// without its action is a no-op that blocks the late action, compensations
// run once, and compensating a rejected action does nothing.
func TestGuaranteeCompensationBarrier(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, sku := range []string{"resent", "null", "repeat", "rejected"} {
		e.setStock(sku, 10)
	}
	e.newClient(nil, nil)

	t.Run("re-sent action runs once", func(t *testing.T) {
		first := reserve(uuid.New(), "resent", 4)
		e.publish(first)
		r1 := e.replies.wait(t, first.MessageID)
		requireSuccess(t, r1)
		again := resend(first)
		e.publish(again)
		r2 := e.replies.wait(t, again.MessageID)
		requireSuccess(t, r2)
		require.JSONEq(t, string(r1.Payload), string(r2.Payload), "the re-send gets the first run's reply")
		require.Equal(t, again.Attempt, r2.Attempt)
		require.Equal(t, 6, e.stock("resent"))
	})

	t.Run("null compensation and hanging action", func(t *testing.T) {
		sagaID := uuid.New()
		comp := release(sagaID, "null", 4)
		e.publish(comp)
		requireSuccess(t, e.replies.wait(t, comp.MessageID))
		require.Equal(t, 10, e.stock("null"), "nothing to undo")

		late := reserve(sagaID, "null", 4)
		e.publish(late)
		f := requireFailure(t, e.replies.wait(t, late.MessageID), saga.CodeCompensatedBeforeRun)
		require.Contains(t, f.Reason, "compensated before it ran")
		require.Equal(t, 10, e.stock("null"), "the hanging action is not applied")

		outcomes := e.barrier(sagaID)
		require.Len(t, outcomes, 2)
		require.Equal(t, driver.BarrierBlocked, outcomes[message.PhaseAction])
		require.Equal(t, driver.BarrierSkipped, outcomes[message.PhaseCompensation])
	})

	t.Run("repeated compensation runs once", func(t *testing.T) {
		sagaID := uuid.New()
		act := reserve(sagaID, "repeat", 3)
		e.publish(act)
		requireSuccess(t, e.replies.wait(t, act.MessageID))
		require.Equal(t, 7, e.stock("repeat"))

		c1 := release(sagaID, "repeat", 3)
		e.publish(c1)
		requireSuccess(t, e.replies.wait(t, c1.MessageID))
		require.Equal(t, 10, e.stock("repeat"))
		c2 := resend(c1)
		e.publish(c2)
		requireSuccess(t, e.replies.wait(t, c2.MessageID))
		require.Equal(t, 10, e.stock("repeat"), "the compensation ran once")
	})

	t.Run("compensating a rejected action does nothing", func(t *testing.T) {
		sagaID := uuid.New()
		act := reserve(sagaID, "rejected", 1000)
		e.publish(act)
		f := requireFailure(t, e.replies.wait(t, act.MessageID), "out_of_stock")
		require.Contains(t, f.Reason, "not enough rejected")
		again := resend(act)
		e.publish(again)
		requireFailure(t, e.replies.wait(t, again.MessageID), "out_of_stock")

		comp := release(sagaID, "rejected", 1000)
		e.publish(comp)
		requireSuccess(t, e.replies.wait(t, comp.MessageID))
		require.Equal(t, 10, e.stock("rejected"))
	})
}

// A rejection rolls back the handler's writes but keeps the inbox record
// and the failure reply.
func TestRejectRollsBackHandlerWrites(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.setStock("partial", 5)
	e.newClient(nil, func(c *participant.Client) {
		participant.HandleCommand(c, Reserve, func(ctx context.Context, tx pgx.Tx, req *participant.Request[ReserveReq]) (ReserveReply, error) {
			if _, err := tx.Exec(ctx, "UPDATE "+e.table("stock")+" SET qty = 0 WHERE sku = $1", req.Data.SKU); err != nil {
				return ReserveReply{}, err
			}
			return ReserveReply{}, participant.Reject(errors.New("changed my mind"))
		})
	})
	cmd := reserve(uuid.New(), "partial", 1)
	e.publish(cmd)
	f := requireFailure(t, e.replies.wait(t, cmd.MessageID), "")
	require.Equal(t, "changed my mind", f.Reason)
	require.Equal(t, 5, e.stock("partial"))
	require.Equal(t, 0, e.duplicates(cmd.MessageID), "the rejected command is recorded as processed")
}

// A handler that fails twice (an error, then a panic) and then succeeds is
// applied once, with two failed attempts recorded.
func TestGuaranteePoisonInputTransientFailuresRetried(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.setStock("flaky", 10)
	var calls atomic.Int32
	var attempts []int
	var mu sync.Mutex
	e.newClient(func(cfg *participant.Config) { cfg.Retry.MaxAttempts = 5 }, func(c *participant.Client) {
		participant.HandleCommand(c, Reserve, func(ctx context.Context, tx pgx.Tx, req *participant.Request[ReserveReq]) (ReserveReply, error) {
			mu.Lock()
			attempts = append(attempts, req.DeliveryAttempt)
			mu.Unlock()
			if _, err := tx.Exec(ctx, "UPDATE "+e.table("stock")+" SET qty = qty - $2 WHERE sku = $1", req.Data.SKU, req.Data.Qty); err != nil {
				return ReserveReply{}, err
			}
			switch calls.Add(1) {
			case 1:
				return ReserveReply{}, errors.New("database hiccup")
			case 2:
				panic("handler bug")
			}
			return ReserveReply{Remaining: -1}, nil
		})
	})
	cmd := reserve(uuid.New(), "flaky", 1)
	e.publish(cmd)
	requireSuccess(t, e.replies.wait(t, cmd.MessageID))
	require.Equal(t, int32(3), calls.Load())
	require.Equal(t, 9, e.stock("flaky"), "failed attempts left no trace")
	mu.Lock()
	require.Equal(t, []int{1, 2, 3}, attempts)
	mu.Unlock()
	a, err := e.store.AttemptGet(context.Background(), cmd.MessageID)
	require.NoError(t, err)
	require.Equal(t, 2, a.Attempts)
	require.Contains(t, a.LastError, "panicked: handler bug")
	require.True(t, a.DeadLetteredAt.IsZero())
	require.Equal(t, 1, e.outboxReplies(cmd.MessageID))
}

// A handler that always fails is dead-lettered after MaxAttempts and the
// saga gets a failure reply; so does a compensation that always fails.
func TestGuaranteePoisonInputAlwaysFailingDeadLettered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.setStock("doomed", 10)
	var actionCalls, compCalls atomic.Int32
	e.newClient(nil, func(c *participant.Client) {
		participant.HandleCommand(c, Reserve, func(ctx context.Context, tx pgx.Tx, req *participant.Request[ReserveReq]) (ReserveReply, error) {
			if req.Data.Qty == 1 {
				return ReserveReply{}, nil // the step to compensate
			}
			actionCalls.Add(1)
			return ReserveReply{}, errors.New("downstream is down")
		})
		participant.HandleCompensation(c, Release, func(ctx context.Context, tx pgx.Tx, req *participant.Request[ReleaseReq]) error {
			compCalls.Add(1)
			return participant.Reject(errors.New("cannot release"))
		})
	})
	dlq := amqptestConsume(t, e.broker.DeadLetterQueueName(service))

	cmd := reserve(uuid.New(), "doomed", 2)
	e.publish(cmd)
	f := requireFailure(t, e.replies.wait(t, cmd.MessageID), saga.CodeDeadLettered)
	require.Contains(t, f.Reason, "gave up after 3 attempts")
	require.Contains(t, f.Reason, "downstream is down")
	dead := nextDeadLetter(t, dlq)
	require.Equal(t, cmd.MessageID.String(), dead.id)
	require.Contains(t, dead.reason, "gave up after 3 attempts")
	require.Equal(t, int32(3), actionCalls.Load(), "not retried past MaxAttempts")
	a, err := e.store.AttemptGet(context.Background(), cmd.MessageID)
	require.NoError(t, err)
	require.Equal(t, 3, a.Attempts)
	require.False(t, a.DeadLetteredAt.IsZero())

	// A re-send of the given-up action gets the same failure, not a new run.
	again := resend(cmd)
	e.publish(again)
	requireFailure(t, e.replies.wait(t, again.MessageID), saga.CodeDeadLettered)
	require.Equal(t, int32(3), actionCalls.Load())

	// A compensation that keeps failing: the orchestrator learns it failed.
	sagaID := uuid.New()
	act := reserve(sagaID, "doomed", 1)
	e.publish(act)
	requireSuccess(t, e.replies.wait(t, act.MessageID))
	comp := release(sagaID, "doomed", 1)
	e.publish(comp)
	f = requireFailure(t, e.replies.wait(t, comp.MessageID), saga.CodeDeadLettered)
	require.Contains(t, f.Reason, "cannot reject")
	require.Equal(t, Release.Name(), e.replies.wait(t, comp.MessageID).Type)
	require.Equal(t, comp.MessageID.String(), nextDeadLetter(t, dlq).id)
	require.Equal(t, int32(3), compCalls.Load())
	require.NotContains(t, e.barrier(sagaID), message.PhaseCompensation, "a failed compensation leaves no mark, so that it can be retried")
}

type OrderCancelled struct {
	OrderID string `json:"order_id"`
}

type StockReleased struct {
	OrderID string `json:"order_id"`
}

// A plain event is handled once however often it arrives, and the event
// its handler publishes goes out through the outbox once.
func TestGuaranteeNoDoubleEffectEvents(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	audit := newSink(t, e.broker, transport.QueueSpec{Name: "audit", Events: []string{"stock.released"}})
	var calls atomic.Int32
	e.newClient(nil, func(c *participant.Client) {
		participant.HandleEvent(c, "order.cancelled", func(ctx context.Context, tx pgx.Tx, ev *participant.Request[OrderCancelled]) error {
			calls.Add(1)
			if _, err := tx.Exec(ctx, "INSERT INTO "+e.table("cancelled")+" (order_id) VALUES ($1)", ev.Data.OrderID); err != nil {
				return err
			}
			out, err := participant.NewEvent("stock.released", StockReleased(ev.Data))
			if err != nil {
				return err
			}
			out.CorrelationID = ev.MessageID.String()
			return c.Publish(ctx, tx, out)
		})
	})
	payload, err := json.Marshal(OrderCancelled{OrderID: "o-1"})
	require.NoError(t, err)
	ev := message.Message{
		Envelope: message.Envelope{
			Version: message.Version, MessageID: uuid.Must(uuid.NewV7()), Type: "order.cancelled",
			Kind: message.KindEvent, RoutingKey: "order.cancelled",
		},
		Payload: payload,
	}
	e.publish(ev, ev, ev)

	testkit.WaitFor(t, waitFor, "duplicates counted", func() bool { return e.duplicates(ev.MessageID) == 2 })
	out := audit.wait(t, ev.MessageID)
	require.Equal(t, message.KindEvent, out.Kind)
	require.JSONEq(t, `{"order_id":"o-1"}`, string(out.Payload))
	require.Equal(t, int32(1), calls.Load())
	require.Equal(t, 1, e.outboxReplies(ev.MessageID), "one outgoing event")
	var n int
	require.NoError(t, e.store.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+e.table("cancelled")).Scan(&n))
	require.Equal(t, 1, n)
}

func TestNewClientValidatesConfig(t *testing.T) {
	t.Parallel()
	_, err := participant.NewClient(participant.Config{Workers: -1, Retry: saga.RetryPolicy{MaxAttempts: -2}, Schema: "Bad-Schema"})
	require.Error(t, err)
	for _, field := range []string{"Pool", "Service", "Broker", "Schema", "Workers", "Retry: retry policy MaxAttempts -2"} {
		require.ErrorContains(t, err, field)
	}
}

func TestRunChecksSchemaAndHandlers(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	e := newEnv(t)
	cfg := e.config(e.broker)
	cfg.Pool, cfg.Schema = pool, dbtest.SchemaName(t)
	c, err := participant.NewClient(cfg)
	require.NoError(t, err)
	require.ErrorContains(t, c.Run(t.Context()), "no handlers registered")
	inventory(e, c)
	err = c.Run(t.Context())
	require.ErrorIs(t, err, store.ErrSchemaOutdated)
	require.ErrorContains(t, err, "sagabox migrate up")
	require.Panics(t, func() { inventory(e, c) }, "a type is registered once")
}

func TestRejectIsRejection(t *testing.T) {
	t.Parallel()
	base := errors.New("no")
	err := fmt.Errorf("wrapped: %w", participant.RejectWithCode("c", base))
	require.ErrorIs(t, err, saga.ErrRejected)
	require.ErrorIs(t, err, base)
	require.NoError(t, participant.Reject(nil))
}

func TestRetryDefaultsAreTheParticipants(t *testing.T) {
	t.Parallel()
	d := participant.Config{}.WithDefaults().Retry
	require.Equal(t, participant.DefaultMaxAttempts, d.MaxAttempts, "the participant's defaults, not saga's")
	require.Equal(t, participant.DefaultMaximumInterval, d.MaximumInterval)
}
