// Package sagatest drives a saga definition through scenarios in unit
// tests: no broker, no database, a fake clock. A Scenario applies events to
// the pure core exactly as the orchestrator would and queues the messages
// the saga emits, so that a test can check each command, answer it, let
// time pass and check the outcome:
//
//	s := sagatest.New(t, checkout)
//	s.Start(Order{ID: "o-1", Amount: 30})
//	req := sagatest.ExpectCommand(s, reserve)
//	sagatest.ReplySuccess(s, reserve, ReserveReply{ReservationID: "r-1"})
//	sagatest.ExpectCommand(s, charge)
//	s.ReplyFailure("card declined")
//	sagatest.ExpectCompensation(s, release)
//	sagatest.ReplySuccess(s, release, saga.None{})
//	s.RequireStatus(saga.StatusCompensated)
//
// Messages are published as soon as the saga emits them, unless the test
// holds them back (HoldPublishing): that is how a scenario plays a broker
// outage, or a command no queue takes, and a step's schedule-to-start
// timeout (saga.WithScheduleToStartTimeout).
package sagatest

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sagabox/sagabox/saga"
)

// Epoch is the time on a new Scenario's clock.
var Epoch = time.Date(2030, time.January, 1, 0, 0, 0, 0, time.UTC)

// maxTimersPerAdvance bounds the timers one Advance fires, so that a
// definition that keeps re-arming a deadline cannot hang a test.
const maxTimersPerAdvance = 1000

// Scenario runs one saga instance of a definition with data D. It is not
// safe for concurrent use. Methods that fail call t.Fatal.
type Scenario[D any] struct {
	t       testing.TB
	def     *saga.Definition[D]
	ctx     context.Context
	now     time.Time
	id      uuid.UUID
	inst    saga.Instance
	started bool
	queue   []saga.Outgoing
	last    *saga.Outgoing
	history []saga.HistoryEntry
	msgSeq  int
	// holding is set by HoldPublishing: emitted messages of the types
	// holdTypes (all when empty) join held.
	holding   bool
	holdTypes []string
	held      []heldMessage
}

// heldMessage is an emitted message still unpublished (HoldPublishing),
// and when it was emitted.
type heldMessage struct {
	ref saga.MessageRef
	at  time.Time
}

// New returns a scenario for def with its clock at Epoch. Local steps get
// t.Context() as their context.
func New[D any](t testing.TB, def *saga.Definition[D]) *Scenario[D] {
	t.Helper()
	if def == nil {
		t.Fatal("sagatest: definition is nil")
	}
	return &Scenario[D]{
		t:   t,
		def: def,
		ctx: t.Context(),
		now: Epoch,
		id:  uuid.NewSHA1(uuid.NameSpaceURL, []byte("sagatest:"+def.String())),
	}
}

// Now returns the scenario's clock.
func (s *Scenario[D]) Now() time.Time { return s.now }

// ID returns the saga's id.
func (s *Scenario[D]) ID() uuid.UUID { return s.id }

// Start starts the saga with data at the current time.
func (s *Scenario[D]) Start(data D) saga.Result {
	s.t.Helper()
	if s.started {
		s.t.Fatal("sagatest: saga already started")
	}
	raw, err := s.def.EncodeData(data)
	if err != nil {
		s.t.Fatalf("sagatest: %v", err)
	}
	res, err := s.def.Start(s.ctx, s.id, raw, s.now)
	if err != nil {
		s.t.Fatalf("sagatest: start: %v", err)
	}
	s.started = true
	s.take(res)
	return res
}

// Apply applies ev to the saga and returns the result and error as they
// are. A zero ev.At is set to the scenario's clock. On success the result
// is taken into the scenario (instance, queued messages, history).
func (s *Scenario[D]) Apply(ev saga.Event) (saga.Result, error) {
	s.t.Helper()
	s.requireStarted()
	if ev.At.IsZero() {
		ev.At = s.now
	}
	res, err := s.def.Apply(s.ctx, s.inst, ev)
	if err != nil {
		return res, err
	}
	s.take(res)
	return res, nil
}

// Deliver applies ev like Apply and fails the test on error.
func (s *Scenario[D]) Deliver(ev saga.Event) saga.Result {
	s.t.Helper()
	res, err := s.Apply(ev)
	if err != nil {
		s.t.Fatalf("sagatest: apply %s event: %v", ev.Kind, err)
	}
	return res
}

func (s *Scenario[D]) take(res saga.Result) {
	s.inst = res.Instance
	for _, r := range res.Withdraw {
		// Withdrawn from the outbox: never delivered.
		s.held = slices.DeleteFunc(s.held, func(h heldMessage) bool { return h.ref == r })
		s.queue = slices.DeleteFunc(s.queue, func(o saga.Outgoing) bool { return refOf(o) == r })
	}
	s.queue = append(s.queue, res.Emit...)
	if s.holding {
		for _, o := range res.Emit {
			if len(s.holdTypes) == 0 || slices.Contains(s.holdTypes, o.Type) {
				s.held = append(s.held, heldMessage{ref: refOf(o), at: s.now})
			}
		}
	}
	s.history = append(s.history, res.History...)
}

func refOf(o saga.Outgoing) saga.MessageRef {
	return saga.MessageRef{StepIndex: o.StepIndex, Phase: o.Phase, Attempt: o.Attempt}
}

// HoldPublishing keeps the messages the saga emits from now on
// unpublished, as the orchestrator's outbox does while the broker is down
// or the relay is stalled, until Publish; with commands, only the messages
// of those command types, as for commands no queue takes. The test
// can still take and answer them (Next, ExpectCommand, …). Meanwhile
// Advance delivers timers as the orchestrator's sweeper does: no step
// deadline fires, only schedule-to-start timeouts
// (saga.WithScheduleToStartTimeout), each timer listing the held messages
// in Event.Unpublished. A message the saga withdraws (Result.Withdraw) is
// dropped: it is never delivered.
func (s *Scenario[D]) HoldPublishing(commands ...string) {
	s.holding, s.holdTypes = true, slices.Clone(commands)
}

// Publish publishes the messages held back since HoldPublishing, now, and
// stops holding: as the orchestrator does for a command published late,
// the deadline of each step still waiting for one of them is pushed back
// by the time it waited, since a step's timeout counts from when the broker
// has its command.
func (s *Scenario[D]) Publish() {
	s.t.Helper()
	s.requireStarted()
	for _, h := range s.held {
		st := &s.inst.Steps[h.ref.StepIndex]
		waiting := (h.ref.Phase == saga.PhaseAction && st.Status == saga.StepRunning && st.Attempt == h.ref.Attempt) ||
			(h.ref.Phase == saga.PhaseCompensation && st.Status == saga.StepCompensating && st.CompensationAttempt == h.ref.Attempt)
		if waiting && !st.Deadline.IsZero() {
			st.Deadline = st.Deadline.Add(s.now.Sub(h.at))
		}
	}
	s.inst.Deadline = saga.EarliestDeadline(s.inst.Steps)
	s.held, s.holding, s.holdTypes = nil, false, nil
}

// Unpublished returns the messages held unpublished (see HoldPublishing).
func (s *Scenario[D]) Unpublished() []saga.MessageRef {
	out := make([]saga.MessageRef, len(s.held))
	for i, h := range s.held {
		out[i] = h.ref
	}
	return out
}

// nextTimer returns when the orchestrator's sweeper would deliver the next
// timer: at the instance's deadline, or, while messages are held
// unpublished, at the earliest schedule-to-start deadline (zero: none).
func (s *Scenario[D]) nextTimer() time.Time {
	if len(s.held) == 0 {
		return s.inst.Deadline
	}
	var due time.Time
	for _, st := range s.inst.Steps {
		if !st.StartBy.IsZero() && (due.IsZero() || st.StartBy.Before(due)) {
			due = st.StartBy
		}
	}
	return due
}

func (s *Scenario[D]) requireStarted() {
	s.t.Helper()
	if !s.started {
		s.t.Fatal("sagatest: saga not started; call Start first")
	}
}

// Next removes and returns the oldest emitted message that the test has not
// taken yet, and makes it the one ReplySuccess and ReplyFailure answer. It
// fails the test if there is none.
func (s *Scenario[D]) Next() saga.Outgoing {
	s.t.Helper()
	if len(s.queue) == 0 {
		s.t.Fatalf("sagatest: no message emitted; saga is %s\n%s", s.inst.Status, s.describe())
	}
	msg := s.queue[0]
	s.queue = s.queue[1:]
	s.last = &msg
	return msg
}

// Pending returns the emitted messages the test has not taken yet.
func (s *Scenario[D]) Pending() []saga.Outgoing {
	return append([]saga.Outgoing(nil), s.queue...)
}

// RequireNoMessage fails the test if a message is waiting to be taken.
func (s *Scenario[D]) RequireNoMessage() {
	s.t.Helper()
	if len(s.queue) > 0 {
		m := s.queue[0]
		s.t.Fatalf("sagatest: unexpected %s %s for step %q (attempt %d), %d message(s) pending",
			m.Phase, m.Type, m.Step, m.Attempt, len(s.queue))
	}
}

// ExpectCommand takes the next emitted message (see Scenario.Next), fails
// the test unless it is cmd's action command, and returns its request.
func ExpectCommand[D, Req, Reply any](s *Scenario[D], cmd saga.Command[Req, Reply]) Req {
	s.t.Helper()
	return expect(s, cmd, saga.PhaseAction)
}

// ExpectCompensation takes the next emitted message, fails the test unless
// it is cmd sent as a compensation, and returns its request.
func ExpectCompensation[D, Req, Reply any](s *Scenario[D], cmd saga.Command[Req, Reply]) Req {
	s.t.Helper()
	return expect(s, cmd, saga.PhaseCompensation)
}

func expect[D, Req, Reply any](s *Scenario[D], cmd saga.Command[Req, Reply], phase saga.Phase) Req {
	s.t.Helper()
	msg := s.Next()
	if msg.Type != cmd.Name() || msg.Phase != phase {
		s.t.Fatalf("sagatest: expected %s %s, got %s %s for step %q (attempt %d)",
			phase, cmd.Name(), msg.Phase, msg.Type, msg.Step, msg.Attempt)
	}
	req, err := cmd.DecodeRequest(msg.Payload)
	if err != nil {
		s.t.Fatalf("sagatest: %v", err)
	}
	return req
}

// ReplySuccess answers the message last taken (by Next, ExpectCommand or
// ExpectCompensation), which must be cmd, with a success reply.
func ReplySuccess[D, Req, Reply any](s *Scenario[D], cmd saga.Command[Req, Reply], reply Reply) saga.Result {
	s.t.Helper()
	return ReplySuccessTo(s, s.lastTaken(), cmd, reply)
}

// ReplySuccessTo answers msg, any message taken earlier, with a success
// reply: use it for late or duplicate replies.
func ReplySuccessTo[D, Req, Reply any](s *Scenario[D], msg saga.Outgoing, cmd saga.Command[Req, Reply], reply Reply) saga.Result {
	s.t.Helper()
	if msg.Type != cmd.Name() {
		s.t.Fatalf("sagatest: replying as %s to a %s message", cmd.Name(), msg.Type)
	}
	payload, err := cmd.EncodeReply(reply)
	if err != nil {
		s.t.Fatalf("sagatest: %v", err)
	}
	return s.Deliver(s.replyEvent(msg, saga.EventReplySuccess, payload))
}

// SendEvent delivers the outside event ev with payload v and the sender's
// id eventID, as orchestrator.SendEvent does. The result says whether the
// step waiting for it consumed it (Ignored is false) or not (the
// orchestrator keeps such an event until a step waits for it).
func SendEvent[D, T any](s *Scenario[D], ev saga.EventType[T], eventID string, v T) saga.Result {
	s.t.Helper()
	payload, err := ev.Encode(v)
	if err != nil {
		s.t.Fatalf("sagatest: %v", err)
	}
	return s.Deliver(saga.Event{Kind: saga.EventOutside, Type: ev.Name(), Payload: payload, EventID: eventID})
}

// ReplyFailure answers the message last taken with a failure reply carrying
// reason: a rejection of an action, or a compensation that could not be
// performed.
func (s *Scenario[D]) ReplyFailure(reason string) saga.Result {
	s.t.Helper()
	return s.ReplyFailureTo(s.lastTaken(), reason)
}

// ReplyFailureTo answers msg, any message taken earlier, with a failure
// reply carrying reason.
func (s *Scenario[D]) ReplyFailureTo(msg saga.Outgoing, reason string) saga.Result {
	s.t.Helper()
	payload, err := json.Marshal(saga.Failure{Reason: reason})
	if err != nil {
		s.t.Fatalf("sagatest: %v", err)
	}
	return s.Deliver(s.replyEvent(msg, saga.EventReplyFailure, payload))
}

func (s *Scenario[D]) lastTaken() saga.Outgoing {
	s.t.Helper()
	if s.last == nil {
		s.t.Fatal("sagatest: no message taken yet; call ExpectCommand, ExpectCompensation or Next first")
	}
	return *s.last
}

func (s *Scenario[D]) replyEvent(msg saga.Outgoing, kind saga.EventKind, payload []byte) saga.Event {
	s.msgSeq++
	return saga.Event{
		Kind: kind, Type: msg.Type, Step: msg.Step, StepIndex: msg.StepIndex, Attempt: msg.Attempt, Run: msg.Run,
		Payload: payload, MessageID: uuid.NewSHA1(s.id, fmt.Appendf(nil, "reply-%d", s.msgSeq)), At: s.now,
	}
}

// Advance moves the clock forward by d, firing each deadline that falls
// due on the way at its own time, as a prompt deadline sweeper would
// (while messages are held unpublished, see HoldPublishing).
func (s *Scenario[D]) Advance(d time.Duration) {
	s.t.Helper()
	if d < 0 {
		s.t.Fatalf("sagatest: Advance(%s): negative duration", d)
	}
	s.requireStarted()
	target := s.now.Add(d)
	for range maxTimersPerAdvance {
		due := s.nextTimer()
		if due.IsZero() || due.After(target) {
			s.now = target
			return
		}
		if due.After(s.now) {
			s.now = due
		}
		res := s.Deliver(saga.Event{Kind: saga.EventTimer, At: s.now, Unpublished: s.Unpublished()})
		if res.Ignored {
			s.t.Fatalf("sagatest: timer at %s ignored: %s", s.now, res.IgnoreReason)
		}
	}
	s.t.Fatalf("sagatest: Advance(%s) fired more than %d timers", d, maxTimersPerAdvance)
}

// Abort applies an operator abort (EventAbort, the former name of
// EventCancel).
func (s *Scenario[D]) Abort(actor, reason string) saga.Result {
	s.t.Helper()
	return s.Deliver(saga.Event{Kind: saga.EventAbort, Actor: actor, Reason: reason})
}

// Cancel applies a cancel: the step in flight and the completed steps are
// compensated.
func (s *Scenario[D]) Cancel(actor, reason string) saga.Result {
	s.t.Helper()
	return s.Deliver(saga.Event{Kind: saga.EventCancel, Actor: actor, Reason: reason})
}

// Terminate applies a terminate: the saga stops at once, compensating
// nothing.
func (s *Scenario[D]) Terminate(actor, reason string) saga.Result {
	s.t.Helper()
	return s.Deliver(saga.Event{Kind: saga.EventTerminate, Actor: actor, Reason: reason})
}

// Restart applies an operator restart (EventRestart) of the failed or
// compensated saga from the step or parallel group called from, with its
// stored data. The scenario's definition may be a newer version of the one
// that ran the saga so far: see Restarted.
func (s *Scenario[D]) Restart(from, actor, reason string) saga.Result {
	s.t.Helper()
	return s.Deliver(saga.Event{Kind: saga.EventRestart, Step: from, Actor: actor, Reason: reason})
}

// RestartWithData is Restart with the saga's data replaced by data.
func (s *Scenario[D]) RestartWithData(from string, data D, actor, reason string) saga.Result {
	s.t.Helper()
	payload, err := json.Marshal(data)
	if err != nil {
		s.t.Fatalf("sagatest: encode data: %v", err)
	}
	return s.Deliver(saga.Event{Kind: saga.EventRestart, Step: from, Payload: payload, Actor: actor, Reason: reason})
}

// Restarted returns a scenario of def, a newer version of the definition
// of s, that continues with s's saga, clock and pending messages: restart
// it with Restart to move the saga to def.
func Restarted[D any](s *Scenario[D], def *saga.Definition[D]) *Scenario[D] {
	s.t.Helper()
	s.requireStarted()
	n := New(s.t, def)
	n.id, n.now, n.inst, n.started = s.id, s.now, s.inst, true
	n.queue, n.history, n.msgSeq = append(n.queue, s.queue...), append(n.history, s.history...), s.msgSeq
	n.holding, n.holdTypes, n.held = s.holding, s.holdTypes, slices.Clone(s.held)
	return n
}

// Retry applies an operator retry.
func (s *Scenario[D]) Retry(actor, reason string) saga.Result {
	s.t.Helper()
	return s.Deliver(saga.Event{Kind: saga.EventRetry, Actor: actor, Reason: reason})
}

// Instance returns the saga's current state.
func (s *Scenario[D]) Instance() saga.Instance {
	s.t.Helper()
	s.requireStarted()
	return s.inst
}

// Status returns the saga's status.
func (s *Scenario[D]) Status() saga.Status { return s.Instance().Status }

// Data returns the saga's current typed data.
func (s *Scenario[D]) Data() D {
	s.t.Helper()
	s.requireStarted()
	d, err := s.def.DecodeData(s.inst.Data)
	if err != nil {
		s.t.Fatalf("sagatest: %v", err)
	}
	return d
}

// History returns every history entry recorded so far, in order.
func (s *Scenario[D]) History() []saga.HistoryEntry {
	return append([]saga.HistoryEntry(nil), s.history...)
}

// RequireStatus fails the test, printing the history, unless the saga's
// status is want.
func (s *Scenario[D]) RequireStatus(want saga.Status) {
	s.t.Helper()
	s.requireStarted()
	if s.inst.Status != want {
		s.t.Fatalf("sagatest: saga is %s, want %s (last error: %q)\n%s", s.inst.Status, want, s.inst.LastError, s.describe())
	}
}

// RequireStepStatus fails the test unless the step called step has status
// want.
func (s *Scenario[D]) RequireStepStatus(step string, want saga.StepStatus) {
	s.t.Helper()
	s.requireStarted()
	for _, st := range s.inst.Steps {
		if st.Name == step {
			if st.Status != want {
				s.t.Fatalf("sagatest: step %q is %s, want %s\n%s", step, st.Status, want, s.describe())
			}
			return
		}
	}
	s.t.Fatalf("sagatest: no step %q in %s", step, s.def)
}

// describe renders the history for failure messages.
func (s *Scenario[D]) describe() string {
	var b strings.Builder
	b.WriteString("history:\n")
	for _, h := range s.history {
		fmt.Fprintf(&b, "  %s %-22s step=%q phase=%s attempt=%d %s\n",
			h.At.Sub(Epoch), h.Event, h.Step, h.Phase, h.Attempt, h.Detail)
	}
	return b.String()
}
