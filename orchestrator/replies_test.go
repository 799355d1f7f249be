package orchestrator_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/transport"
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
	reply := func(id uuid.UUID, payload string) transport.Message {
		return transport.Message{
			Envelope: transport.Envelope{
				Version: transport.EnvelopeVersion, MessageID: id, Type: Reserve.Name(), Kind: transport.KindReplySuccess,
				RoutingKey: "orders", SagaID: started.ID, SagaType: "order", Step: "reserve", StepIndex: 0, Attempt: 1,
				CreatedAt: time.Now(),
			},
			Payload: []byte(payload),
		}
	}
	first := reply(uuid.Must(uuid.NewV7()), `{"reservation_id":"r-first"}`)
	require.NoError(t, e.broker.Publish(ctx, first, first))

	s := waitStatus(t, c, started.ID, saga.StatusRunning, 10*time.Second)
	waitFor(t, 10*time.Second, "the reply to move the saga to charge", func() bool {
		var err error
		s, err = c.Get(ctx, started.ID)
		require.NoError(t, err)
		return s.CurrentStep == 1
	})
	waitFor(t, 10*time.Second, "the duplicate to be counted", func() bool {
		return e.count(`SELECT coalesce(sum(duplicates), 0)::int FROM %[1]s.sagabox_inbox WHERE message_id = $1`, first.MessageID) == 1
	})

	// A second, different reply for the step already done (a late answer to
	// a re-sent command, say) must not be applied.
	stale := reply(uuid.Must(uuid.NewV7()), `{"reservation_id":"r-stale"}`)
	require.NoError(t, e.broker.Publish(ctx, stale))
	waitFor(t, 10*time.Second, "the stale reply to be recorded", func() bool {
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
