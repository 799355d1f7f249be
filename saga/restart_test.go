package saga_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/saga/sagatest"
)

// compensatedAtCharge runs the checkout fixture until charge-card is
// rejected and reserve-stock compensated.
func compensatedAtCharge(t *testing.T, s *sagatest.Scenario[Order]) saga.Outgoing {
	t.Helper()
	completeReserve(t, s)
	chargeMsg := s.Next()
	s.ReplyFailure("card declined")
	sagatest.ExpectCompensation(s, release)
	sagatest.ReplySuccess(s, release, saga.None{})
	s.RequireStatus(saga.StatusCompensated)
	return chargeMsg
}

// failedAtShip runs the checkout fixture until ship is rejected and the
// refund of charge-card fails: the saga is failed, reserve-stock and
// notify-customer still succeeded, charge-card's charge stands.
func failedAtShip(t *testing.T, s *sagatest.Scenario[Order]) {
	t.Helper()
	completeReserve(t, s)
	sagatest.ExpectCommand(s, charge)
	sagatest.ReplySuccess(s, charge, ChargeReply{PaymentID: "p-1"})
	sagatest.ExpectCommand(s, notify)
	sagatest.ReplySuccess(s, notify, saga.None{})
	sagatest.ExpectCommand(s, ship)
	s.ReplyFailure("no courier")
	sagatest.ExpectCompensation(s, refund)
	s.ReplyFailure("bank offline")
	s.RequireStatus(saga.StatusFailed)
}

func TestRestartACompensatedSagaFromTheStart(t *testing.T) {
	t.Parallel()
	s := sagatest.New(t, checkout)
	oldCharge := compensatedAtCharge(t, s)
	res := s.Restart("reserve-stock", "alice", "card limit raised")
	inst := s.Instance()
	require.Equal(t, 1, inst.Run)
	require.Equal(t, saga.StatusRunning, inst.Status)
	require.Equal(t, saga.PhaseAction, inst.Phase)
	require.Empty(t, inst.LastError)
	require.Equal(t, saga.HistoryEntry{
		At: s.Now(), Event: saga.HistoryRestarted, Step: "reserve-stock", StepIndex: 0, Phase: saga.PhaseAction, Actor: "alice",
		Detail: `from step "reserve-stock": run 1, after run 0 ended compensated: card limit raised`,
	}, res.History[0])
	msg := s.Next()
	require.Equal(t, saga.Outgoing{
		Type: "inventory.reserve", Phase: saga.PhaseAction, Step: "reserve-stock", StepIndex: 0, Attempt: 1, Run: 1, Payload: []byte(`{"order_id":"o-1"}`),
	}, msg, "the command carries the new run, so the participant's barrier runs it again")
	sagatest.ReplySuccess(s, reserve, ReserveReply{ReservationID: "r-2"})
	late := s.ReplyFailureTo(oldCharge, "card declined")
	require.True(t, late.Ignored, "a reply to the earlier run is ignored")
	require.Contains(t, late.IgnoreReason, "it answers run 0")
	sagatest.ExpectCommand(s, charge)
	sagatest.ReplySuccess(s, charge, ChargeReply{PaymentID: "p-2"})
	sagatest.ExpectCommand(s, notify)
	sagatest.ReplySuccess(s, notify, saga.None{})
	sagatest.ExpectCommand(s, ship)
	sagatest.ReplySuccess(s, ship, ShipReply{ShipmentID: "s-2"})
	s.RequireStatus(saga.StatusCompleted)
}

func TestRestartAFailedSagaFromAStep(t *testing.T) {
	t.Parallel()
	s := sagatest.New(t, checkout)
	failedAtShip(t, s)
	// charge-card's refund failed, so its charge stands: re-run the saga
	// from the step after it.
	s.Restart("notify-customer", "bob", "")
	inst := s.Instance()
	require.Equal(t, saga.StepSucceeded, inst.Steps[0].Status, "the steps before are kept")
	require.Equal(t, saga.StepCompensationFailed, inst.Steps[1].Status)
	require.Equal(t, saga.StepRunning, inst.Steps[2].Status)
	require.Equal(t, saga.StepPending, inst.Steps[3].Status)
	require.Equal(t, "p-1", s.Data().PaymentID, "the data as stored")
}

func TestRestartRefusals(t *testing.T) {
	t.Parallel()
	v2 := saga.MustNew("checkout", 2, reserveStep(), chargeStep(), shipStep())
	other := saga.MustNew("checkout", 2, chargeStep(), reserveStep())
	for _, tc := range []struct {
		name  string
		drive func(s *sagatest.Scenario[Order])
		def   *saga.Definition[Order]
		from  string
		want  string
	}{
		{name: "running saga", drive: func(s *sagatest.Scenario[Order]) { completeReserve(t, s) }, from: "reserve-stock",
			want: "only a failed or compensated saga can be restarted, this one is running"},
		{name: "step before was compensated", drive: func(s *sagatest.Scenario[Order]) { compensatedAtCharge(t, s) }, from: "charge-card",
			want: `step "reserve-stock" before "charge-card" is compensated, so its action is not in effect; restart from it or an earlier step`},
		{name: "no such step", drive: func(s *sagatest.Scenario[Order]) { compensatedAtCharge(t, s) }, from: "pack",
			want: `has no step or parallel group "pack"`},
		{name: "version whose earlier steps differ", drive: func(s *sagatest.Scenario[Order]) { failedAtShip(t, s) }, def: other, from: "reserve-stock",
			want: `step 0 of checkout v2 is "charge-card", which the saga (version 1) did not run at that place`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := sagatest.New(t, checkout)
			tc.drive(s)
			if tc.def != nil {
				s = sagatest.Restarted(s, tc.def)
			}
			before := s.Instance()
			_, err := s.Apply(saga.Event{Kind: saga.EventRestart, Step: tc.from})
			require.ErrorIs(t, err, saga.ErrInvalidTransition)
			require.ErrorContains(t, err, tc.want)
			require.Equal(t, before, s.Instance())
		})
	}
	t.Run("older version", func(t *testing.T) {
		t.Parallel()
		s := sagatest.New(t, v2)
		s.Start(Order{ID: "o-1"})
		s.Next()
		s.ReplyFailure("no stock")
		s.RequireStatus(saga.StatusCompensated)
		old := sagatest.Restarted(s, checkout)
		_, err := old.Apply(saga.Event{Kind: saga.EventRestart, Step: "reserve-stock"})
		require.ErrorIs(t, err, saga.ErrInvalidTransition)
		require.ErrorContains(t, err, "it runs version 2; it cannot restart on the older checkout v1")
	})
	t.Run("replacement data that does not fit the type", func(t *testing.T) {
		t.Parallel()
		s := sagatest.New(t, checkout)
		compensatedAtCharge(t, s)
		_, err := s.Apply(saga.Event{Kind: saga.EventRestart, Step: "reserve-stock", Payload: []byte(`{"id":"o-1","amout":5}`)})
		require.ErrorIs(t, err, saga.ErrInvalidPayload)
		require.ErrorContains(t, err, `unknown field "amout"`)
	})
}

func TestRestartOnANewerVersionWithNewData(t *testing.T) {
	t.Parallel()
	s := sagatest.New(t, checkout)
	compensatedAtCharge(t, s)
	v2 := saga.MustNew("checkout", 2, reserveStep(), chargeStep(), shipStep())
	s2 := sagatest.Restarted(s, v2)
	res := s2.RestartWithData("reserve-stock", Order{ID: "o-1", Amount: 20}, "alice", "smaller order")
	require.Contains(t, res.History[0].Detail, "definition version 2, was 1; data replaced by the operator")
	inst := s2.Instance()
	require.Equal(t, 2, inst.Version)
	require.Len(t, inst.Steps, 3)
	completeReserveAgain := sagatest.ExpectCommand(s2, reserve)
	require.Equal(t, ReserveReq{OrderID: "o-1"}, completeReserveAgain)
	sagatest.ReplySuccess(s2, reserve, ReserveReply{ReservationID: "r-2"})
	require.Equal(t, ChargeReq{OrderID: "o-1", Amount: 20}, sagatest.ExpectCommand(s2, charge))
}

func TestRestartFromABranchRestartsItsGroup(t *testing.T) {
	t.Parallel()
	s, shipMsg, awardMsg := fulfilling(t, parallelCheckout(parallelShip(), awardStep()))
	sagatest.ReplySuccessTo(s, shipMsg, ship, ShipReply{ShipmentID: "s-1"})
	s.ReplyFailureTo(awardMsg, "no account")
	s.Next()
	s.ReplyFailure("parcel gone") // cancel-ship fails: the saga is failed
	s.RequireStatus(saga.StatusFailed)
	res := s.Restart("award-points", "alice", "account opened")
	require.Equal(t, []string{"shipping.ship", "loyalty.award"}, types(res.Emit))
	require.Equal(t, 1, res.Emit[0].Run)
}
