package orchestrator_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

// A reply delivered twice, and a reply for a step that is already done,
// change the saga once: the duplicate is stopped by the inbox (and counted),
// the stale reply is recorded in the history as ignored.
func TestGuaranteeNoDoubleEffectDuplicateAndStaleReplies(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// Nobody answers: the test plays the participants.
	e.blackhole(Reserve.Name(), Charge.Name())
	def := orderSaga(1, time.Hour, 1)
	c := e.runOrchestrator(e.orchConfig(def))
	started := e.start(c, def, Order{ID: "o-dup", Qty: 1, Amount: 10, Address: "here"}, nil)

	ctx := context.Background()
	require.NoError(t, e.broker.Declare(ctx, orchestratorQueue))
	reply := func(id uuid.UUID, payload string) message.Message {
		return message.Message{
			Envelope: message.Envelope{
				Version: message.Version, MessageID: id, Type: Reserve.Name(), Kind: message.KindReplySuccess,
				RoutingKey: "orders", SagaID: started.ID, SagaType: "order", Step: "reserve", StepIndex: 0, Attempt: 1,
				CreatedAt: time.Now(),
			},
			Payload: []byte(payload),
		}
	}
	first := reply(uuid.Must(uuid.NewV7()), `{"reservation_id":"r-first"}`)
	require.NoError(t, e.broker.Publish(ctx, first, first))

	s := waitStatus(t, c, started.ID, saga.StatusRunning, 10*time.Second)
	testkit.WaitFor(t, 10*time.Second, "the reply to move the saga to charge", func() bool {
		var err error
		s, err = c.Get(ctx, started.ID)
		require.NoError(t, err)
		return s.CurrentStep == 1
	})
	testkit.WaitFor(t, 10*time.Second, "the duplicate to be counted", func() bool {
		return e.count(`SELECT coalesce(sum(duplicates), 0)::int FROM %[1]s.sagabox_inbox WHERE message_id = $1`, first.MessageID) == 1
	})

	// A second, different reply for the step already done (a late answer to
	// a re-sent command, say) must not be applied.
	stale := reply(uuid.Must(uuid.NewV7()), `{"reservation_id":"r-stale"}`)
	require.NoError(t, e.broker.Publish(ctx, stale))
	testkit.WaitFor(t, 10*time.Second, "the stale reply to be recorded", func() bool {
		hist, err := c.History(ctx, started.ID)
		require.NoError(t, err)
		for _, h := range hist {
			if h.Event == saga.HistoryReplyIgnored && h.MessageID == stale.MessageID {
				return true
			}
		}
		return false
	})

	after, err := c.Get(ctx, started.ID)
	require.NoError(t, err)
	require.Equal(t, 1, after.CurrentStep)
	data, err := def.DecodeData(after.Data)
	require.NoError(t, err)
	require.Equal(t, "r-first", data.ReservationID, "only the first reply changed the data")
	hist, err := c.History(ctx, started.ID)
	require.NoError(t, err)
	applied := 0
	for _, h := range hist {
		if h.Event == saga.HistoryReplyApplied && h.Step == "reserve" {
			applied++
		}
	}
	require.Equal(t, 1, applied, "the reserve reply is applied once")
}

// A reply that keeps failing to apply (here: a local step after it that
// always errors) is retried a bounded number of times, then dead-lettered
// with the reason and recorded on the saga: it does not loop forever.
func TestGuaranteePoisonInputReplyRetriesAreBounded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	def := saga.MustNew("order", 1,
		saga.Step("reserve",
			saga.Invoke(Reserve, func(o *Order) ReserveReq { return ReserveReq{OrderID: o.ID, Qty: o.Qty} }, nil),
			saga.Compensate(Release, func(o *Order) OrderRef { return OrderRef{OrderID: o.ID} }),
		),
		saga.LocalStep("book", func(context.Context, *Order) error { return errors.New("ledger unavailable") }),
	)
	testkit.Run(t, e.inventory(false).Run)
	cfg := e.orchConfig(def)
	cfg.ReplyRetry = saga.RetryPolicy{InitialInterval: 10 * time.Millisecond, MaxAttempts: 3}
	ctx := context.Background()
	require.NoError(t, e.broker.Declare(ctx, orchestratorQueue))
	dead := amqptest.Consume(t, e.broker.DeadLetterQueueName(orchestratorQueue.Name))
	c := e.runOrchestrator(cfg)
	started := e.start(c, def, Order{ID: "poison-reply", Qty: 1}, nil)

	s := requireReplyGivenUp(t, c, dead, started.ID, "ledger unavailable")
	require.Contains(t, s.LastError, "after 3 attempts")
	hist, err := c.History(ctx, started.ID)
	require.NoError(t, err)
	require.Equal(t, orchestrator.HistoryReplyDeadLettered, hist[len(hist)-1].Event)
	require.Equal(t, 3, e.count(`SELECT attempts FROM %[1]s.sagabox_inbox_attempt WHERE dead_lettered_at IS NOT NULL`))
}

// A saga whose definition code panics is handled like one whose code
// returns an error, and the orchestrator goes on running the others: a
// reply whose apply function panics is retried a bounded number of times
// and dead-lettered, and a deadline whose compensation builder panics is
// recorded on its saga, which is no longer claimed. Before, the sweeper's
// panic ended the process, and a restarted one panicked again at once.
func TestGuaranteePoisonInputDefinitionPanicsAreBounded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var nothing *Order
	boomOnApply := saga.MustNew("boom-apply", 1,
		saga.Step("reserve",
			saga.Invoke(Reserve, func(o *Order) ReserveReq { return ReserveReq{OrderID: o.ID, Qty: o.Qty} },
				func(o *Order, _ ReserveReply) { o.ReservationID = nothing.ID }),
		),
	)
	boomOnDeadline := saga.MustNew("boom-deadline", 1,
		saga.Step("ship",
			saga.Invoke(Ship, func(o *Order) ShipReq { return ShipReq{OrderID: o.ID, Address: o.Address} }, nil),
			saga.Compensate(Release, func(*Order) OrderRef { return OrderRef{OrderID: nothing.ID} }),
			saga.WithTimeout[Order](500*time.Millisecond),
		),
	)
	healthy := orderSaga(1, 30*time.Second, 1)
	testkit.Run(t, e.inventory(false).Run)
	testkit.Run(t, e.payment(true).Run)
	e.blackhole(Ship.Name())
	cfg := e.orchConfig(boomOnApply, boomOnDeadline, healthy)
	cfg.ReplyRetry = saga.RetryPolicy{InitialInterval: 10 * time.Millisecond, MaxAttempts: 3}
	ctx := context.Background()
	require.NoError(t, e.broker.Declare(ctx, orchestratorQueue))
	dead := amqptest.Consume(t, e.broker.DeadLetterQueueName(orchestratorQueue.Name))
	c := e.runOrchestrator(cfg)
	onApply := e.start(c, boomOnApply, Order{ID: "boom-apply", Qty: 1}, nil)
	onDeadline := e.start(c, boomOnDeadline, Order{ID: "boom-deadline", Address: "here"}, nil)

	s := requireReplyGivenUp(t, c, dead, onApply.ID, "saga definition code panicked: runtime error: invalid memory address or nil pointer dereference")
	require.Contains(t, s.LastError, "panicked")

	testkit.WaitFor(t, 30*time.Second, "the panicking deadline to be recorded", func() bool {
		h, err := c.History(ctx, onDeadline.ID)
		require.NoError(t, err)
		return h[len(h)-1].Event == orchestrator.HistoryDeadlineFailed
	})
	s, err := c.Get(ctx, onDeadline.ID)
	require.NoError(t, err)
	require.Contains(t, s.LastError, "panicked")
	require.Contains(t, s.LastError, "TestGuaranteePoisonInputDefinitionPanicsAreBounded", "the error names the function that panicked")
	require.True(t, s.Deadline.IsZero(), "no longer claimed")

	// The orchestrator still runs the other sagas (ship goes to the
	// blackhole: the saga runs up to it).
	o := Order{ID: "healthy", Qty: 1, Amount: 10, Address: "here"}
	ok := e.start(c, healthy, o, nil)
	testkit.WaitFor(t, 30*time.Second, "the healthy saga to reach its ship step", func() bool {
		s, err := c.Get(ctx, ok.ID)
		require.NoError(t, err)
		return s.CurrentStep == 2
	})
}

// requireReplyGivenUp waits for the dead letter of a reply to saga id given
// up on after 3 attempts, for cause, and returns the saga, which still runs,
// for an operator.
func requireReplyGivenUp(t *testing.T, c *orchestrator.Client, dead <-chan amqp.Delivery, id uuid.UUID, cause string) *orchestrator.Saga {
	t.Helper()
	dl := amqptest.Next(t, dead, 30*time.Second)
	reason, _ := dl.Headers[rabbitmq.HeaderDeadLetterReason].(string)
	require.Contains(t, reason, "gave up after 3 attempts: ")
	require.Contains(t, reason, cause)
	s, err := c.Get(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, saga.StatusRunning, s.Status, "the saga waits for an operator, visibly")
	return s
}
