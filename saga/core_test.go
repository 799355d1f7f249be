package saga_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/saga/sagatest"
)

// events returns the Event field of each history entry.
func events(h []saga.HistoryEntry) []saga.HistoryEvent {
	out := make([]saga.HistoryEvent, len(h))
	for i, e := range h {
		out[i] = e.Event
	}
	return out
}

// completeReserve starts the checkout fixture and completes its first step.
func completeReserve(t *testing.T, s *sagatest.Scenario[Order]) {
	t.Helper()
	s.Start(Order{ID: "o-1", Amount: 30})
	require.Equal(t, ReserveReq{OrderID: "o-1"}, sagatest.ExpectCommand(s, reserve))
	sagatest.ReplySuccess(s, reserve, ReserveReply{ReservationID: "r-1"})
}

func TestHappyPath(t *testing.T) {
	t.Parallel()
	s := sagatest.New(t, checkout)
	completeReserve(t, s)
	require.Equal(t, ChargeReq{OrderID: "o-1", Amount: 30}, sagatest.ExpectCommand(s, charge))
	sagatest.ReplySuccess(s, charge, ChargeReply{PaymentID: "p-1"})
	require.Equal(t, NotifyReq{OrderID: "o-1"}, sagatest.ExpectCommand(s, notify))
	sagatest.ReplySuccess(s, notify, saga.None{})
	sagatest.ExpectCommand(s, ship)
	res := sagatest.ReplySuccess(s, ship, ShipReply{ShipmentID: "s-1"})
	require.Empty(t, res.Emit)
	s.RequireNoMessage()
	s.RequireStatus(saga.StatusCompleted)

	inst := s.Instance()
	require.Equal(t, -1, inst.CurrentStep)
	require.Equal(t, saga.PhaseAction, inst.Phase)
	require.True(t, inst.Deadline.IsZero())
	for _, st := range inst.Steps {
		require.Equal(t, saga.StepSucceeded, st.Status, st.Name)
		require.Equal(t, 1, st.Attempt, st.Name)
		require.True(t, st.Deadline.IsZero(), st.Name)
	}
	require.Equal(t, Order{ID: "o-1", Amount: 30, ReservationID: "r-1", PaymentID: "p-1", ShipmentID: "s-1"}, s.Data())
	require.Equal(t, []saga.HistoryEvent{
		saga.HistoryStarted,
		saga.HistoryCommandSent, saga.HistoryReplyApplied,
		saga.HistoryCommandSent, saga.HistoryReplyApplied,
		saga.HistoryCommandSent, saga.HistoryReplyApplied,
		saga.HistoryCommandSent, saga.HistoryReplyApplied,
		saga.HistoryCompleted,
	}, events(s.History()))
	for _, h := range s.History() {
		if h.Event == saga.HistoryReplyApplied {
			require.NotEqual(t, uuid.Nil, h.MessageID, "the reply's message id is recorded")
		} else {
			require.Equal(t, uuid.Nil, h.MessageID)
		}
	}
}

func TestStartEmitsFirstCommandWithDeadline(t *testing.T) {
	t.Parallel()
	now := time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC)
	id := uuid.New()
	data, err := checkout.EncodeData(Order{ID: "o-9", Amount: 5})
	require.NoError(t, err)
	res, err := checkout.Start(context.Background(), id, data, now)
	require.NoError(t, err)
	require.False(t, res.Ignored)
	require.Equal(t, []saga.Outgoing{{
		Type: "inventory.reserve", Phase: saga.PhaseAction, Step: "reserve-stock", StepIndex: 0, Attempt: 1,
		Payload: json.RawMessage(`{"order_id":"o-9"}`),
	}}, res.Emit)
	inst := res.Instance
	require.Equal(t, id, inst.ID)
	require.Equal(t, "checkout", inst.Type)
	require.Equal(t, 1, inst.Version)
	require.Equal(t, saga.StatusRunning, inst.Status)
	require.Equal(t, saga.PhaseAction, inst.Phase)
	require.Equal(t, 0, inst.CurrentStep)
	require.Equal(t, now.Add(reserveTimeout), inst.Deadline)
	require.Equal(t, saga.StepState{
		Name: "reserve-stock", Status: saga.StepRunning, Attempt: 1, Deadline: now.Add(reserveTimeout), StartedAt: now,
	}, inst.Steps[0])
	for _, st := range inst.Steps[1:] {
		require.Equal(t, saga.StepState{Name: st.Name, Status: saga.StepPending}, st)
	}
	require.Equal(t, []saga.HistoryEntry{
		{At: now, Event: saga.HistoryStarted, StepIndex: -1, Phase: saga.PhaseAction, Detail: "checkout v1"},
		{At: now, Event: saga.HistoryCommandSent, Step: "reserve-stock", StepIndex: 0, Phase: saga.PhaseAction, Attempt: 1, Detail: "inventory.reserve"},
	}, res.History)
}

func TestFailureAtEachStepCompensatesInReverse(t *testing.T) {
	t.Parallel()
	type sent struct {
		typ  string
		step string
	}
	tests := []struct {
		failAt int
		want   []sent // compensations, in order
		status map[string]saga.StepStatus
	}{
		{failAt: 0, want: nil, status: map[string]saga.StepStatus{
			"reserve-stock": saga.StepRejected, "charge-card": saga.StepPending, "notify-customer": saga.StepPending, "ship": saga.StepPending}},
		{failAt: 1, want: []sent{{"inventory.release", "reserve-stock"}}, status: map[string]saga.StepStatus{
			"reserve-stock": saga.StepCompensated, "charge-card": saga.StepRejected, "notify-customer": saga.StepPending, "ship": saga.StepPending}},
		{failAt: 2, want: []sent{{"payment.refund", "charge-card"}, {"inventory.release", "reserve-stock"}}, status: map[string]saga.StepStatus{
			"reserve-stock": saga.StepCompensated, "charge-card": saga.StepCompensated, "notify-customer": saga.StepRejected, "ship": saga.StepPending}},
		{failAt: 3, want: []sent{{"payment.refund", "charge-card"}, {"inventory.release", "reserve-stock"}}, status: map[string]saga.StepStatus{
			"reserve-stock": saga.StepCompensated, "charge-card": saga.StepCompensated, "notify-customer": saga.StepSucceeded, "ship": saga.StepRejected}},
	}
	for _, tt := range tests {
		t.Run(checkout.Steps()[tt.failAt].Name, func(t *testing.T) {
			t.Parallel()
			s := sagatest.New(t, checkout)
			s.Start(Order{ID: "o-1", Amount: 30})
			replies := []func(){
				func() { sagatest.ReplySuccess(s, reserve, ReserveReply{ReservationID: "r-1"}) },
				func() { sagatest.ReplySuccess(s, charge, ChargeReply{PaymentID: "p-1"}) },
				func() { sagatest.ReplySuccess(s, notify, saga.None{}) },
				func() { sagatest.ReplySuccess(s, ship, ShipReply{ShipmentID: "s-1"}) },
			}
			for i := range tt.failAt {
				s.Next()
				replies[i]()
			}
			msg := s.Next()
			require.Equal(t, tt.failAt, msg.StepIndex)
			s.ReplyFailure("no way")
			for _, w := range tt.want {
				s.RequireStatus(saga.StatusCompensating)
				msg := s.Next()
				require.Equal(t, saga.PhaseCompensation, msg.Phase)
				require.Equal(t, w.typ, msg.Type)
				require.Equal(t, w.step, msg.Step)
				require.Equal(t, 1, msg.Attempt)
				s.Deliver(saga.Event{Kind: saga.EventReplySuccess, Type: msg.Type, Step: msg.Step, StepIndex: msg.StepIndex, Attempt: 1, Payload: json.RawMessage(`{}`)})
			}
			s.RequireNoMessage()
			s.RequireStatus(saga.StatusCompensated)
			inst := s.Instance()
			require.Equal(t, "no way", inst.LastError)
			require.Equal(t, -1, inst.CurrentStep)
			require.Equal(t, saga.PhaseCompensation, inst.Phase)
			for _, st := range inst.Steps {
				require.Equal(t, tt.status[st.Name], st.Status, st.Name)
			}
			if tt.failAt == 3 {
				// notify-customer succeeded and has nothing to undo.
				var skipped []string
				for _, h := range s.History() {
					if h.Event == saga.HistoryCompensationSkipped {
						skipped = append(skipped, h.Step)
					}
				}
				require.Equal(t, []string{"notify-customer"}, skipped)
			}
		})
	}
}

func TestCompensationRequestUsesDataFromReplies(t *testing.T) {
	t.Parallel()
	s := sagatest.New(t, checkout)
	completeReserve(t, s)
	sagatest.ExpectCommand(s, charge)
	sagatest.ReplySuccess(s, charge, ChargeReply{PaymentID: "p-7"})
	sagatest.ExpectCommand(s, notify)
	s.ReplyFailure("mailbox full")
	require.Equal(t, RefundReq{PaymentID: "p-7"}, sagatest.ExpectCompensation(s, refund))
	sagatest.ReplySuccess(s, refund, saga.None{})
	require.Equal(t, ReleaseReq{ReservationID: "r-1"}, sagatest.ExpectCompensation(s, release))
	sagatest.ReplySuccess(s, release, saga.None{})
	s.RequireStatus(saga.StatusCompensated)
}

func TestFailureReplyReason(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		reason  string
		payload string
		want    string
	}{
		{name: "reason", payload: `{"reason":"insufficient stock"}`, want: "insufficient stock"},
		{name: "reason and code", payload: `{"reason":"insufficient stock","code":"out_of_stock"}`, want: "insufficient stock (out_of_stock)"},
		{name: "code only", payload: `{"code":"out_of_stock"}`, want: "out_of_stock"},
		{name: "event reason wins", reason: "from envelope", payload: `{"reason":"x"}`, want: "from envelope"},
		{name: "no payload", want: "failure reply without a reason"},
		{name: "empty failure", payload: `{}`, want: "failure reply without a reason"},
		{name: "future field tolerated", payload: `{"reason":"r","retry_after":3}`, want: "r"},
		{name: "garbage", payload: `nope`, want: "failure reply with an undecodable payload: invalid payload: decode failure reply: invalid character 'o' in literal null (expecting 'u')"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := sagatest.New(t, checkout)
			s.Start(Order{ID: "o-1"})
			msg := s.Next()
			res := s.Deliver(saga.Event{Kind: saga.EventReplyFailure, Type: msg.Type, Step: msg.Step, StepIndex: 0, Attempt: 1,
				Payload: json.RawMessage(tt.payload), Reason: tt.reason})
			s.RequireStatus(saga.StatusCompensated)
			require.Equal(t, tt.want, s.Instance().LastError)
			require.Equal(t, tt.want, s.Instance().Steps[0].LastError)
			require.Equal(t, tt.want, res.History[0].Detail)
		})
	}
}

func TestTimeoutRetryThenSuccess(t *testing.T) {
	t.Parallel()
	s := sagatest.New(t, checkout)
	s.Start(Order{ID: "o-1", Amount: 30})
	first := s.Next()
	require.Equal(t, 1, first.Attempt)

	s.Advance(reserveTimeout - time.Nanosecond)
	s.RequireNoMessage()
	s.RequireStepStatus("reserve-stock", saga.StepRunning)

	s.Advance(time.Nanosecond) // deadline reached: wait the backoff
	s.RequireNoMessage()
	s.RequireStepStatus("reserve-stock", saga.StepWaitingRetry)
	require.Equal(t, sagatest.Epoch.Add(reserveTimeout+time.Second), s.Instance().Deadline)

	s.Advance(time.Second) // backoff over: attempt 2
	second := sagatest.ExpectCommand(s, reserve)
	require.Equal(t, ReserveReq{OrderID: "o-1"}, second)
	require.Equal(t, 2, s.Instance().Steps[0].Attempt)
	require.Equal(t, sagatest.Epoch.Add(2*reserveTimeout+time.Second), s.Instance().Deadline)

	sagatest.ReplySuccess(s, reserve, ReserveReply{ReservationID: "r-2"})
	sagatest.ExpectCommand(s, charge)
	require.Equal(t, "r-2", s.Data().ReservationID)
	require.Equal(t, []saga.HistoryEvent{
		saga.HistoryStarted, saga.HistoryCommandSent,
		saga.HistoryTimedOut, saga.HistoryRetryScheduled,
		saga.HistoryCommandSent, saga.HistoryReplyApplied,
		saga.HistoryCommandSent,
	}, events(s.History()))
	require.Equal(t, 2, s.History()[4].Attempt)
	require.Equal(t, "in 1s", s.History()[3].Detail)
}

func TestTimeoutRetryLateReplyOfFirstAttemptCompletesStep(t *testing.T) {
	t.Parallel()
	s := sagatest.New(t, checkout)
	s.Start(Order{ID: "o-1", Amount: 30})
	first := s.Next()
	s.Advance(reserveTimeout + time.Second)
	second := s.Next()
	require.Equal(t, 2, second.Attempt)

	res := sagatest.ReplySuccessTo(s, first, reserve, ReserveReply{ReservationID: "r-late"})
	require.False(t, res.Ignored)
	require.Equal(t, 1, res.History[0].Attempt)
	s.RequireStepStatus("reserve-stock", saga.StepSucceeded)
	require.Equal(t, "r-late", s.Data().ReservationID)
	sagatest.ExpectCommand(s, charge)

	// The participant's barrier answers attempt 2 with the same outcome:
	// a duplicate now, ignored.
	res = sagatest.ReplySuccessTo(s, second, reserve, ReserveReply{ReservationID: "r-late"})
	require.True(t, res.Ignored)
	require.Equal(t, `reply-success reply "inventory.reserve" for step "reserve-stock" (index 0): the current step is "charge-card" (index 1)`, res.IgnoreReason)
}

func TestLateReplyWhileWaitingForRetryIsApplied(t *testing.T) {
	t.Parallel()
	s := sagatest.New(t, checkout)
	s.Start(Order{ID: "o-1", Amount: 30})
	first := s.Next()
	s.Advance(reserveTimeout)
	s.RequireStepStatus("reserve-stock", saga.StepWaitingRetry)
	sagatest.ReplySuccessTo(s, first, reserve, ReserveReply{ReservationID: "r-1"})
	s.RequireStepStatus("reserve-stock", saga.StepSucceeded)
	sagatest.ExpectCommand(s, charge)
	// The retry timer of reserve-stock is gone: the deadline is charge's.
	require.Equal(t, s.Now().Add(chargeTimeout), s.Instance().Deadline)
	s.Advance(time.Second)
	s.RequireNoMessage()
}

func TestTimeoutRetriesExhaustedCompensatesOwnStepFirst(t *testing.T) {
	t.Parallel()
	s := sagatest.New(t, checkout)
	s.Start(Order{ID: "o-1", Amount: 30})
	s.Next()
	// 30s timeout, 1s backoff, 30s, 2s backoff, 30s: exhausted after 93s.
	s.Advance(92 * time.Second)
	require.Equal(t, 2, s.Next().Attempt)
	require.Equal(t, 3, s.Next().Attempt)
	s.RequireNoMessage()
	s.Advance(time.Second)

	require.Equal(t, ReleaseReq{}, sagatest.ExpectCompensation(s, release))
	s.RequireStatus(saga.StatusCompensating)
	require.Equal(t, `step "reserve-stock" timed out after 3 attempt(s) of 30s`, s.Instance().LastError)
	sagatest.ReplySuccess(s, release, saga.None{})
	s.RequireStatus(saga.StatusCompensated)
	s.RequireStepStatus("reserve-stock", saga.StepCompensated)
	require.Equal(t, []saga.HistoryEvent{
		saga.HistoryStarted, saga.HistoryCommandSent,
		saga.HistoryTimedOut, saga.HistoryRetryScheduled, saga.HistoryCommandSent,
		saga.HistoryTimedOut, saga.HistoryRetryScheduled, saga.HistoryCommandSent,
		saga.HistoryTimedOut, saga.HistoryCompensationSent,
		saga.HistoryStepCompensated, saga.HistoryCompensated,
	}, events(s.History()))
	var delays []string
	for _, h := range s.History() {
		if h.Event == saga.HistoryRetryScheduled {
			delays = append(delays, h.Detail)
		}
	}
	require.Equal(t, []string{"in 1s", "in 2s"}, delays)
}

func TestTimeoutWithoutRetryCompensatesTimedOutStepThenEarlierOnes(t *testing.T) {
	t.Parallel()
	s := sagatest.New(t, checkout)
	completeReserve(t, s)
	charged := s.Next()
	s.Advance(chargeTimeout)

	require.Equal(t, RefundReq{}, sagatest.ExpectCompensation(s, refund))
	// The charge may still answer: too late, ignored.
	res := sagatest.ReplySuccessTo(s, charged, charge, ChargeReply{PaymentID: "p-late"})
	require.True(t, res.Ignored)
	require.Equal(t, `reply-success reply "payment.charge" for step "charge-card": the step's compensation command is "payment.refund"`, res.IgnoreReason)
	require.Equal(t, saga.HistoryReplyIgnored, res.History[0].Event)
	require.Empty(t, s.Data().PaymentID)

	sagatest.ReplySuccess(s, refund, saga.None{})
	require.Equal(t, ReleaseReq{ReservationID: "r-1"}, sagatest.ExpectCompensation(s, release))
	sagatest.ReplySuccess(s, release, saga.None{})
	s.RequireStatus(saga.StatusCompensated)
	s.RequireStepStatus("charge-card", saga.StepCompensated)
	s.RequireStepStatus("reserve-stock", saga.StepCompensated)
	// The timed-out step's own compensation succeeding does not repair its
	// timeout: the saga still says why it compensated.
	require.Contains(t, s.Instance().LastError, "timed out")
	require.Contains(t, s.Instance().Steps[1].LastError, "timed out")
}

func TestTimeoutOfStepWithoutCompensation(t *testing.T) {
	t.Parallel()
	def := saga.MustNew("timeout-nocomp", 1, reserveStep(),
		saga.Step("notify",
			saga.Invoke(notify, func(d *Order) NotifyReq { return NotifyReq{OrderID: d.ID} }, nil),
			saga.WithTimeout[Order](time.Minute)))
	s := sagatest.New(t, def)
	completeReserve(t, s)
	sagatest.ExpectCommand(s, notify)
	s.Advance(time.Minute)
	s.RequireStepStatus("notify", saga.StepTimedOut)
	sagatest.ExpectCompensation(s, release)
	sagatest.ReplySuccess(s, release, saga.None{})
	s.RequireStatus(saga.StatusCompensated)
}

func TestEarlyAndStaleTimersAreIgnored(t *testing.T) {
	t.Parallel()
	s := sagatest.New(t, checkout)
	s.Start(Order{ID: "o-1"})
	s.Next()
	before := s.Instance()
	res := s.Deliver(saga.Event{Kind: saga.EventTimer, At: s.Now().Add(reserveTimeout - time.Millisecond)})
	require.True(t, res.Ignored)
	require.Empty(t, res.History)
	require.Empty(t, res.Emit)
	require.Equal(t, before, res.Instance)
	require.Contains(t, res.IgnoreReason, `timer: step "reserve-stock" deadline 2030-01-01T00:00:30Z not reached`)

	s.ReplyFailure("no")
	s.RequireStatus(saga.StatusCompensated)
	res = s.Deliver(saga.Event{Kind: saga.EventTimer, At: s.Now().Add(time.Hour)})
	require.True(t, res.Ignored)
	require.Equal(t, "timer: the saga is compensated", res.IgnoreReason)
}

func TestCompensationFailureThenOperatorRetry(t *testing.T) {
	t.Parallel()
	s := sagatest.New(t, checkout)
	completeReserve(t, s)
	sagatest.ExpectCommand(s, charge)
	s.ReplyFailure("card declined")
	sagatest.ExpectCompensation(s, release)
	s.ReplyFailure("warehouse offline")

	s.RequireStatus(saga.StatusFailed)
	s.RequireStepStatus("reserve-stock", saga.StepCompensationFailed)
	inst := s.Instance()
	require.Equal(t, "warehouse offline", inst.LastError)
	require.Equal(t, 0, inst.CurrentStep)
	require.True(t, inst.Deadline.IsZero())
	require.True(t, inst.Status.Terminal())

	res := s.Retry("alice", "warehouse back")
	require.Equal(t, saga.HistoryEntry{
		At: s.Now(), Event: saga.HistoryRetried, Step: "reserve-stock", StepIndex: 0, Phase: saga.PhaseCompensation,
		Attempt: 2, Detail: "warehouse back", Actor: "alice",
	}, res.History[0], "the retried entry records the attempt it re-sends")
	s.RequireStatus(saga.StatusCompensating)
	msg := s.Next()
	require.Equal(t, saga.PhaseCompensation, msg.Phase)
	require.Equal(t, "inventory.release", msg.Type)
	require.Equal(t, 2, msg.Attempt)
	require.JSONEq(t, `{"reservation_id":"r-1"}`, string(msg.Payload))

	sagatest.ReplySuccess(s, release, saga.None{})
	s.RequireStatus(saga.StatusCompensated)
	s.RequireStepStatus("reserve-stock", saga.StepCompensated)
	require.Equal(t, 2, s.Instance().Steps[0].CompensationAttempt)
	require.Empty(t, s.Instance().Steps[0].LastError, "the retried compensation succeeded: its failure is resolved")
	require.Equal(t, "card declined", s.Instance().LastError,
		"the saga's last error is again why it compensated, not the compensation failure a retry repaired")
	require.Equal(t, []saga.HistoryEvent{
		saga.HistoryStarted, saga.HistoryCommandSent, saga.HistoryReplyApplied, saga.HistoryCommandSent,
		saga.HistoryStepRejected, saga.HistoryCompensationSent,
		saga.HistoryCompensationFailed, saga.HistoryFailed,
		saga.HistoryRetried, saga.HistoryCompensationSent,
		saga.HistoryStepCompensated, saga.HistoryCompensated,
	}, events(s.History()))
}

func TestOperatorAbortRunningSaga(t *testing.T) {
	t.Parallel()
	s := sagatest.New(t, checkout)
	completeReserve(t, s)
	charged := s.Next()

	res := s.Abort("bob", "customer called")
	require.Equal(t, saga.HistoryEntry{
		At: s.Now(), Event: saga.HistoryAborted, Step: "charge-card", StepIndex: 1, Phase: saga.PhaseAction,
		Attempt: 1, Detail: "customer called", Actor: "bob",
	}, res.History[0])
	require.Equal(t, "aborted by bob: customer called", res.Instance.LastError)
	// The in-flight step first: the charge may have happened.
	sagatest.ExpectCompensation(s, refund)
	s.RequireStatus(saga.StatusCompensating)
	require.True(t, sagatest.ReplySuccessTo(s, charged, charge, ChargeReply{PaymentID: "p-1"}).Ignored)
	sagatest.ReplySuccess(s, refund, saga.None{})
	sagatest.ExpectCompensation(s, release)
	sagatest.ReplySuccess(s, release, saga.None{})
	s.RequireStatus(saga.StatusCompensated)
}

func TestOperatorAbortStepWithoutCompensation(t *testing.T) {
	t.Parallel()
	s := sagatest.New(t, checkout)
	completeReserve(t, s)
	sagatest.ExpectCommand(s, charge)
	sagatest.ReplySuccess(s, charge, ChargeReply{PaymentID: "p-1"})
	sagatest.ExpectCommand(s, notify)
	s.Abort("bob", "")
	s.RequireStepStatus("notify-customer", saga.StepAborted)
	require.Equal(t, "aborted by bob", s.Instance().LastError)
	sagatest.ExpectCompensation(s, refund)
}

func TestOperatorRetryRunningAndCompensating(t *testing.T) {
	t.Parallel()
	s := sagatest.New(t, checkout)
	s.Start(Order{ID: "o-1"})
	s.Next()
	s.Advance(10 * time.Second)
	res := s.Retry("ops", "resend")
	require.Equal(t, saga.HistoryRetried, res.History[0].Event)
	require.Equal(t, 2, res.History[0].Attempt, "the retried entry records the attempt it re-sends")
	msg := s.Next()
	require.Equal(t, saga.PhaseAction, msg.Phase)
	require.Equal(t, 2, msg.Attempt)
	// A fresh deadline from the retry.
	require.Equal(t, s.Now().Add(reserveTimeout), s.Instance().Deadline)
	sagatest.ReplySuccess(s, reserve, ReserveReply{ReservationID: "r-1"})
	sagatest.ExpectCommand(s, charge)
	s.ReplyFailure("declined")
	sagatest.ExpectCompensation(s, release)
	s.Retry("ops", "")
	msg = s.Next()
	require.Equal(t, saga.PhaseCompensation, msg.Phase)
	require.Equal(t, 2, msg.Attempt)
	s.RequireStatus(saga.StatusCompensating)
}

func TestInvalidOperatorActions(t *testing.T) {
	t.Parallel()
	completed := func(t *testing.T) *sagatest.Scenario[Order] {
		def := saga.MustNew("one", 1, notifyStep())
		s := sagatest.New(t, def)
		s.Start(Order{ID: "o"})
		sagatest.ExpectCommand(s, notify)
		sagatest.ReplySuccess(s, notify, saga.None{})
		s.RequireStatus(saga.StatusCompleted)
		return s
	}
	s := completed(t)
	_, err := s.Apply(saga.Event{Kind: saga.EventRetry, Actor: "ops"})
	require.ErrorIs(t, err, saga.ErrInvalidTransition)
	require.EqualError(t, err, "invalid saga transition: retry saga "+s.ID().String()+": a completed saga has nothing to retry")
	_, err = s.Apply(saga.Event{Kind: saga.EventAbort, Actor: "ops"})
	require.ErrorIs(t, err, saga.ErrInvalidTransition)
	require.EqualError(t, err, "invalid saga transition: abort saga "+s.ID().String()+": only a running saga can be aborted, this one is completed")

	s = sagatest.New(t, checkout)
	completeReserve(t, s)
	sagatest.ExpectCommand(s, charge)
	s.ReplyFailure("declined")
	_, err = s.Apply(saga.Event{Kind: saga.EventAbort})
	require.ErrorIs(t, err, saga.ErrInvalidTransition)
	require.Contains(t, err.Error(), "this one is compensating")
}

func TestStaleAndDuplicateRepliesAreIgnored(t *testing.T) {
	t.Parallel()
	type step struct {
		name string
		// run drives the scenario and returns the reply to deliver.
		run        func(s *sagatest.Scenario[Order]) saga.Event
		wantReason string
	}
	dupID := uuid.MustParse("0190f0d4-0000-7000-8000-00000000d0d0")
	reply := func(msg saga.Outgoing, payload string) saga.Event {
		return saga.Event{Kind: saga.EventReplySuccess, Type: msg.Type, Step: msg.Step, StepIndex: msg.StepIndex,
			Attempt: msg.Attempt, Payload: json.RawMessage(payload), MessageID: dupID}
	}
	tests := []step{
		{
			name: "duplicate success",
			run: func(s *sagatest.Scenario[Order]) saga.Event {
				msg := s.Next()
				sagatest.ReplySuccess(s, reserve, ReserveReply{ReservationID: "r-1"})
				return reply(msg, `{"reservation_id":"r-1"}`)
			},
			wantReason: `reply-success reply "inventory.reserve" for step "reserve-stock" (index 0): the current step is "charge-card" (index 1)`,
		},
		{
			name: "failure for a completed step",
			run: func(s *sagatest.Scenario[Order]) saga.Event {
				msg := s.Next()
				sagatest.ReplySuccess(s, reserve, ReserveReply{ReservationID: "r-1"})
				ev := reply(msg, `{"reason":"late no"}`)
				ev.Kind = saga.EventReplyFailure
				return ev
			},
			wantReason: `reply-failure reply "inventory.reserve" for step "reserve-stock" (index 0): the current step is "charge-card" (index 1)`,
		},
		{
			name: "late action reply while compensating",
			run: func(s *sagatest.Scenario[Order]) saga.Event {
				s.Next()
				sagatest.ReplySuccess(s, reserve, ReserveReply{ReservationID: "r-1"})
				msg := s.Next()
				s.Abort("ops", "")
				return reply(msg, `{"payment_id":"p"}`)
			},
			wantReason: `reply-success reply "payment.charge" for step "charge-card": the step's compensation command is "payment.refund"`,
		},
		{
			name: "reply after terminal",
			run: func(s *sagatest.Scenario[Order]) saga.Event {
				msg := s.Next()
				s.ReplyFailure("no")
				return reply(msg, `{"reservation_id":"r-1"}`)
			},
			wantReason: `reply-success reply "inventory.reserve" for step "reserve-stock": the saga is compensated`,
		},
		{
			name: "wrong type",
			run: func(s *sagatest.Scenario[Order]) saga.Event {
				msg := s.Next()
				msg.Type = "inventory.release"
				return reply(msg, `{}`)
			},
			wantReason: `reply-success reply "inventory.release" for step "reserve-stock": the step's action command is "inventory.reserve"`,
		},
		{
			name: "wrong step name",
			run: func(s *sagatest.Scenario[Order]) saga.Event {
				msg := s.Next()
				msg.Step = "charge-card"
				return reply(msg, `{}`)
			},
			wantReason: `reply-success reply "inventory.reserve" for step "charge-card" (index 0): the current step is "reserve-stock" (index 0)`,
		},
		{
			name: "step index out of range",
			run: func(s *sagatest.Scenario[Order]) saga.Event {
				msg := s.Next()
				msg.StepIndex = 99
				return reply(msg, `{}`)
			},
			wantReason: `reply-success reply "inventory.reserve" for step "reserve-stock" (index 99): the current step is "reserve-stock" (index 0)`,
		},
		{
			name: "attempt never sent",
			run: func(s *sagatest.Scenario[Order]) saga.Event {
				msg := s.Next()
				msg.Attempt = 2
				return reply(msg, `{"reservation_id":"r-1"}`)
			},
			wantReason: `reply-success reply "inventory.reserve" for step "reserve-stock": attempt 2 was never sent (last sent: 1)`,
		},
		{
			name: "duplicate compensation reply",
			run: func(s *sagatest.Scenario[Order]) saga.Event {
				s.Next()
				sagatest.ReplySuccess(s, reserve, ReserveReply{ReservationID: "r-1"})
				s.Next()
				s.ReplyFailure("declined")
				msg := s.Next()
				sagatest.ReplySuccess(s, release, saga.None{})
				return reply(msg, `{}`)
			},
			wantReason: `reply-success reply "inventory.release" for step "reserve-stock": the saga is compensated`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := sagatest.New(t, checkout)
			s.Start(Order{ID: "o-1", Amount: 30})
			ev := tt.run(s)
			before := s.Instance()
			res := s.Deliver(ev)
			require.True(t, res.Ignored)
			require.Equal(t, tt.wantReason, res.IgnoreReason)
			require.Equal(t, before, res.Instance)
			require.Empty(t, res.Emit)
			require.Equal(t, []saga.HistoryEntry{{
				At: s.Now(), Event: saga.HistoryReplyIgnored, Step: ev.Step, StepIndex: ev.StepIndex, Phase: before.Phase,
				Attempt: ev.Attempt, Detail: tt.wantReason, MessageID: dupID,
			}}, res.History)
		})
	}
}

func TestMalformedSuccessReplyIsAnError(t *testing.T) {
	t.Parallel()
	s := sagatest.New(t, checkout)
	s.Start(Order{ID: "o-1"})
	msg := s.Next()
	for _, payload := range []string{`{"reservation":"r-1"}`, `{"reservation_id":"r-1"} {}`, ``, `[1]`} {
		_, err := s.Apply(saga.Event{Kind: saga.EventReplySuccess, Type: msg.Type, Step: msg.Step, StepIndex: 0, Attempt: 1, Payload: json.RawMessage(payload)})
		require.ErrorIs(t, err, saga.ErrInvalidPayload, payload)
		require.Contains(t, err.Error(), `saga checkout v1 `+s.ID().String()+`: step "reserve-stock": apply reply: invalid payload: decode inventory.reserve reply: `)
	}
	s.RequireStatus(saga.StatusRunning)
	s.RequireStepStatus("reserve-stock", saga.StepRunning)
}

func TestPredicateSkipsSteps(t *testing.T) {
	t.Parallel()
	def := saga.MustNew("gift", 1,
		saga.Step("wrap", saga.Invoke(notify, func(d *Order) NotifyReq { return NotifyReq{OrderID: d.ID} }, nil),
			saga.When(func(d *Order) bool { return d.Gift })),
		reserveStep(),
		chargeStep(saga.When(func(d *Order) bool { return d.Amount > 0 })),
	)

	t.Run("skipped in the middle and at start", func(t *testing.T) {
		t.Parallel()
		s := sagatest.New(t, def)
		s.Start(Order{ID: "o-1"})
		s.RequireStepStatus("wrap", saga.StepSkipped)
		sagatest.ExpectCommand(s, reserve)
		sagatest.ReplySuccess(s, reserve, ReserveReply{ReservationID: "r-1"})
		s.RequireNoMessage()
		s.RequireStatus(saga.StatusCompleted)
		s.RequireStepStatus("charge-card", saga.StepSkipped)
		require.Equal(t, []saga.HistoryEvent{
			saga.HistoryStarted, saga.HistoryStepSkipped, saga.HistoryCommandSent, saga.HistoryReplyApplied,
			saga.HistoryStepSkipped, saga.HistoryCompleted,
		}, events(s.History()))
	})
	t.Run("skipped steps are not compensated", func(t *testing.T) {
		t.Parallel()
		s := sagatest.New(t, def)
		s.Start(Order{ID: "o-1", Amount: 10})
		sagatest.ExpectCommand(s, reserve)
		sagatest.ReplySuccess(s, reserve, ReserveReply{ReservationID: "r-1"})
		sagatest.ExpectCommand(s, charge)
		s.ReplyFailure("declined")
		sagatest.ExpectCompensation(s, release)
		sagatest.ReplySuccess(s, release, saga.None{})
		s.RequireNoMessage()
		s.RequireStatus(saga.StatusCompensated)
		s.RequireStepStatus("wrap", saga.StepSkipped)
	})
	t.Run("predicate sees data from earlier replies", func(t *testing.T) {
		t.Parallel()
		def := saga.MustNew("cond", 1, reserveStep(),
			shipStep(saga.When(func(d *Order) bool { return d.ReservationID != "" })))
		s := sagatest.New(t, def)
		s.Start(Order{ID: "o-1"})
		sagatest.ReplySuccessTo(s, s.Next(), reserve, ReserveReply{ReservationID: ""})
		s.RequireStatus(saga.StatusCompleted)
		s.RequireStepStatus("ship", saga.StepSkipped)
	})
	t.Run("all skipped completes at start", func(t *testing.T) {
		t.Parallel()
		def := saga.MustNew("none", 1, shipStep(saga.When(func(*Order) bool { return false })))
		s := sagatest.New(t, def)
		res := s.Start(Order{ID: "o-1"})
		require.Empty(t, res.Emit)
		s.RequireStatus(saga.StatusCompleted)
		require.Equal(t, -1, s.Instance().CurrentStep)
	})
}

func TestLocalSteps(t *testing.T) {
	t.Parallel()
	def := saga.MustNew("local", 1,
		saga.LocalStep("note-start", note("start")),
		reserveStep(),
		saga.LocalStep("note-reserved", note("reserved"), saga.Compensate(notify, func(d *Order) NotifyReq { return NotifyReq{OrderID: "undo-" + d.ID} })),
		saga.LocalStep("note-gift", note("gift"), saga.When(func(d *Order) bool { return d.Gift })),
		chargeStep(),
	)

	t.Run("success runs inline", func(t *testing.T) {
		t.Parallel()
		s := sagatest.New(t, def)
		s.Start(Order{ID: "o-1", Amount: 5})
		s.RequireStepStatus("note-start", saga.StepSucceeded)
		sagatest.ExpectCommand(s, reserve)
		sagatest.ReplySuccess(s, reserve, ReserveReply{ReservationID: "r-1"})
		s.RequireStepStatus("note-reserved", saga.StepSucceeded)
		s.RequireStepStatus("note-gift", saga.StepSkipped)
		sagatest.ExpectCommand(s, charge)
		require.Equal(t, []string{"start", "reserved"}, s.Data().Notes)
		require.Equal(t, 4, s.Instance().CurrentStep)

		// A failing charge compensates the local step with its command.
		s.ReplyFailure("declined")
		require.Equal(t, NotifyReq{OrderID: "undo-o-1"}, sagatest.ExpectCompensation(s, notify))
		sagatest.ReplySuccess(s, notify, saga.None{})
		sagatest.ExpectCompensation(s, release)
		sagatest.ReplySuccess(s, release, saga.None{})
		s.RequireStatus(saga.StatusCompensated)
		s.RequireStepStatus("note-start", saga.StepSucceeded) // nothing to undo
	})
	t.Run("reject at start", func(t *testing.T) {
		t.Parallel()
		s := sagatest.New(t, def)
		res := s.Start(Order{ID: "o-1", Amount: 0})
		require.Empty(t, res.Emit)
		s.RequireStatus(saga.StatusCompensated)
		s.RequireStepStatus("note-start", saga.StepRejected)
		require.Equal(t, "nothing to pay", s.Instance().LastError)
		require.Empty(t, s.Data().Notes, "a rejecting local step's data changes are discarded")
	})
	t.Run("reject after a reply compensates earlier steps", func(t *testing.T) {
		t.Parallel()
		def := saga.MustNew("local-reject", 1, reserveStep(),
			saga.LocalStep("check", func(_ context.Context, d *Order) error {
				d.Notes = append(d.Notes, "checked")
				return saga.Reject(errors.New("reservation " + d.ReservationID + " too late"))
			}),
			chargeStep())
		s := sagatest.New(t, def)
		s.Start(Order{ID: "o-1", Amount: 5})
		sagatest.ExpectCommand(s, reserve)
		res := sagatest.ReplySuccess(s, reserve, ReserveReply{ReservationID: "r-1"})
		require.Equal(t, saga.HistoryStepRejected, res.History[1].Event)
		require.Equal(t, "reservation r-1 too late", res.History[1].Detail)
		s.RequireStepStatus("check", saga.StepRejected)
		require.Equal(t, ReleaseReq{ReservationID: "r-1"}, sagatest.ExpectCompensation(s, release))
		require.Nil(t, s.Data().Notes)
	})
	t.Run("transient error is returned", func(t *testing.T) {
		t.Parallel()
		data, err := def.EncodeData(Order{ID: "o-1", Amount: -1})
		require.NoError(t, err)
		id := uuid.New()
		_, err = def.Start(context.Background(), id, data, sagatest.Epoch)
		require.ErrorIs(t, err, errOutOfPaper)
		require.NotErrorIs(t, err, saga.ErrRejected)
		require.EqualError(t, err, `saga local v1 `+id.String()+`: step "note-start": local step: printer out of paper`)
	})
	t.Run("each local step runs through the context's scope", func(t *testing.T) {
		t.Parallel()
		type key struct{}
		var got []any
		def := saga.MustNew("scoped", 1,
			saga.LocalStep("first", func(ctx context.Context, _ *Order) error {
				got = append(got, ctx.Value(key{}))
				return nil
			}),
			saga.LocalStep("second", func(ctx context.Context, _ *Order) error {
				got = append(got, ctx.Value(key{}))
				return saga.Reject(errors.New("no"))
			}))
		var outcomes []error
		ctx := saga.WithLocalScope(context.Background(), func(ctx context.Context, run func(context.Context) error) error {
			err := run(context.WithValue(ctx, key{}, len(outcomes)))
			outcomes = append(outcomes, err)
			return err
		})
		data, err := def.EncodeData(Order{})
		require.NoError(t, err)
		res, err := def.Start(ctx, uuid.New(), data, sagatest.Epoch)
		require.NoError(t, err)
		require.Equal(t, saga.StatusCompensated, res.Instance.Status)
		require.Equal(t, []any{0, 1}, got, "each step gets the scope's context")
		require.Len(t, outcomes, 2)
		require.NoError(t, outcomes[0])
		require.ErrorIs(t, outcomes[1], saga.ErrRejected, "the scope sees the rejection, to undo the step's writes")
	})
	t.Run("context is passed through", func(t *testing.T) {
		t.Parallel()
		type key struct{}
		var got any
		def := saga.MustNew("ctx", 1, saga.LocalStep("look", func(ctx context.Context, _ *Order) error {
			got = ctx.Value(key{})
			return nil
		}))
		data, err := def.EncodeData(Order{})
		require.NoError(t, err)
		ctx := context.WithValue(context.Background(), key{}, "tx")
		res, err := def.Start(ctx, uuid.New(), data, sagatest.Epoch)
		require.NoError(t, err)
		require.Equal(t, saga.StatusCompleted, res.Instance.Status)
		require.Equal(t, "tx", got)
	})
}

func TestCompensationTimeoutResends(t *testing.T) {
	t.Parallel()
	def := saga.MustNew("comp-timeout", 1,
		reserveStep(saga.WithCompensationTimeout[Order](time.Minute)),
		chargeStep())
	s := sagatest.New(t, def)
	completeReserve(t, s)
	sagatest.ExpectCommand(s, charge)
	s.ReplyFailure("declined")
	first := s.Next()
	require.Equal(t, 1, first.Attempt)
	require.Equal(t, s.Now().Add(time.Minute), s.Instance().Deadline)
	s.Advance(2 * time.Minute)
	require.Equal(t, 2, s.Next().Attempt)
	require.Equal(t, 3, s.Next().Attempt)
	// The first attempt's reply is the real answer.
	sagatest.ReplySuccessTo(s, first, release, saga.None{})
	s.RequireStatus(saga.StatusCompensated)
	require.True(t, s.Instance().Deadline.IsZero())
}

func TestApplyIsDeterministicAndDoesNotModifyInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	data, err := checkout.EncodeData(Order{ID: "o-1", Amount: 3})
	require.NoError(t, err)
	start, err := checkout.Start(ctx, uuid.New(), data, sagatest.Epoch)
	require.NoError(t, err)
	inst := start.Instance
	snapshot, err := json.Marshal(inst)
	require.NoError(t, err)
	ev := saga.Event{Kind: saga.EventReplySuccess, Type: "inventory.reserve", Step: "reserve-stock", StepIndex: 0, Attempt: 1,
		Payload: json.RawMessage(`{"reservation_id":"r"}`), At: sagatest.Epoch.Add(time.Second)}
	a, err := checkout.Apply(ctx, inst, ev)
	require.NoError(t, err)
	b, err := checkout.Apply(ctx, inst, ev)
	require.NoError(t, err)
	require.Equal(t, a, b)
	after, err := json.Marshal(inst)
	require.NoError(t, err)
	require.JSONEq(t, string(snapshot), string(after))
	require.Equal(t, saga.StepRunning, inst.Steps[0].Status)
}

func TestInstanceJSONRoundTrip(t *testing.T) {
	t.Parallel()
	s := sagatest.New(t, checkout)
	completeReserve(t, s)
	sagatest.ExpectCommand(s, charge)
	s.Advance(chargeTimeout) // compensating, with timed-out state recorded
	s.Next()
	s.ReplyFailure("refund service down") // failed
	inst := s.Instance()
	require.Equal(t, saga.StatusFailed, inst.Status)

	b, err := json.Marshal(inst)
	require.NoError(t, err)
	var back saga.Instance
	require.NoError(t, json.Unmarshal(b, &back))
	require.Equal(t, inst, back)
	b2, err := json.Marshal(back)
	require.NoError(t, err)
	require.Equal(t, string(b), string(b2))

	var raw map[string]any
	require.NoError(t, json.Unmarshal(b, &raw))
	require.Equal(t, "failed", raw["status"])
	require.Equal(t, "compensation", raw["phase"])
	require.EqualValues(t, 1, raw["current_step"])
	require.Equal(t, "refund service down", raw["last_error"])
	require.NotContains(t, raw, "deadline", "zero deadline is omitted")
	steps := raw["steps"].([]any)
	require.Equal(t, map[string]any{
		"name": "charge-card", "status": "compensation-failed", "attempt": 1.0, "compensation_attempt": 1.0,
		"started_at": "2030-01-01T00:00:00Z", "finished_at": "2030-01-01T00:00:10Z", "last_error": "refund service down",
	}, steps[1])
	require.Equal(t, map[string]any{"name": "ship", "status": "pending"}, steps[3])

	// The decoded instance drives the saga on.
	res, err := checkout.Apply(context.Background(), back, saga.Event{Kind: saga.EventRetry, Actor: "ops", At: s.Now()})
	require.NoError(t, err)
	require.Equal(t, saga.StatusCompensating, res.Instance.Status)
}

func TestApplyRejectsInvalidInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	data, err := checkout.EncodeData(Order{ID: "o-1"})
	require.NoError(t, err)
	id := uuid.MustParse("0190f0d4-0000-7000-8000-000000000001")
	start, err := checkout.Start(ctx, id, data, sagatest.Epoch)
	require.NoError(t, err)
	good := start.Instance
	at := sagatest.Epoch.Add(time.Second)

	tests := []struct {
		name    string
		inst    func(saga.Instance) saga.Instance
		ev      saga.Event
		wantErr error
		msg     string
	}{
		{name: "other definition", inst: func(i saga.Instance) saga.Instance { i.Version = 2; return i },
			ev: saga.Event{Kind: saga.EventTimer, At: at}, wantErr: saga.ErrInvalidInstance,
			msg: "invalid saga instance: saga " + id.String() + ": instance is of checkout v2, not checkout v1"},
		{name: "unknown status", inst: func(i saga.Instance) saga.Instance { i.Status = "paused"; return i },
			ev: saga.Event{Kind: saga.EventTimer, At: at}, wantErr: saga.ErrInvalidInstance,
			msg: `invalid saga instance: saga ` + id.String() + `: unknown status "paused"`},
		{name: "step count", inst: func(i saga.Instance) saga.Instance { i.Steps = i.Steps[:2]; return i },
			ev: saga.Event{Kind: saga.EventTimer, At: at}, wantErr: saga.ErrInvalidInstance,
			msg: "invalid saga instance: saga " + id.String() + ": 2 step states for 4 steps"},
		{name: "current step", inst: func(i saga.Instance) saga.Instance { i.CurrentStep = 7; return i },
			ev: saga.Event{Kind: saga.EventTimer, At: at}, wantErr: saga.ErrInvalidInstance,
			msg: "invalid saga instance: saga " + id.String() + ": current step 7 out of range for a running saga"},
		{name: "bad data", inst: func(i saga.Instance) saga.Instance { i.Data = json.RawMessage(`[]`); return i },
			ev: saga.Event{Kind: saga.EventTimer, At: at}, wantErr: saga.ErrInvalidInstance},
		{name: "no time", ev: saga.Event{Kind: saga.EventTimer}, wantErr: saga.ErrInvalidEvent,
			msg: "invalid saga event: timer event for saga " + id.String() + " has no time"},
		{name: "unknown kind", ev: saga.Event{Kind: "poke", At: at}, wantErr: saga.ErrInvalidEvent,
			msg: `invalid saga event: saga ` + id.String() + `: unknown event kind "poke"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			inst := good
			inst.Steps = append([]saga.StepState(nil), good.Steps...)
			if tt.inst != nil {
				inst = tt.inst(inst)
			}
			_, err := checkout.Apply(ctx, inst, tt.ev)
			require.ErrorIs(t, err, tt.wantErr)
			if tt.msg != "" {
				require.EqualError(t, err, tt.msg)
			}
		})
	}

	t.Run("start", func(t *testing.T) {
		t.Parallel()
		_, err := checkout.Start(ctx, uuid.Nil, data, at)
		require.ErrorIs(t, err, saga.ErrInvalidInstance)
		_, err = checkout.Start(ctx, id, data, time.Time{})
		require.ErrorIs(t, err, saga.ErrInvalidEvent)
		_, err = checkout.Start(ctx, id, json.RawMessage(`"x"`), at)
		require.ErrorIs(t, err, saga.ErrInvalidPayload)
	})
}

func TestStatusHelpers(t *testing.T) {
	t.Parallel()
	for _, st := range []saga.Status{saga.StatusRunning, saga.StatusCompensating} {
		require.True(t, st.Valid())
		require.False(t, st.Terminal())
	}
	for _, st := range []saga.Status{saga.StatusCompleted, saga.StatusCompensated, saga.StatusFailed} {
		require.True(t, st.Valid())
		require.True(t, st.Terminal())
	}
	require.False(t, saga.Status("paused").Valid())
}
