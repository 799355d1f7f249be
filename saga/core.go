package saga

import (
	"bytes"
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
	// compensation with a compensation timeout, it is re-sent. While
	// ev.Unpublished lists a message of the saga, no such deadline fires;
	// a step's schedule-to-start timeout (WithScheduleToStartTimeout)
	// does, when its command in flight is listed: an action then counts as
	// timed out with no attempt left (the span's unpublished actions are
	// listed in Result.Withdraw), a compensation as failed. A StartBy
	// passed whose command is not listed (it was published) is cleared, with
	// no history.
	//
	// EventRetry (operator) re-sends what is in flight with attempt+1: the
	// action of a running saga, the compensation of a compensating one, or
	// the failed compensation of a failed one, which becomes compensating
	// again. EventCancel (and its former name EventAbort) compensates a
	// running saga like an exhausted timeout. EventTerminate stops a
	// running, compensating or failed saga at once: the step in flight is
	// marked StepTerminated, nothing is sent and the saga is terminated.
	// Any of them in another status is an error wrapping
	// ErrInvalidTransition.
	//
	// A parallel group (Parallel) is in flight as a whole: the saga's
	// CurrentStep is its first branch, a reply is accepted for any of its
	// branches, and each branch has its own attempts and deadline (an
	// EventTimer handles every branch whose deadline has passed). A branch's
	// success reply is decoded at once and held (StepState.Reply) until every
	// branch has succeeded; the held replies are then applied in declaration
	// order and the saga moves past the group. A branch's rejection or
	// exhausted timeout, or a cancel, unwinds the group: the held replies are
	// applied, and the compensations of the branches in flight and of those
	// that succeeded are sent at once; once none of them is in flight, the
	// saga is failed if one of them failed, and otherwise compensates the
	// steps before the group. Compensating past a group (a later step
	// failed) likewise compensates its succeeded branches at once. A retry
	// re-sends each branch in flight, or each compensation that failed.
	//
	// EventRestart runs a failed or compensated saga again from the step
	// ev.Step (a branch's name, or a group's, restarts its whole group) on
	// this definition, which may be a newer version of the instance's than
	// the one it ran (Apply takes any older version for a restart): the
	// steps before it keep their state and must have their action in effect
	// (succeeded, skipped, or compensation-failed, and in a newer version
	// the same steps at the same places); the others start again. The
	// instance's Run is incremented and carried by the new commands, so that
	// the participants' barriers perform them again and replies to the
	// earlier run are ignored. The data is the stored data or, when
	// ev.Payload is set, that replacement, decoded strictly into D (an error
	// wrapping ErrInvalidPayload otherwise). A refused restart is an error
	// wrapping ErrInvalidTransition.
	//
	// Other errors: an instance of another definition or a corrupt one
	// (ErrInvalidInstance), an unknown event kind or an event without At
	// (ErrInvalidEvent), a local step that failed without rejecting, or a
	// function of the definition that panicked (a *PanicError, wrapping
	// ErrPanicked; Start returns one too).
	Apply(ctx context.Context, inst Instance, ev Event) (Result, error)
}

var _ Runner = (*Definition[struct{}])(nil)

// Start implements Runner.
func (def *Definition[D]) Start(ctx context.Context, id uuid.UUID, data json.RawMessage, now time.Time) (res Result, err error) {
	defer func() {
		if r := recover(); r != nil {
			res, err = Result{}, fmt.Errorf("start saga %s %s: %w", def, id, recovered(r))
		}
	}()
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
		m.inst.Steps[i] = StepState{Name: s.name, Status: StepPending, Group: s.group}
	}
	m.record(HistoryEntry{Event: HistoryStarted, StepIndex: -1, Phase: PhaseAction, Detail: def.String()})
	if err := m.advance(0); err != nil {
		return Result{}, err
	}
	return m.finish()
}

// Apply implements Runner.
func (def *Definition[D]) Apply(ctx context.Context, inst Instance, ev Event) (res Result, err error) {
	defer func() {
		if r := recover(); r != nil {
			res, err = Result{}, fmt.Errorf("saga %s %s: %s event: %w", def, inst.ID, ev.Kind, recovered(r))
		}
	}()
	if ev.Kind != EventRestart {
		if err := def.checkInstance(inst); err != nil {
			return Result{}, err
		}
	}
	if ev.At.IsZero() {
		return Result{}, fmt.Errorf("%w: %s event for saga %s has no time", ErrInvalidEvent, ev.Kind, inst.ID)
	}
	if ev.Kind == EventRestart {
		return def.restart(ctx, inst, ev)
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
	case EventCancel, EventAbort:
		err = m.cancel()
	case EventTerminate:
		err = m.terminate()
	case EventOutside:
		err = m.outside()
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

// restart runs the failed or compensated saga inst again from the step
// ev.Step (EventRestart), on this definition, which may be a newer version
// of inst's.
func (def *Definition[D]) restart(ctx context.Context, inst Instance, ev Event) (Result, error) {
	refuse := func(format string, args ...any) (Result, error) {
		return Result{}, fmt.Errorf("%w: restart saga %s: %s", ErrInvalidTransition, inst.ID, fmt.Sprintf(format, args...))
	}
	switch {
	case inst.Type != def.name:
		return Result{}, fmt.Errorf("%w: saga %s: instance is of %s, not %s", ErrInvalidInstance, inst.ID, inst.Type, def.name)
	case inst.Version > def.version:
		return refuse("it runs version %d; it cannot restart on the older %s", inst.Version, def)
	case !inst.Status.Valid():
		return Result{}, fmt.Errorf("%w: saga %s: unknown status %q", ErrInvalidInstance, inst.ID, inst.Status)
	case inst.Status != StatusFailed && inst.Status != StatusCompensated:
		return refuse("only a failed or compensated saga can be restarted, this one is %s", inst.Status)
	}
	from := -1
	for _, s := range def.steps {
		if s.name == ev.Step || (s.group != "" && s.group == ev.Step) {
			from = s.spanStart // a branch restarts its whole group
			break
		}
	}
	if from < 0 {
		return refuse("%s has no step or parallel group %q", def, ev.Step)
	}
	for k := range from {
		if k >= len(inst.Steps) || inst.Steps[k].Name != def.steps[k].name {
			return refuse("step %d of %s is %q, which the saga (version %d) did not run at that place; restart from an earlier step", k, def, def.steps[k].name, inst.Version)
		}
		// A compensation that failed undid nothing: its action stands.
		if st := inst.Steps[k].Status; st != StepSucceeded && st != StepSkipped && st != StepCompensationFailed {
			return refuse("step %q before %q is %s, so its action is not in effect; restart from it or an earlier step", inst.Steps[k].Name, ev.Step, st)
		}
	}
	for k := from; k < len(inst.Steps); k++ {
		// Running such a step again would perform its action twice, and
		// its first effect would never be compensated.
		st := inst.Steps[k]
		if st.Status != StepSucceeded && st.Status != StepCompensationFailed {
			continue
		}
		if s := def.step(st.Name); s == nil || s.compensation != nil {
			return refuse("step %q is %s: its action is still in effect and would be performed again; restart from a later step", st.Name, st.Status)
		}
	}
	var d D
	if bytes.Equal(bytes.TrimSpace(ev.Payload), []byte("null")) {
		return Result{}, fmt.Errorf("%w: restart saga %s: the replacement data is null", ErrInvalidPayload, inst.ID)
	}
	if len(ev.Payload) > 0 {
		if err := decodeStrict(ev.Payload, &d); err != nil {
			return Result{}, fmt.Errorf("%w: restart saga %s: replacement data for %s: %w", ErrInvalidPayload, inst.ID, def, err)
		}
	} else {
		var err error
		if d, err = def.DecodeData(inst.Data); err != nil {
			return Result{}, fmt.Errorf("%w: saga %s: %w", ErrInvalidInstance, inst.ID, err)
		}
	}
	m := &machine[D]{def: def, ctx: ctx, data: d, now: ev.At.UTC(), ev: &ev}
	m.inst = inst
	m.inst.Version, m.inst.Run = def.version, inst.Run+1
	m.inst.Status, m.inst.Phase, m.inst.CurrentStep, m.inst.LastError = StatusRunning, PhaseAction, -1, ""
	m.inst.Steps = make([]StepState, len(def.steps))
	for k, s := range def.steps {
		if k < from {
			st := inst.Steps[k]
			st.Deadline, st.Reply, st.Group = time.Time{}, nil, s.group
			if st.Status == StepCompensationFailed {
				// Its action stands: should the saga compensate again, it
				// is compensated (attempts go on from the failed one's).
				st.Status, st.LastError = StepSucceeded, ""
			}
			m.inst.Steps[k] = st
			continue
		}
		m.inst.Steps[k] = StepState{Name: s.name, Status: StepPending, Group: s.group}
	}
	detail := fmt.Sprintf("from step %q: run %d, after run %d ended %s", def.steps[from].name, m.inst.Run, inst.Run, inst.Status)
	if inst.Version != def.version {
		detail += fmt.Sprintf("; definition version %d, was %d", def.version, inst.Version)
	}
	if len(ev.Payload) > 0 {
		detail += "; data replaced by the operator"
	}
	if ev.Reason != "" {
		detail += ": " + ev.Reason
	}
	m.record(HistoryEntry{Event: HistoryRestarted, StepIndex: from, Phase: PhaseAction, Detail: detail, Actor: ev.Actor})
	if err := m.advance(from); err != nil {
		return Result{}, err
	}
	return m.finish()
}

// step returns the step called name, or nil.
func (def *Definition[D]) step(name string) *StepSpec[D] {
	for _, s := range def.steps {
		if s.name == name {
			return s
		}
	}
	return nil
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
	for k := range m.inst.Steps {
		// Only a command in flight can wait to be published.
		if st := &m.inst.Steps[k]; st.Status != StepRunning && st.Status != StepCompensating {
			st.StartBy = time.Time{}
		}
	}
	m.inst.Deadline = EarliestDeadline(m.inst.Steps)
	m.res.Instance = m.inst
	return m.res, nil
}

// EarliestDeadline returns the earliest Deadline or StartBy of steps: the
// instance's Deadline, when the next EventTimer is due. Zero when none is
// set.
func EarliestDeadline(steps []StepState) time.Time {
	var d time.Time
	for _, st := range steps {
		for _, t := range [2]time.Time{st.Deadline, st.StartBy} {
			if !t.IsZero() && (d.IsZero() || t.Before(d)) {
				d = t
			}
		}
	}
	return d
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
		if s.group != "" {
			sent, err := m.fork(i)
			if err != nil || sent {
				return err
			}
			m.record(HistoryEntry{Event: HistoryGroupJoined, StepIndex: -1, Phase: PhaseAction, Detail: s.group})
			i = s.spanEnd - 1
			continue
		}
		st.StartedAt = m.now
		if s.when != nil && !s.when(&m.data) {
			st.Status, st.FinishedAt = StepSkipped, m.now
			m.record(HistoryEntry{Event: HistoryStepSkipped, StepIndex: i, Phase: PhaseAction, Detail: "predicate returned false"})
			continue
		}
		if s.isWait {
			m.enterWait(i)
			return nil
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
	err = runScoped(m.ctx, func(ctx context.Context) (err error) {
		// A panic is the step's error here, so that the scope sees the
		// step fail (and rolls back its writes) rather than a panic
		// passing through it.
		defer func() {
			if r := recover(); r != nil {
				err = recovered(r)
			}
		}()
		return s.local(ctx, &m.data)
	})
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

// fork sends the action of every branch of the parallel group that starts
// at step start, but those whose predicate is false, and makes the group the
// saga's current step. It reports whether it sent any: a group whose
// branches are all skipped is passed over, and advance records it joined.
func (m *machine[D]) fork(start int) (sent bool, err error) {
	for k := start; k < m.def.steps[start].spanEnd; k++ {
		s, st := m.def.steps[k], &m.inst.Steps[k]
		st.StartedAt = m.now
		if s.when != nil && !s.when(&m.data) {
			st.Status, st.FinishedAt = StepSkipped, m.now
			m.record(HistoryEntry{Event: HistoryStepSkipped, StepIndex: k, Phase: PhaseAction, Detail: "predicate returned false"})
			continue
		}
		if err := m.sendAction(k, 1); err != nil {
			return false, err
		}
		sent = true
	}
	if sent {
		m.inst.CurrentStep = start
	}
	return sent, nil
}

// span returns the steps [start, end) in flight together with step i: its
// parallel group, or i alone.
func (m *machine[D]) span(i int) (start, end int) {
	s := m.def.steps[i]
	return s.spanStart, s.spanEnd
}

// joinable reports whether every step of the span [start, end) has
// succeeded or was skipped.
func (m *machine[D]) joinable(start, end int) bool {
	for k := start; k < end; k++ {
		if st := m.inst.Steps[k].Status; st != StepSucceeded && st != StepSkipped {
			return false
		}
	}
	return true
}

// applyHeld applies to the data the success replies that the branches of
// the span [start, end) hold, in declaration order, and drops them.
func (m *machine[D]) applyHeld(start, end int) error {
	for k := start; k < end; k++ {
		st := &m.inst.Steps[k]
		if st.Reply == nil {
			continue
		}
		if err := m.def.steps[k].action.apply(&m.data, st.Reply); err != nil {
			return m.errorf(k, "apply reply: %w", err)
		}
		st.Reply = nil
	}
	return nil
}

// sendAction emits attempt of step i's action.
func (m *machine[D]) sendAction(i, attempt int) error {
	s, st := m.def.steps[i], &m.inst.Steps[i]
	payload, err := s.action.request(&m.data)
	if err != nil {
		return m.errorf(i, "build action request: %w", err)
	}
	st.Status, st.Attempt, st.Deadline, st.Run = StepRunning, attempt, m.after(s.timeout), m.inst.Run
	st.StartBy = m.after(s.startTimeout)
	m.res.Emit = append(m.res.Emit, Outgoing{
		Type: s.action.command, Phase: PhaseAction, Step: s.name, StepIndex: i, Attempt: attempt, Run: m.inst.Run, Payload: payload,
	})
	m.record(HistoryEntry{Event: HistoryCommandSent, StepIndex: i, Phase: PhaseAction, Attempt: attempt, Detail: s.action.command})
	return nil
}

// sendCompensation emits attempt of step i's compensation and makes it (or
// its parallel group) the current step of a compensating saga.
func (m *machine[D]) sendCompensation(i, attempt int) error {
	s, st := m.def.steps[i], &m.inst.Steps[i]
	payload, err := s.compensation.request(&m.data)
	if err != nil {
		return m.errorf(i, "build compensation request: %w", err)
	}
	st.Status, st.CompensationAttempt, st.Deadline = StepCompensating, attempt, m.after(s.compTimeout)
	st.StartBy = m.after(s.startTimeout)
	m.inst.Status, m.inst.Phase, m.inst.CurrentStep = StatusCompensating, PhaseCompensation, s.spanStart
	m.res.Emit = append(m.res.Emit, Outgoing{
		Type: s.compensation.command, Phase: PhaseCompensation, Step: s.name, StepIndex: i, Attempt: attempt, Run: st.Run, Payload: payload,
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
		if start, end := m.span(i); end-start > 1 {
			sent, err := m.compensateGroup(start, end)
			if err != nil || sent {
				return err
			}
			i = start
			continue
		}
		if m.inst.Steps[i].Status != StepSucceeded || m.def.steps[i].isWait {
			continue // a wait step did nothing to undo
		}
		if m.def.steps[i].compensation == nil {
			m.record(HistoryEntry{Event: HistoryCompensationSkipped, StepIndex: i, Phase: PhaseCompensation, Detail: "no compensation"})
			continue
		}
		// A step kept by a restart may have been compensated (and failed)
		// before: its attempts go on from there.
		return m.sendCompensation(i, m.inst.Steps[i].CompensationAttempt+1)
	}
	m.inst.Status, m.inst.CurrentStep = StatusCompensated, -1
	m.record(HistoryEntry{Event: HistoryCompensated, StepIndex: -1, Phase: PhaseCompensation})
	return nil
}

// compensateGroup sends, at once, the compensation of every succeeded
// branch of the parallel group [start, end) that has one, and makes the
// group the saga's current step. It reports whether it sent any.
func (m *machine[D]) compensateGroup(start, end int) (sent bool, err error) {
	for k := start; k < end; k++ {
		if m.inst.Steps[k].Status != StepSucceeded {
			continue
		}
		if m.def.steps[k].compensation == nil {
			m.record(HistoryEntry{Event: HistoryCompensationSkipped, StepIndex: k, Phase: PhaseCompensation, Detail: "no compensation"})
			continue
		}
		if err := m.sendCompensation(k, m.inst.Steps[k].CompensationAttempt+1); err != nil {
			return false, err
		}
		sent = true
	}
	if sent {
		m.inst.CurrentStep = start
	}
	return sent, nil
}

// abandon compensates from step i, whose action is in flight and may have
// run: its own compensation first, if it has one; otherwise it is marked
// status (timed out) and the earlier steps are compensated. A branch of a
// parallel group unwinds its group.
func (m *machine[D]) abandon(i int, status StepStatus) error {
	if m.def.steps[i].compensation == nil {
		st := &m.inst.Steps[i]
		st.Status, st.FinishedAt, st.Deadline = status, m.now, time.Time{}
		m.record(HistoryEntry{Event: HistoryCompensationSkipped, StepIndex: i, Phase: PhaseCompensation, Detail: "no compensation"})
	}
	return m.unwind(m.span(i))
}

// unwind starts the compensation of the span [start, end) in flight (a step,
// or a parallel group one of whose branches failed): the replies its
// branches hold are applied, in declaration order; each step still in flight
// is abandoned, its compensation sent through the participant's barrier
// because it may have run (or, without one, it is marked StepAborted); each
// succeeded branch's compensation is sent; all at once. When nothing was
// sent, the steps before the span are compensated.
func (m *machine[D]) unwind(start, end int) error {
	m.inst.Phase = PhaseCompensation
	if err := m.applyHeld(start, end); err != nil {
		return err
	}
	sent := false
	for k := start; k < end; k++ {
		st := &m.inst.Steps[k]
		switch {
		case inFlight(st.Status):
		case st.Status == StepSucceeded && end-start > 1:
			// A succeeded branch; a step alone is compensated by
			// compensateFrom.
		default:
			continue
		}
		if m.def.steps[k].compensation == nil {
			if st.Status != StepSucceeded {
				st.Status, st.FinishedAt, st.Deadline = StepAborted, m.now, time.Time{}
				if st.LastError == "" {
					st.LastError = m.inst.LastError // why the saga gave up on it
				}
			}
			m.record(HistoryEntry{Event: HistoryCompensationSkipped, StepIndex: k, Phase: PhaseCompensation, Detail: "no compensation"})
			continue
		}
		if err := m.sendCompensation(k, 1); err != nil {
			return err
		}
		sent = true
	}
	if sent {
		m.inst.CurrentStep = start
		return nil
	}
	return m.compensateFrom(start - 1)
}

// settleCompensation decides what follows a compensation reply to a step
// of the span [start, end): nothing while another of its compensations is
// in flight; then the saga fails if one of them failed, or the steps before
// the span are compensated.
func (m *machine[D]) settleCompensation(start, end int) error {
	for k := start; k < end; k++ {
		if m.inst.Steps[k].Status == StepCompensating {
			return nil
		}
	}
	for k := start; k < end; k++ {
		if st := m.inst.Steps[k]; st.Status == StepCompensationFailed {
			m.inst.Status, m.inst.CurrentStep, m.inst.LastError = StatusFailed, start, st.LastError
			m.record(HistoryEntry{Event: HistoryFailed, StepIndex: -1, Phase: PhaseCompensation, Detail: st.LastError})
			return nil
		}
	}
	return m.compensateFrom(start - 1)
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

// staleReply returns why the reply does not belong to a step and phase in
// flight, or "" if it does.
func (m *machine[D]) staleReply() string {
	ev, inst := m.ev, &m.inst
	if inst.Status != StatusRunning && inst.Status != StatusCompensating {
		return fmt.Sprintf("%s reply %q for step %q: the saga is %s", ev.Kind, ev.Type, ev.Step, inst.Status)
	}
	i := inst.CurrentStep
	start, end := m.span(i)
	if k := ev.StepIndex; k < start || k >= end || ev.Step != m.def.steps[k].name {
		if end-start == 1 {
			s := m.def.steps[i]
			return fmt.Sprintf("%s reply %q for step %q (index %d): the current step is %q (index %d)", ev.Kind, ev.Type, ev.Step, ev.StepIndex, s.name, i)
		}
		return fmt.Sprintf("%s reply %q for step %q (index %d): the current steps are those of group %q (indices %d to %d)", ev.Kind, ev.Type, ev.Step, ev.StepIndex, m.def.steps[i].group, start, end-1)
	}
	s, st := m.def.steps[ev.StepIndex], &inst.Steps[ev.StepIndex]
	if ev.Run != st.Run {
		return fmt.Sprintf("%s reply %q for step %q: it answers run %d, the step's command was sent in run %d (the saga was restarted)", ev.Kind, ev.Type, ev.Step, ev.Run, st.Run)
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
	ev, i := m.ev, m.ev.StepIndex
	start, end := m.span(i)
	s, st := m.def.steps[i], &m.inst.Steps[i]
	entry := HistoryEntry{StepIndex: i, Phase: m.inst.Phase, Attempt: ev.Attempt, MessageID: ev.MessageID}
	st.Deadline = time.Time{}
	switch {
	case m.inst.Phase == PhaseAction && ev.Kind == EventReplySuccess:
		if end-start == 1 {
			if err := s.action.apply(&m.data, ev.Payload); err != nil {
				return m.errorf(i, "apply reply: %w", err)
			}
		} else {
			// A branch's reply waits for its group to join, so that the
			// replies are applied in declaration order.
			if err := s.action.check(ev.Payload); err != nil {
				return m.errorf(i, "apply reply: %w", err)
			}
			st.Reply = slices.Clone(ev.Payload)
			entry.Detail = fmt.Sprintf("held until group %q joins", s.group)
		}
		st.Status, st.FinishedAt = StepSucceeded, m.now
		m.resolve(st)
		entry.Event = HistoryReplyApplied
		m.record(entry)
		if !m.joinable(start, end) {
			return nil
		}
		if end-start > 1 {
			if err := m.applyHeld(start, end); err != nil {
				return err
			}
		}
		if s.group != "" {
			m.record(HistoryEntry{Event: HistoryGroupJoined, StepIndex: -1, Phase: PhaseAction, Detail: s.group})
		}
		return m.advance(end)
	case m.inst.Phase == PhaseAction:
		reason := failureReason(ev)
		st.Status, st.FinishedAt, st.LastError, m.inst.LastError = StepRejected, m.now, reason, reason
		entry.Event, entry.Detail = HistoryStepRejected, reason
		m.record(entry)
		return m.unwind(start, end)
	case ev.Kind == EventReplySuccess:
		st.Status, st.FinishedAt = StepCompensated, m.now
		if st.LastError != m.inst.LastError {
			// A compensation failure an operator's retry repaired; the
			// saga's own reason (why it compensates) stays.
			st.LastError = ""
		}
		entry.Event = HistoryStepCompensated
		m.record(entry)
		return m.settleCompensation(start, end)
	default:
		reason := failureReason(ev)
		st.Status, st.FinishedAt, st.LastError = StepCompensationFailed, m.now, reason
		entry.Event, entry.Detail = HistoryCompensationFailed, reason
		m.record(entry)
		return m.settleCompensation(start, end)
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
			if st.LastError != "" {
				return st.LastError
			}
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
	start, end := m.span(i)
	held := len(m.ev.Unpublished) > 0
	var due, expired []int
	var next time.Time
	later := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	cleared := false
	for k := start; k < end; k++ {
		st := &m.inst.Steps[k]
		if by := st.StartBy; !by.IsZero() {
			switch {
			case m.now.Before(by):
				later(by)
			case m.unpublished(k):
				expired = append(expired, k)
			default:
				// Published in time: nothing more to watch.
				st.StartBy, cleared = time.Time{}, true
			}
		}
		switch d := st.Deadline; {
		case d.IsZero():
		case m.now.Before(d):
			later(d)
		case held:
			// The time a message waits unpublished is not the
			// participant's, and a re-send would wait behind it.
		default:
			due = append(due, k)
		}
	}
	if len(expired) > 0 {
		return m.unpublishedTimedOut(start, end, expired)
	}
	if len(due) == 0 {
		if cleared {
			return nil // a schedule-to-start timeout that did not expire: no history
		}
		what := fmt.Sprintf("step %q", m.def.steps[i].name)
		if end-start > 1 {
			what = fmt.Sprintf("group %q", m.def.steps[i].group)
		}
		switch {
		case held:
			m.ignore(fmt.Sprintf("timer: %s waits for %d unpublished message(s) of the saga", what, len(m.ev.Unpublished)))
		case next.IsZero():
			m.ignore(fmt.Sprintf("timer: %s has no deadline", what))
		default:
			m.ignore(fmt.Sprintf("timer: %s deadline %s not reached", what, next.Format(time.RFC3339Nano)))
		}
		return nil
	}
	// A branch out of attempts unwinds its group: handle it alone, so
	// that no sibling is re-sent or rescheduled in the transition that
	// abandons it.
	for _, k := range due {
		s, st := m.def.steps[k], m.inst.Steps[k]
		if st.Status == StepWaitingEvent || (st.Status == StepRunning && st.Attempt >= s.retry.MaxAttempts) {
			due = []int{k}
			break
		}
	}
	for _, k := range due {
		if err := m.stepTimer(k); err != nil {
			return err
		}
	}
	if len(m.res.History) == 0 {
		m.ignore(fmt.Sprintf("timer: step %q is %s", m.def.steps[due[0]].name, m.inst.Steps[due[0]].Status))
	}
	return nil
}

// unpublished reports whether the command step k has in flight (its
// action's attempt while running, its compensation's while compensating)
// is listed by the timer as still unpublished.
func (m *machine[D]) unpublished(k int) bool {
	st := m.inst.Steps[k]
	ref := MessageRef{StepIndex: k, Phase: PhaseAction, Attempt: st.Attempt}
	switch st.Status {
	case StepRunning:
	case StepCompensating:
		ref.Phase, ref.Attempt = PhaseCompensation, st.CompensationAttempt
	default:
		return false
	}
	return slices.Contains(m.ev.Unpublished, ref)
}

// unpublishedTimedOut handles the steps expired of the span [start, end),
// whose command in flight was not published within their schedule-to-start
// timeout. An action counts as timed out at once, whatever attempts it has
// left: the span's unpublished actions are withdrawn and it unwinds (each
// step in flight is compensated through the participant's barrier, in case
// its command went out at the last moment). A compensation counts as
// failed: once the span's other compensations have settled the saga fails,
// for an operator; it stays in the outbox and goes out when it can.
func (m *machine[D]) unpublishedTimedOut(start, end int, expired []int) error {
	action := false
	for _, k := range expired {
		s, st := m.def.steps[k], &m.inst.Steps[k]
		st.StartBy = time.Time{}
		detail := fmt.Sprintf("not published within %s (schedule-to-start timeout)", s.startTimeout)
		if st.Status == StepRunning {
			action = true
			reason := fmt.Sprintf("step %q: command %q not published within %s (schedule-to-start timeout): no queue takes it, or the broker or the relay is down",
				s.name, s.action.command, s.startTimeout)
			st.LastError = reason
			if m.inst.LastError == "" || k == expired[0] {
				m.inst.LastError = reason
			}
			m.record(HistoryEntry{Event: HistoryTimedOut, StepIndex: k, Phase: PhaseAction, Attempt: st.Attempt, Detail: detail})
			if s.compensation == nil {
				st.Status, st.FinishedAt, st.Deadline = StepTimedOut, m.now, time.Time{}
				m.record(HistoryEntry{Event: HistoryCompensationSkipped, StepIndex: k, Phase: PhaseCompensation, Detail: "no compensation"})
			}
			continue
		}
		reason := fmt.Sprintf("compensation %q of step %q not published within %s (schedule-to-start timeout): no queue takes it, or the broker or the relay is down; it stays in the outbox until it can go out: retry the saga then",
			s.compensation.command, s.name, s.startTimeout)
		st.Status, st.FinishedAt, st.Deadline, st.LastError = StepCompensationFailed, m.now, time.Time{}, reason
		m.record(HistoryEntry{Event: HistoryTimedOut, StepIndex: k, Phase: PhaseCompensation, Attempt: st.CompensationAttempt, Detail: detail})
	}
	if !action {
		return m.settleCompensation(start, end)
	}
	for _, r := range m.ev.Unpublished {
		if r.Phase == PhaseAction && r.StepIndex >= start && r.StepIndex < end {
			m.res.Withdraw = append(m.res.Withdraw, r)
		}
	}
	return m.unwind(start, end)
}

// stepTimer handles the passed deadline of step i.
func (m *machine[D]) stepTimer(i int) error {
	s, st := m.def.steps[i], &m.inst.Steps[i]
	switch st.Status {
	case StepWaitingEvent:
		return m.waitTimedOut(i)
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
	return nil
}

func (m *machine[D]) retry() error {
	i := m.inst.CurrentStep
	switch m.inst.Status {
	case StatusRunning:
		if st := m.inst.Steps[i]; st.Status == StepWaitingEvent {
			return fmt.Errorf("%w: retry saga %s: step %q waits for an outside event, it has nothing to re-send", ErrInvalidTransition, m.inst.ID, st.Name)
		}
	case StatusCompensating, StatusFailed:
		if cause := m.compensationCause(); m.inst.Status == StatusFailed && cause != "" {
			// Compensating again: the saga's reason is again why it
			// compensates; the step keeps its compensation failure until
			// the retried compensation succeeds.
			m.inst.LastError = cause
		}
	default:
		return fmt.Errorf("%w: retry saga %s: a %s saga has nothing to retry", ErrInvalidTransition, m.inst.ID, m.inst.Status)
	}
	// Re-send what each step of the span has in flight: its action while
	// running, its compensation (or the failed one) otherwise.
	action := m.inst.Status == StatusRunning
	sent := false
	start, end := m.span(i)
	for k := start; k < end; k++ {
		st := m.inst.Steps[k]
		entry := HistoryEntry{Event: HistoryRetried, StepIndex: k, Phase: m.inst.Phase, Detail: m.ev.Reason, Actor: m.ev.Actor}
		var err error
		switch {
		case action && (st.Status == StepRunning || st.Status == StepWaitingRetry):
			entry.Attempt = st.Attempt + 1
			m.record(entry)
			err = m.sendAction(k, entry.Attempt)
		case !action && (st.Status == StepCompensating || st.Status == StepCompensationFailed):
			entry.Attempt = st.CompensationAttempt + 1
			m.record(entry)
			err = m.sendCompensation(k, entry.Attempt)
		default:
			continue
		}
		if err != nil {
			return err
		}
		sent = true
	}
	if !sent {
		return fmt.Errorf("%w: saga %s: current step %d is %s", ErrInvalidInstance, m.inst.ID, i, m.inst.Steps[i].Status)
	}
	return nil
}

// inFlight reports whether step state st is an action in flight: sent and
// unanswered, waiting for a retry or for an outside event.
func inFlight(st StepStatus) bool {
	return st == StepRunning || st == StepWaitingRetry || st == StepWaitingEvent
}

// cancel compensates a running saga from its step in flight (EventCancel,
// EventAbort).
func (m *machine[D]) cancel() error {
	verb, event := "cancelled", HistoryCancelled
	if m.ev.Kind == EventAbort {
		verb, event = "aborted", HistoryAborted
	}
	if m.inst.Status != StatusRunning {
		return fmt.Errorf("%w: %s saga %s: only a running saga can be %s, this one is %s", ErrInvalidTransition, m.ev.Kind, m.inst.ID, verb, m.inst.Status)
	}
	i := m.inst.CurrentStep
	start, end := m.span(i)
	reason := m.operatorReason(verb)
	first := -1
	for k := start; k < end; k++ {
		if st := &m.inst.Steps[k]; inFlight(st.Status) {
			st.LastError = reason
			if first < 0 {
				first = k
			}
		}
	}
	if first < 0 {
		return fmt.Errorf("%w: saga %s: current step %d is %s", ErrInvalidInstance, m.inst.ID, i, m.inst.Steps[i].Status)
	}
	m.inst.LastError = reason
	m.record(HistoryEntry{Event: event, StepIndex: first, Phase: PhaseAction, Attempt: m.inst.Steps[first].Attempt, Detail: m.ev.Reason, Actor: m.ev.Actor})
	return m.unwind(start, end)
}

// terminate stops a running, compensating or failed saga at once.
func (m *machine[D]) terminate() error {
	switch m.inst.Status {
	case StatusRunning, StatusCompensating, StatusFailed:
	default:
		return fmt.Errorf("%w: terminate saga %s: a %s saga has ended", ErrInvalidTransition, m.inst.ID, m.inst.Status)
	}
	i := m.inst.CurrentStep
	start, end := m.span(i)
	// What the succeeded branches did stays done, their replies too.
	if err := m.applyHeld(start, end); err != nil {
		return err
	}
	for k := start; k < end; k++ {
		st := &m.inst.Steps[k]
		switch st.Status {
		case StepRunning, StepWaitingRetry, StepCompensating, StepWaitingEvent:
			st.Status, st.FinishedAt = StepTerminated, m.now
		}
		st.Deadline = time.Time{}
	}
	reason := m.operatorReason("terminated")
	m.inst.Status, m.inst.CurrentStep, m.inst.LastError = StatusTerminated, -1, reason
	m.record(HistoryEntry{Event: HistoryTerminated, StepIndex: i, Phase: m.inst.Phase, Detail: m.ev.Reason, Actor: m.ev.Actor})
	return nil
}

// operatorReason is the LastError of an operator action: "verb by actor:
// reason".
func (m *machine[D]) operatorReason(verb string) string {
	reason := verb
	if m.ev.Actor != "" {
		reason += " by " + m.ev.Actor
	}
	if m.ev.Reason != "" {
		reason += ": " + m.ev.Reason
	}
	return reason
}
