package saga_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/saga/sagatest"
)

// TestCancelAndTerminate: cancel compensates the step in flight and the
// completed steps and ends compensated with the reason; terminate stops at
// once, sends nothing and ends terminated; both are recorded with actor and
// reason; late replies and timers of a terminated saga are ignored.
func TestCancelAndTerminate(t *testing.T) {
	t.Parallel()
	// Drivers that bring a checkout saga to a point.
	charging := func(s *sagatest.Scenario[Order]) { completeReserve(t, s); sagatest.ExpectCommand(s, charge) }
	waitingRetry := func(s *sagatest.Scenario[Order]) {
		s.Start(Order{ID: "o-1", Amount: 10})
		sagatest.ExpectCommand(s, reserve)
		s.Advance(reserveTimeout)
		s.RequireStepStatus("reserve-stock", saga.StepWaitingRetry)
	}
	compensating := func(s *sagatest.Scenario[Order]) {
		completeReserve(t, s)
		sagatest.ExpectCommand(s, charge)
		s.ReplyFailure("declined")
		sagatest.ExpectCompensation(s, release)
	}
	failed := func(s *sagatest.Scenario[Order]) {
		compensating(s)
		s.ReplyFailure("warehouse offline")
		s.RequireStatus(saga.StatusFailed)
	}
	for _, tc := range []struct {
		name  string
		kind  saga.EventKind
		drive func(s *sagatest.Scenario[Order])
		// wantStep is the status of the step in flight after the event;
		// wantSent the first message sent ("" none); wantErr a refusal.
		step     string
		wantStep saga.StepStatus
		wantSent string
		wantErr  string
	}{
		{name: "cancel running step", kind: saga.EventCancel, drive: charging, step: "charge-card", wantStep: saga.StepCompensating, wantSent: "payment.refund"},
		{name: "cancel step waiting for a retry", kind: saga.EventCancel, drive: waitingRetry, step: "reserve-stock", wantStep: saga.StepCompensating, wantSent: "inventory.release"},
		{name: "cancel compensating", kind: saga.EventCancel, drive: compensating, wantErr: "only a running saga can be cancelled, this one is compensating"},
		{name: "cancel failed", kind: saga.EventCancel, drive: failed, wantErr: "this one is failed"},
		{name: "terminate running step", kind: saga.EventTerminate, drive: charging, step: "charge-card", wantStep: saga.StepTerminated},
		{name: "terminate step waiting for a retry", kind: saga.EventTerminate, drive: waitingRetry, step: "reserve-stock", wantStep: saga.StepTerminated},
		{name: "terminate compensating", kind: saga.EventTerminate, drive: compensating, step: "reserve-stock", wantStep: saga.StepTerminated},
		{name: "terminate failed", kind: saga.EventTerminate, drive: failed, step: "reserve-stock", wantStep: saga.StepCompensationFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := sagatest.New(t, checkout)
			tc.drive(s)
			before := s.Instance()
			res, err := s.Apply(saga.Event{Kind: tc.kind, Actor: "alice", Reason: "customer called"})
			if tc.wantErr != "" {
				require.ErrorIs(t, err, saga.ErrInvalidTransition)
				require.ErrorContains(t, err, tc.wantErr)
				require.Equal(t, before, s.Instance(), "a refused action changes nothing")
				return
			}
			require.NoError(t, err)
			entry := res.History[0]
			require.Equal(t, "alice", entry.Actor)
			require.Equal(t, "customer called", entry.Detail)
			require.Equal(t, s.Now(), entry.At)
			require.Equal(t, tc.wantStep, res.Instance.Steps[stepIndex(res.Instance, tc.step)].Status)
			switch tc.kind {
			case saga.EventCancel:
				require.Equal(t, saga.HistoryCancelled, entry.Event)
				require.Equal(t, "cancelled by alice: customer called", res.Instance.LastError)
				require.Equal(t, saga.StatusCompensating, res.Instance.Status)
				require.Equal(t, tc.wantSent, res.Emit[0].Type)
				// The step in flight first (through the barrier), then the
				// completed ones in reverse order; the last is the release.
				var sent []string
				for s.Instance().Status == saga.StatusCompensating {
					msg := s.Next()
					require.Equal(t, saga.PhaseCompensation, msg.Phase)
					sent = append(sent, msg.Type)
					s.Deliver(saga.Event{Kind: saga.EventReplySuccess, Type: msg.Type, Step: msg.Step,
						StepIndex: msg.StepIndex, Attempt: msg.Attempt, Payload: []byte(`{}`)})
				}
				require.Equal(t, tc.wantSent, sent[0])
				require.Equal(t, "inventory.release", sent[len(sent)-1])
				s.RequireStatus(saga.StatusCompensated)
			case saga.EventTerminate:
				require.Equal(t, saga.HistoryTerminated, entry.Event)
				require.Len(t, res.History, 1)
				require.Empty(t, res.Emit, "terminate sends nothing")
				require.Equal(t, "terminated by alice: customer called", res.Instance.LastError)
				s.RequireStatus(saga.StatusTerminated)
				require.Equal(t, -1, res.Instance.CurrentStep)
				require.True(t, res.Instance.Deadline.IsZero(), "no timer is due")
				require.True(t, res.Instance.Status.Terminal())
				require.True(t, res.Instance.Status.Finished())
				// A late reply is ignored, and so is any operator action.
				late, err := s.Apply(saga.Event{Kind: saga.EventReplySuccess, Type: "payment.charge", Step: "charge-card",
					StepIndex: 1, Attempt: 1, Payload: []byte(`{"payment_id":"late"}`)})
				require.NoError(t, err)
				require.True(t, late.Ignored)
				require.Contains(t, late.IgnoreReason, "the saga is terminated")
				for _, k := range []saga.EventKind{saga.EventCancel, saga.EventTerminate, saga.EventRetry} {
					_, err = s.Apply(saga.Event{Kind: k, Actor: "bob"})
					require.ErrorIs(t, err, saga.ErrInvalidTransition, k)
				}
			}
		})
	}
}

// TestAbortIsCancel: the former EventAbort does what EventCancel does,
// recorded under its old name.
func TestAbortIsCancel(t *testing.T) {
	t.Parallel()
	results := map[saga.EventKind]saga.Result{}
	for _, kind := range []saga.EventKind{saga.EventAbort, saga.EventCancel} {
		s := sagatest.New(t, checkout)
		completeReserve(t, s)
		sagatest.ExpectCommand(s, charge)
		res, err := s.Apply(saga.Event{Kind: kind, Actor: "bob", Reason: "why"})
		require.NoError(t, err)
		results[kind] = res
	}
	a, c := results[saga.EventAbort], results[saga.EventCancel]
	require.Equal(t, saga.HistoryAborted, a.History[0].Event)
	require.Equal(t, saga.HistoryCancelled, c.History[0].Event)
	require.Equal(t, c.Emit, a.Emit)
	require.Equal(t, c.Instance.Status, a.Instance.Status)
	require.Equal(t, "aborted by bob: why", a.Instance.LastError)
	for i := range c.Instance.Steps {
		require.Equal(t, c.Instance.Steps[i].Status, a.Instance.Steps[i].Status)
	}
}

func stepIndex(inst saga.Instance, name string) int {
	for i, st := range inst.Steps {
		if st.Name == name {
			return i
		}
	}
	return -1
}
