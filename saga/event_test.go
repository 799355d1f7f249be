package saga_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/saga/sagatest"
)

type Confirmed struct {
	ProviderRef string `json:"provider_ref"`
}

var confirmed = saga.NewEventType[Confirmed]("payment.confirmed")

const confirmTimeout = time.Hour

// eventSaga reserves, charges, waits for the provider's confirmation, then
// notifies.
var eventSaga = saga.MustNew("confirmed-checkout", 1, reserveStep(), chargeStep(),
	saga.WaitEvent("await-confirmation", confirmed, func(o *Order, c Confirmed) { o.Notes = append(o.Notes, c.ProviderRef) },
		saga.WithTimeout[Order](confirmTimeout)),
	notifyStep())

// charged drives eventSaga to the wait step.
func charged(t *testing.T, s *sagatest.Scenario[Order]) {
	t.Helper()
	completeReserve(t, s)
	sagatest.ExpectCommand(s, charge)
	res := sagatest.ReplySuccess(s, charge, ChargeReply{PaymentID: "p-1"})
	require.Empty(t, res.Emit, "a wait step sends nothing")
	s.RequireStepStatus("await-confirmation", saga.StepWaitingEvent)
	require.Equal(t, s.Now().Add(confirmTimeout), s.Instance().Deadline)
}

func TestWaitEvent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, s *sagatest.Scenario[Order])
	}{
		{"event consumed, saga moves on", func(t *testing.T, s *sagatest.Scenario[Order]) {
			charged(t, s)
			res := sagatest.SendEvent(s, confirmed, "evt-1", Confirmed{ProviderRef: "prov-9"})
			require.False(t, res.Ignored)
			s.RequireStepStatus("await-confirmation", saga.StepSucceeded)
			require.Equal(t, []string{"prov-9"}, s.Data().Notes, "the payload is applied to the data")
			require.Equal(t, saga.HistoryEventReceived, res.History[0].Event)
			require.Contains(t, res.History[0].Detail, "evt-1")
			sagatest.ExpectCommand(s, notify)
			require.True(t, s.Instance().Deadline.IsZero() || s.Instance().Deadline.After(s.Now()))
		}},
		{"early event ignored by the core (the orchestrator keeps it)", func(t *testing.T, s *sagatest.Scenario[Order]) {
			completeReserve(t, s)
			res := sagatest.SendEvent(s, confirmed, "evt-1", Confirmed{})
			require.True(t, res.Ignored)
			require.Contains(t, res.IgnoreReason, "does not wait for it")
			s.RequireStatus(saga.StatusRunning)
		}},
		{"another event is ignored", func(t *testing.T, s *sagatest.Scenario[Order]) {
			charged(t, s)
			res := sagatest.SendEvent(s, saga.NewEventType[Confirmed]("payment.refused"), "evt-2", Confirmed{})
			require.True(t, res.Ignored)
			s.RequireStepStatus("await-confirmation", saga.StepWaitingEvent)
		}},
		{"timeout compensates the earlier steps", func(t *testing.T, s *sagatest.Scenario[Order]) {
			charged(t, s)
			s.Advance(confirmTimeout)
			s.RequireStepStatus("await-confirmation", saga.StepTimedOut)
			require.Contains(t, s.Instance().LastError, `event "payment.confirmed" did not arrive within 1h0m0s`)
			sagatest.ExpectCompensation(s, refund)
			sagatest.ReplySuccess(s, refund, saga.None{})
			sagatest.ExpectCompensation(s, release)
			sagatest.ReplySuccess(s, release, saga.None{})
			s.RequireStatus(saga.StatusCompensated)
			res := sagatest.SendEvent(s, confirmed, "late", Confirmed{})
			require.True(t, res.Ignored, "an event for an ended saga is ignored")
			require.Contains(t, res.IgnoreReason, "the saga is compensated")
		}},
		{"cancel while waiting compensates the earlier steps", func(t *testing.T, s *sagatest.Scenario[Order]) {
			charged(t, s)
			s.Cancel("ops", "customer left")
			s.RequireStepStatus("await-confirmation", saga.StepAborted)
			sagatest.ExpectCompensation(s, refund)
		}},
		{"terminate while waiting", func(t *testing.T, s *sagatest.Scenario[Order]) {
			charged(t, s)
			s.Terminate("ops", "")
			s.RequireStepStatus("await-confirmation", saga.StepTerminated)
			s.RequireStatus(saga.StatusTerminated)
		}},
		{"retry has nothing to re-send", func(t *testing.T, s *sagatest.Scenario[Order]) {
			charged(t, s)
			_, err := s.Apply(saga.Event{Kind: saga.EventRetry, Actor: "ops"})
			require.ErrorIs(t, err, saga.ErrInvalidTransition)
		}},
		{"a reply while waiting is ignored", func(t *testing.T, s *sagatest.Scenario[Order]) {
			charged(t, s)
			res, err := s.Apply(saga.Event{Kind: saga.EventReplySuccess, Type: "payment.charge", Step: "charge-card", StepIndex: 1, Attempt: 1, Payload: []byte(`{"payment_id":"x"}`)})
			require.NoError(t, err)
			require.True(t, res.Ignored)
		}},
		{"a malformed payload is an error", func(t *testing.T, s *sagatest.Scenario[Order]) {
			charged(t, s)
			_, err := s.Apply(saga.Event{Kind: saga.EventOutside, Type: "payment.confirmed", Payload: []byte(`{"nope":1}`), EventID: "e"})
			require.ErrorIs(t, err, saga.ErrInvalidPayload)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t, sagatest.New(t, eventSaga))
		})
	}
}

func TestWaitEventValidation(t *testing.T) {
	t.Parallel()
	_, err := saga.New("bad", 1,
		saga.WaitEvent[Order]("w", confirmed, nil,
			saga.Compensate(refund, func(*Order) RefundReq { return RefundReq{} }),
			saga.WithRetry[Order](saga.RetryPolicy{MaxAttempts: 2})),
		saga.WaitEvent[Order]("e", saga.NewEventType[Confirmed](""), nil))
	require.ErrorIs(t, err, saga.ErrInvalidDefinition)
	for _, want := range []string{"cannot have a compensation", "cannot have a retry policy", "empty name"} {
		require.ErrorContains(t, err, want)
	}
	info := eventSaga.Steps()[2]
	require.Equal(t, "payment.confirmed", info.WaitEvent)
	require.Equal(t, confirmTimeout, info.Timeout)
	require.False(t, errors.Is(nil, saga.ErrInvalidDefinition))
}
