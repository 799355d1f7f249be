package saga_test

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/saga/sagatest"
)

// The parallel fixture: reserve-stock, then the group "fulfil" of ship
// (cancel) and award-points (revoke), then notify-customer.

type AwardReq struct {
	OrderID string `json:"order_id"`
}

type AwardReply struct {
	Points int `json:"points"`
}

type RevokeReq struct {
	OrderID string `json:"order_id"`
	Points  int    `json:"points"`
}

var (
	award  = saga.NewCommand[AwardReq, AwardReply]("loyalty.award")
	revoke = saga.NewCommand[RevokeReq, saga.None]("loyalty.revoke")
)

const awardTimeout = 5 * time.Second

// parallelShip is shipStep whose reply also notes "shipped", so that the
// order of the branches' success functions shows in Notes.
func parallelShip(opts ...saga.StepOption[Order]) *saga.StepSpec[Order] {
	base := []saga.StepOption[Order]{
		saga.Invoke(ship,
			func(d *Order) ShipReq { return ShipReq{OrderID: d.ID} },
			func(d *Order, r ShipReply) { d.ShipmentID = r.ShipmentID; d.Notes = append(d.Notes, "shipped") }),
		saga.Compensate(cancelShip, func(d *Order) CancelShipReq { return CancelShipReq{ShipmentID: d.ShipmentID} }),
	}
	return saga.Step("ship", append(base, opts...)...)
}

func awardStep(opts ...saga.StepOption[Order]) *saga.StepSpec[Order] {
	base := []saga.StepOption[Order]{
		saga.Invoke(award,
			func(d *Order) AwardReq { return AwardReq{OrderID: d.ID} },
			func(d *Order, r AwardReply) {
				d.Notes = append(d.Notes, "points")
				d.Amount += r.Points // anything the other branch does not touch
			}),
		saga.Compensate(revoke, func(d *Order) RevokeReq { return RevokeReq{OrderID: d.ID, Points: d.Amount} }),
		saga.WithTimeout[Order](awardTimeout),
		saga.WithRetry[Order](saga.RetryPolicy{MaxAttempts: 2, InitialInterval: time.Second}),
	}
	return saga.Step("award-points", append(base, opts...)...)
}

func parallelCheckout(ship, award *saga.StepSpec[Order]) *saga.Definition[Order] {
	return saga.MustNew("parallel-checkout", 1, reserveStep(), saga.Parallel("fulfil", ship, award), notifyStep())
}

// fulfilling starts a saga of def and completes reserve-stock: both
// branches are in flight. It returns their commands, ship's first.
func fulfilling(t *testing.T, def *saga.Definition[Order]) (s *sagatest.Scenario[Order], shipMsg, awardMsg saga.Outgoing) {
	t.Helper()
	s = sagatest.New(t, def)
	completeReserve(t, s)
	pending := s.Pending()
	require.Len(t, pending, 2, "both branches are sent at once")
	shipMsg, awardMsg = s.Next(), s.Next()
	require.Equal(t, []string{"shipping.ship", "loyalty.award"}, []string{shipMsg.Type, awardMsg.Type})
	return s, shipMsg, awardMsg
}

func TestParallelGroupForksAndJoinsInDeclarationOrder(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		awardFirst bool
	}{{"replies in declaration order", false}, {"replies in reverse order", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, shipMsg, awardMsg := fulfilling(t, parallelCheckout(parallelShip(), awardStep()))
			require.Equal(t, 1, s.Instance().CurrentStep, "the group's first branch is the current step")
			require.Equal(t, awardMsg.StepIndex, shipMsg.StepIndex+1)
			for _, name := range []string{"ship", "award-points"} {
				s.RequireStepStatus(name, saga.StepRunning)
				require.Equal(t, "fulfil", s.Instance().Steps[stepIndex(s.Instance(), name)].Group)
			}
			first, second := func() saga.Result { return sagatest.ReplySuccessTo(s, shipMsg, ship, ShipReply{ShipmentID: "s-1"}) },
				func() saga.Result { return sagatest.ReplySuccessTo(s, awardMsg, award, AwardReply{Points: 5}) }
			if tc.awardFirst {
				first, second = second, first
			}
			res := first()
			require.Empty(t, res.Emit, "the group waits for its other branch")
			require.Empty(t, s.Data().Notes, "a branch's reply is held until the join")
			require.Equal(t, saga.StatusRunning, s.Status())
			res = second()
			require.Equal(t, []string{"shipped", "points"}, s.Data().Notes, "success functions run in declaration order")
			require.Equal(t, "s-1", s.Data().ShipmentID)
			require.Equal(t, 35, s.Data().Amount)
			require.Contains(t, events(res.History), saga.HistoryGroupJoined)
			for _, st := range s.Instance().Steps {
				require.Nil(t, st.Reply, "held replies are dropped at the join")
			}
			sagatest.ExpectCommand(s, notify)
			sagatest.ReplySuccess(s, notify, saga.None{})
			s.RequireStatus(saga.StatusCompleted)
		})
	}
}

func TestParallelBranchRejected(t *testing.T) {
	t.Parallel()
	t.Run("while the other branch is in flight", func(t *testing.T) {
		t.Parallel()
		s, shipMsg, awardMsg := fulfilling(t, parallelCheckout(parallelShip(), awardStep()))
		res := s.ReplyFailureTo(awardMsg, "customer has no loyalty account")
		require.Len(t, res.Emit, 1)
		require.Equal(t, saga.Outgoing{
			Type: "shipping.cancel", Phase: saga.PhaseCompensation, Step: "ship", StepIndex: 1, Attempt: 1, Payload: []byte(`{"shipment_id":""}`),
		}, res.Emit[0], "the branch in flight is compensated through the barrier")
		s.RequireStepStatus("award-points", saga.StepRejected)
		s.RequireStepStatus("ship", saga.StepCompensating)
		require.Equal(t, "customer has no loyalty account", s.Instance().LastError)
		late := sagatest.ReplySuccessTo(s, shipMsg, ship, ShipReply{ShipmentID: "s-1"})
		require.True(t, late.Ignored, "the late action reply of an abandoned branch is ignored")
		s.Next()
		sagatest.ReplySuccess(s, cancelShip, saga.None{})
		require.Equal(t, ReleaseReq{ReservationID: "r-1"}, sagatest.ExpectCompensation(s, release))
		sagatest.ReplySuccess(s, release, saga.None{})
		s.RequireStatus(saga.StatusCompensated)
	})
	t.Run("after the other branch succeeded", func(t *testing.T) {
		t.Parallel()
		s, shipMsg, awardMsg := fulfilling(t, parallelCheckout(parallelShip(), awardStep()))
		sagatest.ReplySuccessTo(s, shipMsg, ship, ShipReply{ShipmentID: "s-1"})
		s.ReplyFailureTo(awardMsg, "no account")
		require.Equal(t, []string{"shipped"}, s.Data().Notes, "the succeeded branch's reply is applied before compensating")
		require.Equal(t, CancelShipReq{ShipmentID: "s-1"}, sagatest.ExpectCompensation(s, cancelShip), "its compensation sees its reply")
		s.RequireNoMessage()
		sagatest.ReplySuccess(s, cancelShip, saga.None{})
		sagatest.ExpectCompensation(s, release)
	})
	t.Run("in flight without a compensation", func(t *testing.T) {
		t.Parallel()
		s := sagatest.New(t, saga.MustNew("notify-and-award", 1, reserveStep(), saga.Parallel("fulfil", notifyStep(), awardStep())))
		completeReserve(t, s)
		sagatest.ExpectCommand(s, notify)
		sagatest.ExpectCommand(s, award)
		res := s.ReplyFailure("no account")
		s.RequireStepStatus("notify-customer", saga.StepAborted)
		require.Equal(t, "inventory.release", res.Emit[0].Type, "nothing to compensate in the group: the earlier steps are")
	})
}

func TestParallelGroupCompensatesBranchesTogether(t *testing.T) {
	t.Parallel()
	def := saga.MustNew("parallel-then-charge", 1, reserveStep(), saga.Parallel("fulfil", parallelShip(), awardStep()), chargeStep())
	s, shipMsg, awardMsg := fulfilling(t, def)
	sagatest.ReplySuccessTo(s, awardMsg, award, AwardReply{Points: 5})
	sagatest.ReplySuccessTo(s, shipMsg, ship, ShipReply{ShipmentID: "s-1"})
	sagatest.ExpectCommand(s, charge)
	res := s.ReplyFailure("declined")
	require.Equal(t, []string{"shipping.cancel", "loyalty.revoke"}, types(res.Emit), "the branches' compensations are sent at once")
	require.Equal(t, 1, s.Instance().CurrentStep)
	cancelMsg, revokeMsg := s.Next(), s.Next()
	require.Empty(t, sagatest.ReplySuccessTo(s, revokeMsg, revoke, saga.None{}).Emit, "the group waits for its other compensation")
	s.RequireStatus(saga.StatusCompensating)
	res = sagatest.ReplySuccessTo(s, cancelMsg, cancelShip, saga.None{})
	require.Equal(t, []string{"inventory.release"}, types(res.Emit), "then the steps before the group")
	sagatest.ExpectCompensation(s, release)
	sagatest.ReplySuccess(s, release, saga.None{})
	s.RequireStatus(saga.StatusCompensated)
	require.Equal(t, "declined", s.Instance().LastError)
}

func TestParallelCompensationFailureWaitsForTheOthers(t *testing.T) {
	t.Parallel()
	def := saga.MustNew("parallel-then-charge", 1, reserveStep(), saga.Parallel("fulfil", parallelShip(), awardStep()), chargeStep())
	s, shipMsg, awardMsg := fulfilling(t, def)
	sagatest.ReplySuccessTo(s, awardMsg, award, AwardReply{Points: 5})
	sagatest.ReplySuccessTo(s, shipMsg, ship, ShipReply{ShipmentID: "s-1"})
	sagatest.ExpectCommand(s, charge)
	s.ReplyFailure("declined")
	cancelMsg, revokeMsg := s.Next(), s.Next()
	s.ReplyFailureTo(cancelMsg, "parcel already handed over")
	s.RequireStatus(saga.StatusCompensating)
	s.RequireStepStatus("ship", saga.StepCompensationFailed)
	sagatest.ReplySuccessTo(s, revokeMsg, revoke, saga.None{})
	s.RequireStatus(saga.StatusFailed)
	require.Equal(t, "parcel already handed over", s.Instance().LastError)
	require.Equal(t, saga.HistoryFailed, s.History()[len(s.History())-1].Event)

	res := s.Retry("alice", "courier found the parcel")
	require.Equal(t, []saga.Outgoing{{
		Type: "shipping.cancel", Phase: saga.PhaseCompensation, Step: "ship", StepIndex: 1, Attempt: 2, Payload: []byte(`{"shipment_id":"s-1"}`),
	}}, res.Emit, "a retry re-sends only the failed compensation")
	s.RequireStatus(saga.StatusCompensating)
	require.Equal(t, "declined", s.Instance().LastError)
	sagatest.ExpectCompensation(s, cancelShip)
	sagatest.ReplySuccess(s, cancelShip, saga.None{})
	sagatest.ExpectCompensation(s, release)
}

func TestParallelBranchTimeouts(t *testing.T) {
	t.Parallel()
	t.Run("a branch retries on its own policy", func(t *testing.T) {
		t.Parallel()
		s, shipMsg, _ := fulfilling(t, parallelCheckout(parallelShip(), awardStep()))
		s.Advance(awardTimeout)
		s.RequireStepStatus("award-points", saga.StepWaitingRetry)
		s.RequireStepStatus("ship", saga.StepRunning)
		s.Advance(time.Second)
		resent := s.Next()
		require.Equal(t, saga.Outgoing{
			Type: "loyalty.award", Phase: saga.PhaseAction, Step: "award-points", StepIndex: 2, Attempt: 2, Payload: []byte(`{"order_id":"o-1"}`),
		}, resent)
		sagatest.ReplySuccessTo(s, resent, award, AwardReply{Points: 1})
		sagatest.ReplySuccessTo(s, shipMsg, ship, ShipReply{ShipmentID: "s-1"})
		sagatest.ExpectCommand(s, notify)
	})
	t.Run("an exhausted branch unwinds the group", func(t *testing.T) {
		t.Parallel()
		s, shipMsg, _ := fulfilling(t, parallelCheckout(parallelShip(), awardStep()))
		sagatest.ReplySuccessTo(s, shipMsg, ship, ShipReply{ShipmentID: "s-1"})
		s.Advance(awardTimeout + time.Second)
		s.Next() // attempt 2
		res := s.Deliver(saga.Event{Kind: saga.EventTimer, At: s.Now().Add(awardTimeout)})
		require.Equal(t, []string{"shipping.cancel", "loyalty.revoke"}, types(res.Emit),
			"the succeeded branch and the timed-out one (it may have run) are compensated at once")
		require.Equal(t, `step "award-points" timed out after 2 attempt(s) of 5s`, s.Instance().LastError)
	})
	t.Run("two deadlines due in one timer", func(t *testing.T) {
		t.Parallel()
		slowShip := parallelShip(saga.WithTimeout[Order](awardTimeout), saga.WithRetry[Order](saga.RetryPolicy{MaxAttempts: 2}))
		s, _, _ := fulfilling(t, parallelCheckout(slowShip, awardStep()))
		res := s.Deliver(saga.Event{Kind: saga.EventTimer, At: s.Now().Add(awardTimeout)})
		require.Equal(t, []saga.HistoryEvent{saga.HistoryTimedOut, saga.HistoryRetryScheduled, saga.HistoryTimedOut, saga.HistoryRetryScheduled}, events(res.History))
		s.RequireStepStatus("ship", saga.StepWaitingRetry)
		s.RequireStepStatus("award-points", saga.StepWaitingRetry)
	})
	t.Run("an early timer is ignored", func(t *testing.T) {
		t.Parallel()
		s, _, _ := fulfilling(t, parallelCheckout(parallelShip(), awardStep()))
		res := s.Deliver(saga.Event{Kind: saga.EventTimer, At: s.Now().Add(time.Second)})
		require.True(t, res.Ignored)
		require.Contains(t, res.IgnoreReason, `group "fulfil" deadline`)
	})
}

func TestParallelGroupOperatorActions(t *testing.T) {
	t.Parallel()
	t.Run("cancel compensates every branch", func(t *testing.T) {
		t.Parallel()
		s, shipMsg, _ := fulfilling(t, parallelCheckout(parallelShip(), awardStep()))
		sagatest.ReplySuccessTo(s, shipMsg, ship, ShipReply{ShipmentID: "s-1"})
		res := s.Cancel("alice", "customer called")
		require.Equal(t, []string{"shipping.cancel", "loyalty.revoke"}, types(res.Emit))
		require.Equal(t, "cancelled by alice: customer called", s.Instance().LastError)
	})
	t.Run("retry re-sends every branch in flight", func(t *testing.T) {
		t.Parallel()
		s, shipMsg, _ := fulfilling(t, parallelCheckout(parallelShip(), awardStep()))
		sagatest.ReplySuccessTo(s, shipMsg, ship, ShipReply{ShipmentID: "s-1"})
		res := s.Retry("alice", "")
		require.Equal(t, []string{"loyalty.award"}, types(res.Emit))
		require.Equal(t, 2, res.Emit[0].Attempt)
	})
	t.Run("terminate stops every branch", func(t *testing.T) {
		t.Parallel()
		s, _, _ := fulfilling(t, parallelCheckout(parallelShip(), awardStep()))
		res := s.Terminate("alice", "fraud")
		require.Empty(t, res.Emit)
		s.RequireStatus(saga.StatusTerminated)
		s.RequireStepStatus("ship", saga.StepTerminated)
		s.RequireStepStatus("award-points", saga.StepTerminated)
		require.True(t, s.Instance().Deadline.IsZero())
	})
}

func TestParallelGroupSkipsAndStaleReplies(t *testing.T) {
	t.Parallel()
	never := saga.When(func(*Order) bool { return false })
	t.Run("a skipped branch", func(t *testing.T) {
		t.Parallel()
		s := sagatest.New(t, parallelCheckout(parallelShip(), awardStep(never)))
		completeReserve(t, s)
		s.RequireStepStatus("award-points", saga.StepSkipped)
		sagatest.ExpectCommand(s, ship)
		sagatest.ReplySuccess(s, ship, ShipReply{ShipmentID: "s-1"})
		sagatest.ExpectCommand(s, notify)
	})
	t.Run("a group of one branch joins too", func(t *testing.T) {
		t.Parallel()
		s := sagatest.New(t, saga.MustNew("single", 1, reserveStep(), saga.Parallel("fulfil", parallelShip()), notifyStep()))
		completeReserve(t, s)
		sagatest.ExpectCommand(s, ship)
		res := sagatest.ReplySuccess(s, ship, ShipReply{ShipmentID: "s-1"})
		require.Contains(t, events(res.History), saga.HistoryGroupJoined)
		sagatest.ExpectCommand(s, notify)
	})
	t.Run("every branch skipped", func(t *testing.T) {
		t.Parallel()
		s := sagatest.New(t, parallelCheckout(parallelShip(never), awardStep(never)))
		completeReserve(t, s)
		sagatest.ExpectCommand(s, notify)
		h := s.History()
		joined := slices.IndexFunc(h, func(e saga.HistoryEntry) bool { return e.Event == saga.HistoryGroupJoined })
		require.GreaterOrEqual(t, joined, 2, "a group whose branches were all skipped has joined: %v", events(h))
		require.Equal(t, "fulfil", h[joined].Detail)
		require.Equal(t, []saga.HistoryEvent{saga.HistoryStepSkipped, saga.HistoryStepSkipped}, events(h[joined-2:joined]),
			"it joins after its branches were skipped")
	})
	t.Run("a duplicate reply of a branch", func(t *testing.T) {
		t.Parallel()
		s, shipMsg, _ := fulfilling(t, parallelCheckout(parallelShip(), awardStep()))
		sagatest.ReplySuccessTo(s, shipMsg, ship, ShipReply{ShipmentID: "s-1"})
		res := sagatest.ReplySuccessTo(s, shipMsg, ship, ShipReply{ShipmentID: "s-2"})
		require.True(t, res.Ignored)
		require.Contains(t, res.IgnoreReason, "the step is succeeded")
	})
	t.Run("a reply for a step outside the group", func(t *testing.T) {
		t.Parallel()
		s, _, _ := fulfilling(t, parallelCheckout(parallelShip(), awardStep()))
		res := s.Deliver(saga.Event{Kind: saga.EventReplySuccess, Type: "inventory.reserve", Step: "reserve-stock", StepIndex: 0, Attempt: 1, Payload: []byte(`{"reservation_id":"r"}`)})
		require.True(t, res.Ignored)
		require.Contains(t, res.IgnoreReason, `the current steps are those of group "fulfil" (indices 1 to 2)`)
	})
	t.Run("a malformed branch reply is an error at once", func(t *testing.T) {
		t.Parallel()
		s, shipMsg, _ := fulfilling(t, parallelCheckout(parallelShip(), awardStep()))
		_, err := s.Apply(saga.Event{Kind: saga.EventReplySuccess, Type: shipMsg.Type, Step: shipMsg.Step, StepIndex: shipMsg.StepIndex, Attempt: 1, Payload: []byte(`{"unknown":1}`)})
		require.ErrorIs(t, err, saga.ErrInvalidPayload)
	})
}

func TestParallelGroupValidation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		steps []*saga.StepSpec[Order]
		want  string
	}{
		{"no branches", []*saga.StepSpec[Order]{saga.Parallel[Order]("g")}, `parallel group "g" has no branches`},
		{"empty name", []*saga.StepSpec[Order]{saga.Parallel("", shipStep())}, "parallel group before step index 0 has an empty name"},
		{"local branch", []*saga.StepSpec[Order]{saga.Parallel("g", shipStep(), saga.LocalStep("l", noop))}, `step "l" (index 1, group "g"): a local step cannot be a parallel branch`},
		{"wait branch", []*saga.StepSpec[Order]{saga.Parallel("g", shipStep(), saga.WaitEvent[Order]("w", saga.NewEventType[saga.None]("e"), nil))}, `step "w" (index 1, group "g"): a wait step cannot be a parallel branch`},
		{"nested group", []*saga.StepSpec[Order]{saga.Parallel("g", shipStep(), saga.Parallel("h", notifyStep()))}, "a parallel group cannot be a branch of another one"},
		{"group named like a step", []*saga.StepSpec[Order]{reserveStep(), saga.Parallel("reserve-stock", shipStep())}, `parallel group "reserve-stock" has the same name as step 0`},
		{"branch named like a step", []*saga.StepSpec[Order]{shipStep(), saga.Parallel("g", shipStep())}, `step "ship" (index 1, group "g") has the same name as step 0`},
		{"invalid branch", []*saga.StepSpec[Order]{saga.Parallel("g", saga.Step[Order]("x"))}, `step "x" (index 0, group "g"): no action`},
		{"control character in a step name", []*saga.StepSpec[Order]{saga.Step("ship\x1f1", saga.Invoke(ship, func(*Order) ShipReq { return ShipReq{} }, nil))}, `step "ship\x1f1" (index 0): the name contains a control character`},
		{"control character in a group name", []*saga.StepSpec[Order]{saga.Parallel("g\n", shipStep())}, `parallel group "g\n": the name contains a control character`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := saga.New("s", 1, tc.steps...)
			require.ErrorIs(t, err, saga.ErrInvalidDefinition)
			require.ErrorContains(t, err, tc.want)
		})
	}
	def := parallelCheckout(parallelShip(), awardStep())
	require.Equal(t, []string{"", "fulfil", "fulfil", ""}, func() []string {
		var groups []string
		for _, info := range def.Steps() {
			groups = append(groups, info.Group)
		}
		return groups
	}())
}

func types(out []saga.Outgoing) []string {
	var ts []string
	for _, o := range out {
		ts = append(ts, o.Type)
	}
	return slices.Clip(ts)
}

// Regressions found in review: what one transition of a group decides.
func TestParallelGroupEdgeCases(t *testing.T) {
	t.Parallel()
	t.Run("an aborted branch keeps why, so a retried saga's reason is the cause", func(t *testing.T) {
		t.Parallel()
		s := sagatest.New(t, saga.MustNew("notify-and-award", 1, reserveStep(), saga.Parallel("fulfil", notifyStep(), awardStep())))
		completeReserve(t, s)
		s.Next()
		s.ReplyFailureTo(s.Next(), "no account")
		s.RequireStepStatus("notify-customer", saga.StepAborted)
		require.Equal(t, "no account", s.Instance().Steps[1].LastError)
		sagatest.ExpectCompensation(s, release)
		s.ReplyFailure("warehouse offline")
		s.Retry("alice", "")
		sagatest.ExpectCompensation(s, release)
		sagatest.ReplySuccess(s, release, saga.None{})
		s.RequireStatus(saga.StatusCompensated)
		require.Equal(t, "no account", s.Instance().LastError)
	})
	t.Run("a branch out of attempts is handled alone: no sibling re-sent in the transition that abandons it", func(t *testing.T) {
		t.Parallel()
		slowShip := parallelShip(saga.WithTimeout[Order](4*time.Second), saga.WithRetry[Order](saga.RetryPolicy{MaxAttempts: 3, InitialInterval: 7 * time.Second}))
		s, _, _ := fulfilling(t, parallelCheckout(slowShip, awardStep()))
		t0 := s.Now()
		for _, at := range []time.Duration{4 * time.Second, 5 * time.Second, 6 * time.Second} {
			s.Deliver(saga.Event{Kind: saga.EventTimer, At: t0.Add(at)})
		}
		for len(s.Pending()) > 0 {
			s.Next()
		}
		// At 11 s ship's retry is due and award's last attempt expires.
		res := s.Deliver(saga.Event{Kind: saga.EventTimer, At: t0.Add(11 * time.Second)})
		require.Equal(t, []string{"shipping.cancel", "loyalty.revoke"}, types(res.Emit),
			"ship is not re-sent; its first attempt may have run, so it is compensated with award-points")
		require.NotContains(t, events(res.History), saga.HistoryCommandSent)
	})
	t.Run("terminate keeps what the succeeded branches replied", func(t *testing.T) {
		t.Parallel()
		s, shipMsg, _ := fulfilling(t, parallelCheckout(parallelShip(), awardStep()))
		sagatest.ReplySuccessTo(s, shipMsg, ship, ShipReply{ShipmentID: "s-1"})
		s.Terminate("alice", "fraud")
		require.Equal(t, "s-1", s.Data().ShipmentID)
		require.Nil(t, s.Instance().Steps[1].Reply)
	})
	t.Run("a restart onto a version that groups the kept steps names their group", func(t *testing.T) {
		t.Parallel()
		v1 := saga.MustNew("g", 1, reserveStep(), parallelShip(), awardStep(), chargeStep())
		v2 := saga.MustNew("g", 2, reserveStep(), saga.Parallel("fulfil", parallelShip(), awardStep()), chargeStep())
		s := sagatest.New(t, v1)
		completeReserve(t, s)
		s.Next()
		sagatest.ReplySuccess(s, ship, ShipReply{ShipmentID: "s"})
		s.Next()
		sagatest.ReplySuccess(s, award, AwardReply{Points: 1})
		sagatest.ExpectCommand(s, charge)
		s.ReplyFailure("declined")
		sagatest.ExpectCompensation(s, revoke)
		s.ReplyFailure("nope")
		s.RequireStatus(saga.StatusFailed)
		s2 := sagatest.Restarted(s, v2)
		s2.Restart("charge-card", "a", "")
		require.Equal(t, []string{"", "fulfil", "fulfil", ""}, func() []string {
			var g []string
			for _, st := range s2.Instance().Steps {
				g = append(g, st.Group)
			}
			return g
		}())
	})
	t.Run("cancel is recorded at the first branch in flight", func(t *testing.T) {
		t.Parallel()
		s, shipMsg, _ := fulfilling(t, parallelCheckout(parallelShip(), awardStep()))
		sagatest.ReplySuccessTo(s, shipMsg, ship, ShipReply{ShipmentID: "s-1"})
		res := s.Cancel("alice", "x")
		require.Equal(t, "award-points", res.History[0].Step)
	})
}
