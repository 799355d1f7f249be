package view

import (
	"time"

	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
)

// SagaOf returns s as a listing row: without data, steps and history.
func SagaOf(s *orchestrator.Saga) Saga {
	v := Saga{
		ID: s.ID, Type: s.Type, Version: s.Version, Status: string(s.Status), Phase: string(s.Phase), Run: s.Run,
		CurrentStepIndex: -1, StartKey: s.StartKey, LastError: s.LastError, Deadline: utc(s.Deadline),
		Revision: s.Revision, CreatedAt: utc(s.CreatedAt), UpdatedAt: utc(s.UpdatedAt), FinishedAt: utc(s.FinishedAt),
	}
	if s.CurrentStep >= 0 && s.CurrentStep < len(s.Steps) {
		v.CurrentStep, v.CurrentStepIndex = s.Steps[s.CurrentStep].Name, s.CurrentStep
	}
	return v
}

// SagaDetailOf returns s with its data, steps and history, as `saga show`
// prints it.
func SagaDetailOf(s *orchestrator.Saga, hist []saga.HistoryEntry) Saga {
	v := SagaOf(s)
	v.Data = s.Data
	v.Steps = make([]Step, len(s.Steps))
	for i, st := range s.Steps {
		v.Steps[i] = Step{
			Index: i, Name: st.Name, Status: string(st.Status), Attempt: st.Attempt, CompensationAttempt: st.CompensationAttempt,
			Deadline: utc(st.Deadline), StartedAt: utc(st.StartedAt), FinishedAt: utc(st.FinishedAt), LastError: st.LastError,
			Group: st.Group,
		}
	}
	v.History = make([]HistoryEntry, len(hist))
	for i, h := range hist {
		v.History[i] = HistoryEntry{
			At: utc(h.At), Event: string(h.Event), Step: h.Step, StepIndex: h.StepIndex, Phase: string(h.Phase),
			Attempt: h.Attempt, Detail: h.Detail, Actor: h.Actor, MessageID: h.MessageID,
		}
	}
	return v
}

// DefinitionOf returns a recorded definition.
func DefinitionOf(d *orchestrator.RecordedDefinition) Definition {
	return Definition{
		Type: d.Type, Version: d.Version, RegisteredAt: utc(d.RegisteredAt), SeenAt: utc(d.SeenAt),
		Steps: len(d.Shape.Steps()), Shape: d.Shape,
	}
}

// OperationOf returns an operator request with its state.
func OperationOf(op *orchestrator.Request) Operation {
	v := Operation{
		ID: op.ID, SagaID: op.SagaID, Action: op.Action, Actor: op.Actor, Reason: op.Reason,
		RequestedAt: utc(op.RequestedAt), AppliedAt: utc(op.AppliedAt), Error: op.Error,
		WithdrawnAt: utc(op.WithdrawnAt), WithdrawnBy: op.WithdrawnBy,
	}
	switch {
	case !op.WithdrawnAt.IsZero():
		v.State = OperationWithdrawn
	case op.AppliedAt.IsZero():
		v.State = OperationPending
	case op.Error != "":
		v.State = OperationRefused
	default:
		v.State = OperationApplied
	}
	return v
}

// utc returns t in UTC; the zero time stays zero (and is left out).
func utc(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return t.UTC()
}
