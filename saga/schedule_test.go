package saga_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/saga/sagatest"
)

const startTimeout = time.Minute

// withStart is the schedule-to-start timeout the tests give a step.
func withStart() saga.StepOption[Order] { return saga.WithScheduleToStartTimeout[Order](startTimeout) }

// An action that stays unpublished past its schedule-to-start timeout
// counts as timed out at once, retries left or not: the command is
// withdrawn and the step compensated through the barrier.
func TestScheduleToStartActionTimesOut(t *testing.T) {
	t.Parallel()
	def := saga.MustNew("checkout", 1, reserveStep(withStart()), chargeStep())
	s := sagatest.New(t, def)
	s.HoldPublishing()
	s.Start(Order{ID: "o-1", Amount: 30})
	require.Equal(t, sagatest.Epoch.Add(startTimeout), s.Instance().Steps[0].StartBy)
	require.Equal(t, sagatest.Epoch.Add(reserveTimeout), s.Instance().Deadline, "the earliest of the deadline and StartBy")

	// The step's own timeout does not fire while its command is
	// unpublished, nor before the schedule-to-start timeout.
	s.Advance(startTimeout - time.Second)
	s.RequireStepStatus("reserve-stock", saga.StepRunning)
	require.Len(t, s.History(), 2, "started, command-sent")

	before := len(s.History())
	s.Advance(time.Second)
	s.RequireStatus(saga.StatusCompensating)
	st := s.Instance().Steps[0]
	require.Equal(t, saga.StepCompensating, st.Status)
	require.Equal(t, 1, st.Attempt, "no re-send: it would wait behind the first")
	require.Contains(t, s.Instance().LastError, `command "inventory.reserve" not published within 1m0s (schedule-to-start timeout)`)
	require.Equal(t, []saga.HistoryEvent{saga.HistoryTimedOut, saga.HistoryCompensationSent}, events(s.History()[before:]))
	require.Equal(t, "not published within 1m0s (schedule-to-start timeout)", s.History()[before].Detail)

	// The command was withdrawn (never delivered); the compensation goes
	// through the barrier, in case it went out at the last moment, and
	// has its own schedule-to-start timeout.
	require.Equal(t, []saga.MessageRef{{StepIndex: 0, Phase: saga.PhaseCompensation, Attempt: 1}}, s.Unpublished())
	require.Equal(t, ReleaseReq{}, sagatest.ExpectCompensation(s, release))
	require.Equal(t, s.Now().Add(startTimeout), s.Instance().Steps[0].StartBy)
	s.Publish()
	require.True(t, s.Instance().Steps[0].StartBy.After(s.Now()), "not cleared before a timer finds it published")
	sagatest.ReplySuccess(s, release, saga.None{})
	s.RequireStatus(saga.StatusCompensated)
	require.Zero(t, s.Instance().Deadline)
}

// Apply names what the saga withdraws: every unpublished action of the
// span it unwinds, and nothing else.
func TestScheduleToStartWithdrawsTheUnpublishedActions(t *testing.T) {
	t.Parallel()
	const timeout = 2 * time.Minute
	def := saga.MustNew("checkout", 1, reserveStep(withStart(), saga.WithTimeout[Order](timeout)))
	res, err := def.Start(t.Context(), uuid.New(), mustJSON(t, Order{ID: "o-1"}), sagatest.Epoch)
	require.NoError(t, err)
	unpublished := []saga.MessageRef{
		{StepIndex: 0, Phase: saga.PhaseAction, Attempt: 1},
		{StepIndex: 7, Phase: saga.PhaseAction, Attempt: 1}, // another span: not the step's
	}
	require.Equal(t, sagatest.Epoch.Add(startTimeout), res.Instance.Deadline)
	early, err := def.Apply(t.Context(), res.Instance, saga.Event{Kind: saga.EventTimer, At: sagatest.Epoch.Add(startTimeout / 2), Unpublished: unpublished})
	require.NoError(t, err)
	require.True(t, early.Ignored, "the step's timeout waits for its command")
	require.Contains(t, early.IgnoreReason, "waits for 2 unpublished message(s)")
	held, err := def.Apply(t.Context(), res.Instance, saga.Event{Kind: saga.EventTimer, At: sagatest.Epoch.Add(startTimeout - time.Millisecond), Unpublished: unpublished})
	require.NoError(t, err)
	require.True(t, held.Ignored)

	due, err := def.Apply(t.Context(), res.Instance, saga.Event{Kind: saga.EventTimer, At: sagatest.Epoch.Add(startTimeout), Unpublished: unpublished})
	require.NoError(t, err)
	require.Equal(t, unpublished[:1], due.Withdraw)
	require.Equal(t, saga.StatusCompensating, due.Instance.Status)

	// Published by then: the timer only clears StartBy, and records nothing.
	published, err := def.Apply(t.Context(), res.Instance, saga.Event{Kind: saga.EventTimer, At: sagatest.Epoch.Add(startTimeout)})
	require.NoError(t, err)
	require.False(t, published.Ignored)
	require.Empty(t, published.History)
	require.Empty(t, published.Emit)
	require.Empty(t, published.Withdraw)
	require.Zero(t, published.Instance.Steps[0].StartBy)
	require.Equal(t, sagatest.Epoch.Add(timeout), published.Instance.Deadline)
}

// A command published late but within the timeout is not affected: its
// step's timeout counts from the publish, and its retries go on.
func TestScheduleToStartPublishedInTime(t *testing.T) {
	t.Parallel()
	def := saga.MustNew("checkout", 1, reserveStep(withStart()))
	s := sagatest.New(t, def)
	s.HoldPublishing()
	s.Start(Order{ID: "o-1"})
	s.Advance(40 * time.Second) // past the step's 30s timeout, unpublished
	s.RequireStepStatus("reserve-stock", saga.StepRunning)
	s.Publish()
	require.Equal(t, sagatest.Epoch.Add(40*time.Second+reserveTimeout), s.Instance().Steps[0].Deadline, "the timeout counts from the publish")

	s.Advance(startTimeout - 40*time.Second) // StartBy passes, the command is out
	s.RequireStepStatus("reserve-stock", saga.StepRunning)
	require.Zero(t, s.Instance().Steps[0].StartBy)
	require.Len(t, s.History(), 2, "started, command-sent: nothing for a timeout that did not expire")

	s.Advance(10 * time.Second) // the step's own timeout: a retry
	s.RequireStepStatus("reserve-stock", saga.StepWaitingRetry)
	s.Advance(time.Second)
	require.Equal(t, 2, s.Instance().Steps[0].Attempt)
	require.Equal(t, s.Now().Add(startTimeout), s.Instance().Steps[0].StartBy, "every attempt has the timeout")
}

// Without the option an unpublished command holds its saga for ever: no
// deadline fires (what the unpublished-overdue gauge and alert show).
func TestUnpublishedCommandWithoutScheduleToStartWaits(t *testing.T) {
	t.Parallel()
	s := sagatest.New(t, checkout)
	s.HoldPublishing()
	s.Start(Order{ID: "o-1"})
	s.Advance(24 * time.Hour)
	s.RequireStatus(saga.StatusRunning)
	s.RequireStepStatus("reserve-stock", saga.StepRunning)
	require.Equal(t, sagatest.Epoch.Add(reserveTimeout), s.Instance().Deadline, "past, and held by the unpublished command")
	s.Publish()
	require.Equal(t, s.Now().Add(reserveTimeout), s.Instance().Deadline)
}

// A compensation that stays unpublished past the timeout counts as failed:
// the saga fails for an operator, who retries it once it can go out.
func TestScheduleToStartCompensationFails(t *testing.T) {
	t.Parallel()
	def := saga.MustNew("checkout", 1, reserveStep(), chargeStep(withStart()), notifyStep())
	s := sagatest.New(t, def)
	completeReserve(t, s)
	sagatest.ExpectCommand(s, charge)
	sagatest.ReplySuccess(s, charge, ChargeReply{PaymentID: "p-1"})
	s.HoldPublishing(refund.Name())
	sagatest.ExpectCommand(s, notify)
	s.ReplyFailure("no such address")
	require.Equal(t, RefundReq{PaymentID: "p-1"}, sagatest.ExpectCompensation(s, refund))
	require.Len(t, s.Unpublished(), 1)

	s.Advance(startTimeout)
	s.RequireStatus(saga.StatusFailed)
	s.RequireStepStatus("charge-card", saga.StepCompensationFailed)
	require.Contains(t, s.Instance().LastError, `compensation "payment.refund" of step "charge-card" not published within 1m0s`)
	require.Equal(t, []saga.MessageRef{{StepIndex: 1, Phase: saga.PhaseCompensation, Attempt: 1}}, s.Unpublished(),
		"a compensation is never withdrawn: it goes out when it can")
	require.Zero(t, s.Instance().Deadline)

	s.Publish()
	s.Retry("ops", "payment is back")
	sagatest.ExpectCompensation(s, refund)
	sagatest.ReplySuccess(s, refund, saga.None{})
	sagatest.ExpectCompensation(s, release)
	sagatest.ReplySuccess(s, release, saga.None{})
	s.RequireStatus(saga.StatusCompensated)
}

// The scenario in the pure core: loyalty is not deployed, so
// neither loyalty.award nor loyalty.revoke is ever published. With the
// timeout the branch gives up, the shipment is cancelled, and the saga
// ends failed on the revoke, releasing its place; the step before is left
// for the operator's retry once loyalty runs.
func TestScheduleToStartParallelBranchNobodyTakes(t *testing.T) {
	t.Parallel()
	def := parallelCheckout(parallelShip(), awardStep(withStart()))
	s := sagatest.New(t, def)
	s.HoldPublishing(award.Name(), revoke.Name())
	completeReserve(t, s)
	shipMsg, awardMsg := s.Next(), s.Next()
	require.Equal(t, []string{"shipping.ship", "loyalty.award"}, []string{shipMsg.Type, awardMsg.Type})
	sagatest.ReplySuccessTo(s, shipMsg, ship, ShipReply{ShipmentID: "s-1"})

	s.Advance(startTimeout)
	s.RequireStatus(saga.StatusCompensating)
	s.RequireStepStatus("award-points", saga.StepCompensating)
	s.RequireStepStatus("ship", saga.StepCompensating)
	require.Equal(t, []saga.MessageRef{{StepIndex: 2, Phase: saga.PhaseCompensation, Attempt: 1}}, s.Unpublished(), "award withdrawn, revoke held")
	sagatest.ExpectCompensation(s, cancelShip)
	sagatest.ReplySuccess(s, cancelShip, saga.None{})
	require.Equal(t, RevokeReq{OrderID: "o-1", Points: 30}, sagatest.ExpectCompensation(s, revoke))
	s.RequireStatus(saga.StatusCompensating)

	s.Advance(startTimeout)
	s.RequireStatus(saga.StatusFailed)
	s.RequireStepStatus("award-points", saga.StepCompensationFailed)
	s.RequireStepStatus("ship", saga.StepCompensated)
	s.RequireStepStatus("reserve-stock", saga.StepSucceeded)
}

// A branch without the option keeps its own deadline; a deadline does not
// fire while a sibling's command is unpublished.
func TestScheduleToStartOnlyTheBranchThatHasIt(t *testing.T) {
	t.Parallel()
	def := parallelCheckout(parallelShip(saga.WithTimeout[Order](10*time.Second)), awardStep(withStart()))
	s := sagatest.New(t, def)
	s.HoldPublishing(award.Name())
	completeReserve(t, s)
	s.Next()
	s.Next()
	s.Advance(startTimeout - time.Second)
	s.RequireStepStatus("ship", saga.StepRunning)
	s.RequireStepStatus("award-points", saga.StepRunning)
	s.Advance(time.Second)
	s.RequireStepStatus("award-points", saga.StepCompensating)
	s.RequireStepStatus("ship", saga.StepCompensating)
}

func TestScheduleToStartValidation(t *testing.T) {
	t.Parallel()
	_, err := saga.New("bad", 1,
		reserveStep(saga.WithScheduleToStartTimeout[Order](0)),
		saga.LocalStep("local", func(_ context.Context, _ *Order) error { return nil }, withStart()),
		saga.WaitEvent("wait", saga.NewEventType[ReserveReply]("stock.arrived"), func(*Order, ReserveReply) {}, withStart()),
	)
	require.ErrorIs(t, err, saga.ErrInvalidDefinition)
	require.ErrorContains(t, err, `step "reserve-stock" (index 0): schedule-to-start timeout 0s is not positive`)
	require.ErrorContains(t, err, `step "local" (index 1): a local step sends no command`)
	require.ErrorContains(t, err, `step "wait" (index 2): a wait step sends no command`)

	// A local step's compensation is a command: it may have one.
	_, err = saga.New("ok", 1, saga.LocalStep("local", func(context.Context, *Order) error { return nil },
		saga.Compensate(release, func(*Order) ReleaseReq { return ReleaseReq{} }), withStart()))
	require.NoError(t, err)
}

func TestScheduleToStartInStepsAndShape(t *testing.T) {
	t.Parallel()
	def := saga.MustNew("checkout", 1, reserveStep(withStart()), chargeStep())
	require.Equal(t, startTimeout, def.Steps()[0].ScheduleToStartTimeout)
	require.Zero(t, def.Steps()[1].ScheduleToStartTimeout)
	b, err := json.Marshal(def.Shape())
	require.NoError(t, err)
	require.Contains(t, string(b), `"schedule_to_start_timeout_seconds":60`)
	var sh saga.Shape
	require.NoError(t, json.Unmarshal(b, &sh))
	require.Equal(t, def.Shape(), sh)
}

func mustJSON(t *testing.T, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}
