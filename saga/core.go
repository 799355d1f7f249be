package saga

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
)

// Runner runs one saga definition with its data type erased, so that the
// orchestrator can drive every registered definition the same way with the
// data as JSON. *Definition[D] implements it. Implementations are pure:
// besides a definition's local steps (which receive ctx), Start and Apply
// perform no I/O and read no clock, and they never modify their arguments.
type Runner interface {
	// Name returns the definition's name (the saga type).
	Name() string
	// Version returns the definition's version.
	Version() int
	// Steps describes the definition's steps, in order.
	Steps() []StepInfo

	// Start creates the instance id of the saga with the JSON data at time
	// now: it skips the leading steps whose predicate is false, runs leading
	// local steps, and emits the first step's command (attempt 1, deadline
	// now+timeout). A saga whose steps are all skipped or local completes at
	// once; a local step's rejection compensates at once.
	//
	// An error means nothing happened: malformed data (ErrInvalidPayload),
	// or a local step that failed without rejecting, which the orchestrator
	// retries by retrying its transaction.
	Start(ctx context.Context, id uuid.UUID, data json.RawMessage, now time.Time) (Result, error)

	// Apply decides what the saga inst does after ev. It returns the new
	// instance, the messages to emit and the history to record; the caller
	// stores all of them in one transaction.
	//
	// Replies (EventReplySuccess, EventReplyFailure) are accepted only for
	// the step in flight (ev.StepIndex and ev.Step equal to the current step)
	// and its phase (ev.Type equal to the name of the action command while
	// running, of the compensation while compensating), whatever ev.Attempt
	// (the participant's barrier ran the command at most once, so a late
	// reply to an earlier attempt is the real answer; only an attempt never
	// sent is refused). Any other reply (duplicate, stale, wrong type, for a
	// finished saga) is ignored: Result.Ignored is set, with a reason and a
	// HistoryReplyIgnored entry, and the instance is unchanged. A success
	// reply whose payload does not decode into the command's reply type is
	// an error wrapping ErrInvalidPayload: a broken contract to dead-letter.
	//
	//   - Action success: the reply is applied to the data, the step
	//     succeeds and the saga moves to the next step (skipping steps whose
	//     predicate is false and running local steps), or completes.
	//   - Action failure: the step is rejected (it did nothing and is not
	//     compensated) and compensation starts with the previous step.
	//   - Compensation success: the step is compensated and compensation
	//     moves to the previous step. Steps that did not succeed, and steps
	//     without a compensation, are passed over; when none is left the saga
	//     is compensated.
	//   - Compensation failure: the saga is failed, LastError is the reason.
	//
	// EventTimer is delivered when Instance.Deadline has passed; one whose
	// ev.At is before the current step's deadline is ignored (no history).
	// For a running action with attempts left, the step waits for
	// RetryPolicy.Backoff and is then re-sent with Attempt+1 and a fresh
	// deadline; with none left, compensation starts with the step's own
	// compensation (it may have run; the participant's barrier makes it a
	// no-op otherwise), then the earlier steps in reverse order. For a
	// compensation with a compensation timeout, it is re-sent.
	//
	// EventRetry (operator) re-sends what is in flight with attempt+1: the
	// action of a running saga, the compensation of a compensating one, or
	// the failed compensation of a failed one, which becomes compensating
	// again. EventAbort (operator) compensates a running saga like an
	// exhausted timeout. Either one in another status is an error wrapping
	// ErrInvalidTransition.
	//
	// Other errors: an instance of another definition or a corrupt one
	// (ErrInvalidInstance), an unknown event kind or an event without At
	// (ErrInvalidEvent), or a local step that failed without rejecting.
	Apply(ctx context.Context, inst Instance, ev Event) (Result, error)
}

var _ Runner = (*Definition[struct{}])(nil)

// Start implements Runner.
func (def *Definition[D]) Start(ctx context.Context, id uuid.UUID, data json.RawMessage, now time.Time) (Result, error) {
	if id == uuid.Nil {
		return Result{}, fmt.Errorf("%w: start saga %s: id is nil", ErrInvalidInstance, def)
	}
	if now.IsZero() {
		return Result{}, fmt.Errorf("%w: start saga %s %s: time is zero", ErrInvalidEvent, def, id)
	}
	d, err := def.DecodeData(data)
	if err != nil {
		return Result{}, fmt.Errorf("start saga %s: %w", id, err)
	}
	m := &machine[D]{def: def, ctx: ctx, data: d, now: now.UTC()}
	m.inst = Instance{
		ID:          id,
		Type:        def.name,
		Version:     def.version,
		Status:      StatusRunning,
		Phase:       PhaseAction,
		CurrentStep: -1,
		Steps:       make([]StepState, len(def.steps)),
	}
	for i, s := range def.steps {
		m.inst.Steps[i] = StepState{Name: s.name, Status: StepPending}
	}
	m.record(HistoryEntry{Event: HistoryStarted, StepIndex: -1, Phase: PhaseAction, Detail: def.String()})
	if err := m.advance(0); err != nil {
		return Result{}, err
	}
	return m.finish()
}

// Apply implements Runner.
func (def *Definition[D]) Apply(ctx context.Context, inst Instance, ev Event) (Result, error) {
	if err := def.checkInstance(inst); err != nil {
		return Result{}, err
	}
	if ev.At.IsZero() {
		return Result{}, fmt.Errorf("%w: %s event for saga %s has no time", ErrInvalidEvent, ev.Kind, inst.ID)
	}
	d, err := def.DecodeData(inst.Data)
	if err != nil {
		return Result{}, fmt.Errorf("%w: saga %s: %w", ErrInvalidInstance, inst.ID, err)
	}
	m := &machine[D]{def: def, ctx: ctx, data: d, now: ev.At.UTC(), ev: &ev}
	m.inst = inst
	m.inst.Steps = slices.Clone(inst.Steps)
	switch ev.Kind {
	case EventReplySuccess, EventReplyFailure:
		err = m.reply()
	case EventTimer:
		err = m.timer()
	case EventRetry:
		err = m.retry()
	case EventAbort:
		err = m.abort()
	default:
		err = fmt.Errorf("%w: saga %s: unknown event kind %q", ErrInvalidEvent, inst.ID, ev.Kind)
	}
	if err != nil {
		return Result{}, err
	}
	if m.res.Ignored {
		m.res.Instance = inst
		return m.res, nil
	}
	return m.finish()
}

// checkInstance verifies that inst belongs to def and is consistent.
func (def *Definition[D]) checkInstance(inst Instance) error {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("%w: saga %s: %s", ErrInvalidInstance, inst.ID, fmt.Sprintf(format, args...))
	}
	if inst.Type != def.name || inst.Version != def.version {
		return fail("instance is of %s v%d, not %s", inst.Type, inst.Version, def)
	}
	if !inst.Status.Valid() {
		return fail("unknown status %q", inst.Status)
	}
	if inst.Phase != PhaseAction && inst.Phase != PhaseCompensation {
		return fail("unknown phase %q", inst.Phase)
	}
	if len(inst.Steps) != len(def.steps) {
		return fail("%d step states for %d steps", len(inst.Steps), len(def.steps))
	}
	for i, s := range def.steps {
		if inst.Steps[i].Name != s.name {
			return fail("step state %d is for step %q, want %q", i, inst.Steps[i].Name, s.name)
		}
	}
	inFlight := inst.Status == StatusRunning || inst.Status == StatusCompensating || inst.Status == StatusFailed
	if inFlight && (inst.CurrentStep < 0 || inst.CurrentStep >= len(def.steps)) {
		return fail("current step %d out of range for a %s saga", inst.CurrentStep, inst.Status)
	}
	return nil
}

// machine is the working state of one Start or Apply.
type machine[D any] struct {
	def  *Definition[D]
	ctx  context.Context
	inst Instance
	data D
	now  time.Time
	ev   *Event // nil for Start
	res  Result
}

// finish encodes the data, computes the instance deadline and returns the
// result.
func (m *machine[D]) finish() (Result, error) {
	b, err := json.Marshal(m.data)
	if err != nil {
		return Result{}, fmt.Errorf("encode data of saga %s: %w", m.inst.ID, err)
	}
	m.inst.Data = b
	m.inst.Deadline = time.Time{}
	for _, st := range m.inst.Steps {
		if !st.Deadline.IsZero() && (m.inst.Deadline.IsZero() || st.Deadline.Before(m.inst.Deadline)) {
			m.inst.Deadline = st.Deadline
		}
	}
	m.res.Instance = m.inst
	return m.res, nil
}

// record appends a history entry at the current time. e.StepIndex must be
// set (-1 for a saga-level entry); the step name is filled in.
func (m *machine[D]) record(e HistoryEntry) {
	e.At = m.now
	if e.StepIndex >= 0 {
		e.Step = m.def.steps[e.StepIndex].name
	}
	m.res.History = append(m.res.History, e)
}

func (m *machine[D]) errorf(i int, format string, args ...any) error {
	return fmt.Errorf("saga %s %s: step %q: %w", m.def, m.inst.ID, m.def.steps[i].name, fmt.Errorf(format, args...))
}

// advance runs the action phase from step i on: it skips steps whose
// predicate is false, runs local steps, and sends the first command step's
// action, or completes the saga.
func (m *machine[D]) advance(i int) error {
	for ; i < len(m.def.steps); i++ {
		s, st := m.def.steps[i], &m.inst.Steps[i]
		st.StartedAt = m.now
		if s.when != nil && !s.when(&m.data) {
			st.Status, st.FinishedAt = StepSkipped, m.now
			m.record(HistoryEntry{Event: HistoryStepSkipped, StepIndex: i, Phase: PhaseAction, Detail: "predicate returned false"})
			continue
		}
		if !s.isLocal {
			m.inst.CurrentStep = i
			return m.sendAction(i, 1)
		}
		rejected, err := m.runLocal(s)
		if err != nil {
			return m.errorf(i, "local step: %w", err)
		}
		st.FinishedAt = m.now
		if rejected != nil {
			reason := rejected.Error()
			st.Status, st.LastError, m.inst.LastError = StepRejected, reason, reason
			m.record(HistoryEntry{Event: HistoryStepRejected, StepIndex: i, Phase: PhaseAction, Detail: reason})
			return m.compensateFrom(i - 1)
		}
		st.Status = StepSucceeded
		m.record(HistoryEntry{Event: HistoryLocalStepSucceeded, StepIndex: i, Phase: PhaseAction})
	}
	m.inst.Status, m.inst.CurrentStep = StatusCompleted, -1
	m.record(HistoryEntry{Event: HistoryCompleted, StepIndex: -1, Phase: PhaseAction})
	return nil
}

// runLocal runs a local step. It returns the rejection if the step
// rejected, in which case the data is restored to what it was before, or
// the error if it failed otherwise.
func (m *machine[D]) runLocal(s *StepSpec[D]) (rejected, err error) {
	before, err := json.Marshal(m.data)
	if err != nil {
		return nil, fmt.Errorf("encode data: %w", err)
	}
	err = runScoped(m.ctx, func(ctx context.Context) error { return s.local(ctx, &m.data) })
	if err == nil {
		return nil, nil
	}
	if !errors.Is(err, ErrRejected) {
		return nil, err
	}
	var d D
	if uerr := json.Unmarshal(before, &d); uerr != nil {
		return nil, fmt.Errorf("restore data: %w", uerr)
	}
	m.data = d
	return err, nil
}

// sendAction emits attempt of step i's action.
func (m *machine[D]) sendAction(i, attempt int) error {
	s, st := m.def.steps[i], &m.inst.Steps[i]
	payload, err := s.action.request(&m.data)
	if err != nil {
		return m.errorf(i, "build action request: %w", err)
	}
	st.Status, st.Attempt, st.Deadline = StepRunning, attempt, m.after(s.timeout)
	m.res.Emit = append(m.res.Emit, Outgoing{
		Type: s.action.command, Phase: PhaseAction, Step: s.name, StepIndex: i, Attempt: attempt, Payload: payload,
	})
	m.record(HistoryEntry{Event: HistoryCommandSent, StepIndex: i, Phase: PhaseAction, Attempt: attempt, Detail: s.action.command})
	return nil
}

// sendCompensation emits attempt of step i's compensation and makes it the
// current step of a compensating saga.
func (m *machine[D]) sendCompensation(i, attempt int) error {
	s, st := m.def.steps[i], &m.inst.Steps[i]
	payload, err := s.compensation.request(&m.data)
	if err != nil {
		return m.errorf(i, "build compensation request: %w", err)
	}
	st.Status, st.CompensationAttempt, st.Deadline = StepCompensating, attempt, m.after(s.compTimeout)
	m.inst.Status, m.inst.Phase, m.inst.CurrentStep = StatusCompensating, PhaseCompensation, i
	m.res.Emit = append(m.res.Emit, Outgoing{
		Type: s.compensation.command, Phase: PhaseCompensation, Step: s.name, StepIndex: i, Attempt: attempt, Payload: payload,
	})
	m.record(HistoryEntry{Event: HistoryCompensationSent, StepIndex: i, Phase: PhaseCompensation, Attempt: attempt, Detail: s.compensation.command})
	return nil
}

// after returns now+d, or the zero time when d is zero (no timeout).
func (m *machine[D]) after(d time.Duration) time.Time {
	if d <= 0 {
		return time.Time{}
	}
	return m.now.Add(d)
}

// compensateFrom sends the compensation of the latest succeeded step at or
// before i that has one, or marks the saga compensated when there is none.
func (m *machine[D]) compensateFrom(i int) error {
	m.inst.Phase = PhaseCompensation
	for ; i >= 0; i-- {
		if m.inst.Steps[i].Status != StepSucceeded {
			continue
		}
		if m.def.steps[i].compensation == nil {
			m.record(HistoryEntry{Event: HistoryCompensationSkipped, StepIndex: i, Phase: PhaseCompensation, Detail: "no compensation"})
			continue
		}
		return m.sendCompensation(i, 1)
	}
	m.inst.Status, m.inst.CurrentStep = StatusCompensated, -1
	m.record(HistoryEntry{Event: HistoryCompensated, StepIndex: -1, Phase: PhaseCompensation})
	return nil
}

// abandon compensates from step i, whose action is in flight and may have
// run: its own compensation first, if it has one; otherwise it is marked
// status (timed out or aborted) and the earlier steps are compensated.
func (m *machine[D]) abandon(i int, status StepStatus) error {
	if m.def.steps[i].compensation != nil {
		return m.sendCompensation(i, 1)
	}
	st := &m.inst.Steps[i]
	st.Status, st.FinishedAt, st.Deadline = status, m.now, time.Time{}
	m.record(HistoryEntry{Event: HistoryCompensationSkipped, StepIndex: i, Phase: PhaseCompensation, Detail: "no compensation"})
	return m.compensateFrom(i - 1)
}

// ignore marks the event as ignored; a reply also gets a history entry.
func (m *machine[D]) ignore(reason string) {
	m.res.Ignored, m.res.IgnoreReason = true, reason
	if m.ev.Kind == EventReplySuccess || m.ev.Kind == EventReplyFailure {
		m.res.History = append(m.res.History, HistoryEntry{
			At: m.now, Event: HistoryReplyIgnored, Step: m.ev.Step, StepIndex: m.ev.StepIndex,
			Phase: m.inst.Phase, Attempt: m.ev.Attempt, Detail: reason, MessageID: m.ev.MessageID,
		})
	}
}

// staleReply returns why the reply does not belong to the step and phase in
// flight, or "" if it does.
func (m *machine[D]) staleReply() string {
	ev, inst := m.ev, &m.inst
	if inst.Status != StatusRunning && inst.Status != StatusCompensating {
		return fmt.Sprintf("%s reply %q for step %q: the saga is %s", ev.Kind, ev.Type, ev.Step, inst.Status)
	}
	i := inst.CurrentStep
	s, st := m.def.steps[i], &inst.Steps[i]
	if ev.StepIndex != i || ev.Step != s.name {
		return fmt.Sprintf("%s reply %q for step %q (index %d): the current step is %q (index %d)", ev.Kind, ev.Type, ev.Step, ev.StepIndex, s.name, i)
	}
	var want string
	var sent int
	var inFlight bool
	if inst.Phase == PhaseAction {
		if s.action != nil && !s.isLocal {
			want = s.action.command
		}
		sent, inFlight = st.Attempt, st.Status == StepRunning || st.Status == StepWaitingRetry
	} else {
		if s.compensation != nil {
			want = s.compensation.command
		}
		sent, inFlight = st.CompensationAttempt, st.Status == StepCompensating
	}
	switch {
	case ev.Type != want:
		return fmt.Sprintf("%s reply %q for step %q: the step's %s command is %q", ev.Kind, ev.Type, s.name, inst.Phase, want)
	case !inFlight:
		return fmt.Sprintf("%s reply %q for step %q: the step is %s", ev.Kind, ev.Type, s.name, st.Status)
	case ev.Attempt > sent:
		return fmt.Sprintf("%s reply %q for step %q: attempt %d was never sent (last sent: %d)", ev.Kind, ev.Type, s.name, ev.Attempt, sent)
	}
	return ""
}

// failureReason returns the reason of a failure reply: ev.Reason, or the
// decoded Failure's reason and code.
func failureReason(ev *Event) string {
	if ev.Reason != "" {
		return ev.Reason
	}
	if len(ev.Payload) == 0 {
		return "failure reply without a reason"
	}
	f, err := DecodeFailure(ev.Payload)
	switch {
	case err != nil:
		return fmt.Sprintf("failure reply with an undecodable payload: %v", err)
	case f.Reason == "" && f.Code == "":
		return "failure reply without a reason"
	case f.Code == "":
		return f.Reason
	case f.Reason == "":
		return f.Code
	}
	return fmt.Sprintf("%s (%s)", f.Reason, f.Code)
}

func (m *machine[D]) reply() error {
	if reason := m.staleReply(); reason != "" {
		m.ignore(reason)
		return nil
	}
	ev, i := m.ev, m.inst.CurrentStep
	s, st := m.def.steps[i], &m.inst.Steps[i]
	entry := HistoryEntry{StepIndex: i, Phase: m.inst.Phase, Attempt: ev.Attempt, MessageID: ev.MessageID}
	st.Deadline = time.Time{}
	switch {
	case m.inst.Phase == PhaseAction && ev.Kind == EventReplySuccess:
		if err := s.action.apply(&m.data, ev.Payload); err != nil {
			return m.errorf(i, "apply reply: %w", err)
		}
		st.Status, st.FinishedAt = StepSucceeded, m.now
		m.resolve(st)
		entry.Event = HistoryReplyApplied
		m.record(entry)
		return m.advance(i + 1)
	case m.inst.Phase == PhaseAction:
		reason := failureReason(ev)
		st.Status, st.FinishedAt, st.LastError, m.inst.LastError = StepRejected, m.now, reason, reason
		entry.Event, entry.Detail = HistoryStepRejected, reason
		m.record(entry)
		return m.compensateFrom(i - 1)
	case ev.Kind == EventReplySuccess:
		st.Status, st.FinishedAt = StepCompensated, m.now
		if st.LastError != m.inst.LastError {
			// A compensation failure an operator's retry repaired; the
			// saga's own reason (why it compensates) stays.
			st.LastError = ""
		}
		entry.Event = HistoryStepCompensated
		m.record(entry)
		return m.compensateFrom(i - 1)
	default:
		reason := failureReason(ev)
		st.Status, st.FinishedAt, st.LastError = StepCompensationFailed, m.now, reason
		m.inst.Status, m.inst.LastError = StatusFailed, reason
		entry.Event, entry.Detail = HistoryCompensationFailed, reason
		m.record(entry)
		m.record(HistoryEntry{Event: HistoryFailed, StepIndex: -1, Phase: PhaseCompensation, Detail: reason})
		return nil
	}
}

// resolve clears the failure reason of step st, whose action has just
// succeeded (after a timeout or an operator retry). If the saga's LastError
// was that reason, it is cleared too: a saga's LastError never names a
// failure that a later attempt repaired.
func (m *machine[D]) resolve(st *StepState) {
	if st.LastError == "" {
		return
	}
	if m.inst.LastError == st.LastError {
		m.inst.LastError = ""
	}
	st.LastError = ""
}

// compensationCause returns why the saga compensates: the reason of its
// rejected, timed-out or aborted step, or "" when no such step is left.
func (m *machine[D]) compensationCause() string {
	for _, st := range m.inst.Steps {
		switch st.Status {
		case StepRejected, StepTimedOut, StepAborted:
			return st.LastError
		}
	}
	return ""
}

func (m *machine[D]) timer() error {
	if m.inst.Status != StatusRunning && m.inst.Status != StatusCompensating {
		m.ignore(fmt.Sprintf("timer: the saga is %s", m.inst.Status))
		return nil
	}
	i := m.inst.CurrentStep
	s, st := m.def.steps[i], &m.inst.Steps[i]
	if st.Deadline.IsZero() {
		m.ignore(fmt.Sprintf("timer: step %q has no deadline", s.name))
		return nil
	}
	if m.now.Before(st.Deadline) {
		m.ignore(fmt.Sprintf("timer: step %q deadline %s not reached", s.name, st.Deadline.Format(time.RFC3339Nano)))
		return nil
	}
	switch st.Status {
	case StepRunning:
		m.record(HistoryEntry{Event: HistoryTimedOut, StepIndex: i, Phase: PhaseAction, Attempt: st.Attempt, Detail: s.timeout.String()})
		if st.Attempt < s.retry.MaxAttempts {
			delay := s.retry.Backoff(st.Attempt)
			st.Status, st.Deadline = StepWaitingRetry, m.now.Add(delay)
			st.LastError = fmt.Sprintf("attempt %d timed out after %s", st.Attempt, s.timeout)
			m.record(HistoryEntry{Event: HistoryRetryScheduled, StepIndex: i, Phase: PhaseAction, Attempt: st.Attempt + 1, Detail: "in " + delay.String()})
			return nil
		}
		reason := fmt.Sprintf("step %q timed out after %d attempt(s) of %s", s.name, st.Attempt, s.timeout)
		st.LastError, m.inst.LastError = reason, reason
		return m.abandon(i, StepTimedOut)
	case StepWaitingRetry:
		return m.sendAction(i, st.Attempt+1)
	case StepCompensating:
		m.record(HistoryEntry{Event: HistoryTimedOut, StepIndex: i, Phase: PhaseCompensation, Attempt: st.CompensationAttempt, Detail: s.compTimeout.String()})
		return m.sendCompensation(i, st.CompensationAttempt+1)
	}
	m.ignore(fmt.Sprintf("timer: step %q is %s", s.name, st.Status))
	return nil
}

func (m *machine[D]) retry() error {
	i := m.inst.CurrentStep
	entry := HistoryEntry{Event: HistoryRetried, StepIndex: i, Phase: m.inst.Phase, Detail: m.ev.Reason, Actor: m.ev.Actor}
	switch m.inst.Status {
	case StatusRunning:
		st := &m.inst.Steps[i]
		if st.Status != StepRunning && st.Status != StepWaitingRetry {
			break
		}
		entry.Attempt = st.Attempt + 1
		m.record(entry)
		return m.sendAction(i, st.Attempt+1)
	case StatusCompensating, StatusFailed:
		st := &m.inst.Steps[i]
		if st.Status != StepCompensating && st.Status != StepCompensationFailed {
			break
		}
		entry.Attempt = st.CompensationAttempt + 1
		m.record(entry)
		if cause := m.compensationCause(); m.inst.Status == StatusFailed && cause != "" {
			// Compensating again: the saga's reason is again why it
			// compensates; the step keeps its compensation failure until
			// the retried compensation succeeds.
			m.inst.LastError = cause
		}
		return m.sendCompensation(i, st.CompensationAttempt+1)
	default:
		return fmt.Errorf("%w: retry saga %s: a %s saga has nothing to retry", ErrInvalidTransition, m.inst.ID, m.inst.Status)
	}
	return fmt.Errorf("%w: saga %s: current step %d is %s", ErrInvalidInstance, m.inst.ID, i, m.inst.Steps[i].Status)
}

func (m *machine[D]) abort() error {
	if m.inst.Status != StatusRunning {
		return fmt.Errorf("%w: abort saga %s: only a running saga can be aborted, this one is %s", ErrInvalidTransition, m.inst.ID, m.inst.Status)
	}
	i := m.inst.CurrentStep
	st := &m.inst.Steps[i]
	if st.Status != StepRunning && st.Status != StepWaitingRetry {
		return fmt.Errorf("%w: saga %s: current step %d is %s", ErrInvalidInstance, m.inst.ID, i, st.Status)
	}
	reason := "aborted"
	if m.ev.Actor != "" {
		reason += " by " + m.ev.Actor
	}
	if m.ev.Reason != "" {
		reason += ": " + m.ev.Reason
	}
	st.LastError, m.inst.LastError = reason, reason
	m.record(HistoryEntry{Event: HistoryAborted, StepIndex: i, Phase: PhaseAction, Attempt: st.Attempt, Detail: m.ev.Reason, Actor: m.ev.Actor})
	return m.abandon(i, StepAborted)
}
