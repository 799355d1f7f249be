package saga

import (
	"fmt"
	"time"
)

// EventType is the contract of an outside event a saga can wait for (see
// WaitEvent): its stable name and its payload type T. The application sends
// it with orchestrator.SendEvent.
type EventType[T any] struct{ name string }

// NewEventType returns the contract of the outside event called name (e.g.
// "payment.confirmed") with payload T.
func NewEventType[T any](name string) EventType[T] { return EventType[T]{name: name} }

// Name returns the event's name.
func (e EventType[T]) Name() string { return e.name }

// Encode encodes an event's payload.
func (e EventType[T]) Encode(v T) ([]byte, error) { return encode(e.name, "event", v) }

// Decode decodes an event's payload strictly (unknown fields are an error
// wrapping ErrInvalidPayload).
func (e EventType[T]) Decode(payload []byte) (T, error) {
	var v T
	if err := decodeStrict(payload, &v); err != nil {
		return v, fmt.Errorf("%w: decode %s event: %w", ErrInvalidPayload, e.name, err)
	}
	return v, nil
}

// WaitEvent declares a step that waits for the outside event ev, sent to
// the saga by the application (orchestrator.SendEvent), and applies its
// payload to the data with apply (nil if the saga needs nothing of it). An
// event sent before the saga reaches the step is kept and consumed when it
// does. With WithTimeout, the saga compensates the earlier steps if no event
// arrives in time (the step itself did nothing). A wait step may take When
// and WithTimeout; it has no command, so no Invoke, Compensate or WithRetry.
func WaitEvent[D, T any](name string, ev EventType[T], apply func(d *D, v T), opts ...StepOption[D]) *StepSpec[D] {
	s := Step(name, opts...)
	s.isWait, s.waitEvent = true, ev.Name()
	s.waitApply = func(d *D, payload []byte) error {
		v, err := ev.Decode(payload)
		if err != nil {
			return err
		}
		if apply != nil {
			apply(d, v)
		}
		return nil
	}
	return s
}

// waitProblems returns what is wrong with the wait step s.
func (s *StepSpec[D]) waitProblems() []string {
	var p []string
	if s.waitEvent == "" {
		p = append(p, "wait step event has an empty name")
	}
	if s.actions > 0 {
		p = append(p, "a wait step cannot have an action (Invoke)")
	}
	if s.compensates > 0 || s.hasCompTimeout {
		p = append(p, "a wait step cannot have a compensation (Compensate): it does nothing to undo")
	}
	if s.hasRetry {
		p = append(p, "a wait step cannot have a retry policy (WithRetry)")
	}
	if s.hasStartTimeout {
		p = append(p, "a wait step sends no command, so it cannot have a schedule-to-start timeout (WithScheduleToStartTimeout)")
	}
	if s.timeout < 0 || (s.hasTimeout && s.timeout == 0) {
		p = append(p, fmt.Sprintf("timeout %s is not positive; omit WithTimeout to wait forever", s.timeout))
	}
	return p
}

// enterWait makes step i, a wait step, the saga's current step: it waits for
// its event until its timeout.
func (m *machine[D]) enterWait(i int) {
	s, st := m.def.steps[i], &m.inst.Steps[i]
	m.inst.CurrentStep = i
	st.Status, st.Attempt, st.Deadline = StepWaitingEvent, 1, m.after(s.timeout)
	m.record(HistoryEntry{Event: HistoryEventAwaited, StepIndex: i, Phase: PhaseAction, Detail: s.waitEvent})
}

// outside applies an outside event: consumed by the step waiting for it,
// ignored otherwise (the orchestrator keeps it while a later step may
// still wait for it).
func (m *machine[D]) outside() error {
	ev := m.ev
	if m.inst.Status != StatusRunning {
		m.ignore(fmt.Sprintf("event %q: the saga is %s", ev.Type, m.inst.Status))
		return nil
	}
	i := m.inst.CurrentStep
	s, st := m.def.steps[i], &m.inst.Steps[i]
	if !s.isWait || st.Status != StepWaitingEvent || s.waitEvent != ev.Type {
		m.ignore(fmt.Sprintf("event %q: the current step %q does not wait for it", ev.Type, s.name))
		return nil
	}
	if err := s.waitApply(&m.data, ev.Payload); err != nil {
		return m.errorf(i, "apply event: %w", err)
	}
	st.Status, st.FinishedAt, st.Deadline = StepSucceeded, m.now, time.Time{}
	m.record(HistoryEntry{Event: HistoryEventReceived, StepIndex: i, Phase: PhaseAction, Detail: fmt.Sprintf("%s (event id %s)", ev.Type, ev.EventID)})
	return m.advance(i + 1)
}

// waitTimedOut compensates the steps before the wait step i, whose event
// did not come in time.
func (m *machine[D]) waitTimedOut(i int) error {
	s, st := m.def.steps[i], &m.inst.Steps[i]
	reason := fmt.Sprintf("step %q: event %q did not arrive within %s", s.name, s.waitEvent, s.timeout)
	st.Status, st.FinishedAt, st.Deadline = StepTimedOut, m.now, time.Time{}
	st.LastError, m.inst.LastError = reason, reason
	m.record(HistoryEntry{Event: HistoryTimedOut, StepIndex: i, Phase: PhaseAction, Detail: s.timeout.String()})
	return m.compensateFrom(i - 1)
}
