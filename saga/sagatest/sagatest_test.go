package sagatest_test

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/saga/sagatest"
)

type Booking struct {
	Guest  string `json:"guest"`
	RoomID string `json:"room_id,omitempty"`
}

type HoldReq struct {
	Guest string `json:"guest"`
}

type HoldReply struct {
	RoomID string `json:"room_id"`
}

type FreeReq struct {
	RoomID string `json:"room_id"`
}

var (
	hold    = saga.NewCommand[HoldReq, HoldReply]("hotel.hold")
	free    = saga.NewCommand[FreeReq, saga.None]("hotel.free")
	confirm = saga.NewCommand[HoldReq, saga.None]("hotel.confirm")
)

var booking = saga.MustNew("booking", 1,
	saga.Step("hold",
		saga.Invoke(hold, func(b *Booking) HoldReq { return HoldReq{Guest: b.Guest} }, func(b *Booking, r HoldReply) { b.RoomID = r.RoomID }),
		saga.Compensate(free, func(b *Booking) FreeReq { return FreeReq{RoomID: b.RoomID} }),
		saga.WithTimeout[Booking](time.Minute),
		saga.WithRetry[Booking](saga.RetryPolicy{MaxAttempts: 2, InitialInterval: 10 * time.Second}),
	),
	saga.Step("confirm",
		saga.Invoke(confirm, func(b *Booking) HoldReq { return HoldReq{Guest: b.Guest} }, nil),
	),
)

func TestScenario(t *testing.T) {
	t.Parallel()
	s := sagatest.New(t, booking)
	require.Equal(t, sagatest.Epoch, s.Now())
	s.Start(Booking{Guest: "ann"})
	require.Equal(t, HoldReq{Guest: "ann"}, sagatest.ExpectCommand(s, hold))
	s.Advance(70 * time.Second) // timeout at 60s, re-sent at 70s
	require.Equal(t, sagatest.Epoch.Add(70*time.Second), s.Now())
	require.Len(t, s.Pending(), 1)
	msg := s.Next()
	require.Equal(t, 2, msg.Attempt)
	sagatest.ReplySuccess(s, hold, HoldReply{RoomID: "101"})
	require.Equal(t, Booking{Guest: "ann", RoomID: "101"}, s.Data())
	sagatest.ExpectCommand(s, confirm)
	s.ReplyFailure("card expired")
	require.Equal(t, FreeReq{RoomID: "101"}, sagatest.ExpectCompensation(s, free))
	sagatest.ReplySuccess(s, free, saga.None{})
	s.RequireNoMessage()
	s.RequireStatus(saga.StatusCompensated)
	s.RequireStepStatus("hold", saga.StepCompensated)
	s.RequireStepStatus("confirm", saga.StepRejected)
	require.Equal(t, saga.StatusCompensated, s.Status())
	require.NotEmpty(t, s.History())
	require.Equal(t, s.ID(), s.Instance().ID)
}

// fakeTB records the first fatal failure and stops the goroutine, as
// testing.T does.
type fakeTB struct {
	testing.TB
	failure string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Fatal(args ...any) {
	f.failure = fmt.Sprint(args...)
	runtime.Goexit()
}

func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failure = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// failure runs fn with a fake TB and returns its fatal failure, "" if none.
func failure(t *testing.T, fn func(tb testing.TB)) string {
	f := &fakeTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(f)
	}()
	<-done
	return f.failure
}

func TestScenarioFailures(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		fn   func(tb testing.TB)
		want string
	}{
		{name: "ok", fn: func(tb testing.TB) {
			s := sagatest.New(tb, booking)
			s.Start(Booking{Guest: "g"})
			sagatest.ExpectCommand(s, hold)
		}},
		{name: "wrong command", fn: func(tb testing.TB) {
			s := sagatest.New(tb, booking)
			s.Start(Booking{Guest: "g"})
			sagatest.ExpectCommand(s, confirm)
		}, want: `sagatest: expected action hotel.confirm, got action hotel.hold for step "hold" (attempt 1)`},
		{name: "command expected, compensation sent", fn: func(tb testing.TB) {
			s := sagatest.New(tb, booking)
			s.Start(Booking{Guest: "g"})
			sagatest.ExpectCommand(s, hold)
			s.Advance(2 * time.Hour)
			sagatest.ExpectCommand(s, hold)
			sagatest.ExpectCommand(s, free)
		}, want: `sagatest: expected action hotel.free, got compensation hotel.free for step "hold" (attempt 1)`},
		{name: "nothing emitted", fn: func(tb testing.TB) {
			s := sagatest.New(tb, booking)
			s.Start(Booking{Guest: "g"})
			s.Next()
			s.Next()
		}, want: "sagatest: no message emitted; saga is running\nhistory:\n" +
			"  0s started                step=\"\" phase=action attempt=0 booking v1\n" +
			"  0s command-sent           step=\"hold\" phase=action attempt=1 hotel.hold\n"},
		{name: "unexpected message", fn: func(tb testing.TB) {
			s := sagatest.New(tb, booking)
			s.Start(Booking{Guest: "g"})
			s.RequireNoMessage()
		}, want: `sagatest: unexpected action hotel.hold for step "hold" (attempt 1), 1 message(s) pending`},
		{name: "wrong status", fn: func(tb testing.TB) {
			s := sagatest.New(tb, booking)
			s.Start(Booking{Guest: "g"})
			s.RequireStatus(saga.StatusCompleted)
		}, want: "sagatest: saga is running, want completed (last error: \"\")\nhistory:\n" +
			"  0s started                step=\"\" phase=action attempt=0 booking v1\n" +
			"  0s command-sent           step=\"hold\" phase=action attempt=1 hotel.hold\n"},
		{name: "reply before taking", fn: func(tb testing.TB) {
			s := sagatest.New(tb, booking)
			s.Start(Booking{Guest: "g"})
			s.ReplyFailure("x")
		}, want: "sagatest: no message taken yet; call ExpectCommand, ExpectCompensation or Next first"},
		{name: "reply with the wrong contract", fn: func(tb testing.TB) {
			s := sagatest.New(tb, booking)
			s.Start(Booking{Guest: "g"})
			s.Next()
			sagatest.ReplySuccess(s, free, saga.None{})
		}, want: "sagatest: replying as hotel.free to a hotel.hold message"},
		{name: "not started", fn: func(tb testing.TB) {
			sagatest.New(tb, booking).Advance(time.Second)
		}, want: "sagatest: saga not started; call Start first"},
		{name: "invalid operator action", fn: func(tb testing.TB) {
			s := sagatest.New(tb, booking)
			s.Start(Booking{Guest: "g"})
			s.Next()
			s.ReplyFailure("no")
			s.Abort("ops", "")
		}, want: "sagatest: apply abort event: invalid saga transition: abort saga " +
			sagatest.New(t, booking).ID().String() + ": only a running saga can be aborted, this one is compensated"},
		{name: "unknown step", fn: func(tb testing.TB) {
			s := sagatest.New(tb, booking)
			s.Start(Booking{Guest: "g"})
			s.RequireStepStatus("pay", saga.StepPending)
		}, want: `sagatest: no step "pay" in booking v1`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, failure(t, tt.fn))
		})
	}
}

func TestScenarioApplyReturnsErrors(t *testing.T) {
	t.Parallel()
	s := sagatest.New(t, booking)
	s.Start(Booking{Guest: "g"})
	_, err := s.Apply(saga.Event{Kind: saga.EventRetry})
	require.NoError(t, err)
	_, err = s.Apply(saga.Event{Kind: "nope"})
	require.ErrorIs(t, err, saga.ErrInvalidEvent)
	require.Equal(t, 1, s.Next().Attempt)
	require.Equal(t, 2, s.Next().Attempt, "the retry re-sent the command")
}

// HoldPublishing keeps messages unpublished: step timeouts wait, a
// schedule-to-start timeout fires, a withdrawn message is dropped.
func TestScenarioHoldPublishing(t *testing.T) {
	t.Parallel()
	def := saga.MustNew("booking", 1,
		saga.Step("hold",
			saga.Invoke(hold, func(b *Booking) HoldReq { return HoldReq{Guest: b.Guest} }, func(b *Booking, r HoldReply) { b.RoomID = r.RoomID }),
			saga.Compensate(free, func(b *Booking) FreeReq { return FreeReq{RoomID: b.RoomID} }),
			saga.WithTimeout[Booking](time.Minute),
			saga.WithScheduleToStartTimeout[Booking](5*time.Minute),
		),
	)
	s := sagatest.New(t, def)
	s.HoldPublishing(hold.Name()) // only hotel.hold has no queue
	s.Start(Booking{Guest: "ann"})
	require.Equal(t, []saga.MessageRef{{StepIndex: 0, Phase: saga.PhaseAction, Attempt: 1}}, s.Unpublished())
	s.Advance(4 * time.Minute)
	s.RequireStepStatus("hold", saga.StepRunning)
	s.Advance(time.Minute)
	s.RequireStepStatus("hold", saga.StepCompensating)
	require.Empty(t, s.Unpublished(), "the hold was withdrawn, the free is not held")
	require.Len(t, s.Pending(), 1, "the withdrawn hold is never delivered")
	sagatest.ExpectCompensation(s, free)
	sagatest.ReplySuccess(s, free, saga.None{})
	s.RequireStatus(saga.StatusCompensated)

	// Published late: the step's timeout counts from the publish.
	s = sagatest.New(t, def)
	s.HoldPublishing()
	s.Start(Booking{Guest: "bob"})
	s.Advance(3 * time.Minute)
	s.Publish()
	require.Empty(t, s.Unpublished())
	s.Advance(59 * time.Second)
	s.RequireStepStatus("hold", saga.StepRunning)
	s.Advance(time.Second)
	s.RequireStatus(saga.StatusCompensating)
}
