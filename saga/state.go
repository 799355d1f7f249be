package saga

import (
	"encoding/json"
	"time"

	"github.com/google/uuid"
)

// Status is the lifecycle status of a saga instance.
type Status string

// The statuses of a saga. Every saga ends as StatusCompleted,
// StatusCompensated, StatusFailed or StatusTerminated.
const (
	// StatusQueued: the saga was started while its definition's limit of
	// running sagas was reached, or while another saga of its concurrency
	// key ran (flow control). Nothing of it has run; the orchestrator
	// admits it, and it becomes running, in start order.
	StatusQueued Status = "queued"
	// StatusRunning: the steps' actions are being performed.
	StatusRunning Status = "running"
	// StatusCompensating: a step failed, timed out or the saga was aborted;
	// the compensations of the steps that succeeded are being performed in
	// reverse order.
	StatusCompensating Status = "compensating"
	// StatusCompleted: every step succeeded or was skipped. Terminal.
	StatusCompleted Status = "completed"
	// StatusCompensated: the saga failed and every compensation succeeded.
	// Terminal.
	StatusCompensated Status = "compensated"
	// StatusFailed: a compensation could not be performed. The saga waits
	// for an operator, who may retry the compensation (EventRetry).
	StatusFailed Status = "failed"
	// StatusTerminated: an operator or the application terminated the saga
	// (EventTerminate): it stopped at once, without compensating what its
	// steps did. Terminal.
	StatusTerminated Status = "terminated"
)

// Valid reports whether s is one of the known statuses.
func (s Status) Valid() bool {
	switch s {
	case StatusQueued, StatusRunning, StatusCompensating, StatusCompleted, StatusCompensated, StatusFailed, StatusTerminated:
		return true
	}
	return false
}

// Terminal reports whether the saga has ended: completed, compensated,
// failed or terminated. Only an operator retry (or terminate) moves a
// failed saga on.
func (s Status) Terminal() bool {
	return s.Finished() || s == StatusFailed
}

// Finished reports whether the saga has ended for good: completed,
// compensated or terminated (a failed saga waits for an operator).
func (s Status) Finished() bool {
	return s == StatusCompleted || s == StatusCompensated || s == StatusTerminated
}

// Phase says whether a saga is performing actions or compensations.
type Phase string

// The phases of a saga.
const (
	// PhaseAction: steps' actions are sent (the saga is running or completed).
	PhaseAction Phase = "action"
	// PhaseCompensation: steps' compensations are sent (the saga is
	// compensating, compensated or failed).
	PhaseCompensation Phase = "compensation"
)

// StepStatus is the state of one step of a saga instance.
type StepStatus string

// The statuses of a step.
const (
	// StepPending: the saga has not reached the step.
	StepPending StepStatus = "pending"
	// StepRunning: the action command (attempt StepState.Attempt) was sent
	// and no reply has been applied yet.
	StepRunning StepStatus = "running"
	// StepWaitingRetry: an attempt timed out; the command is re-sent when
	// StepState.Deadline passes. A late reply to an earlier attempt is still
	// accepted.
	StepWaitingRetry StepStatus = "waiting-retry"
	// StepSucceeded: the action's success reply was applied, or the local
	// step returned nil.
	StepSucceeded StepStatus = "succeeded"
	// StepRejected: the action was rejected (failure reply, or a local step
	// returned a rejection). It did nothing, so it is not compensated.
	StepRejected StepStatus = "rejected"
	// StepSkipped: the step's predicate returned false; nothing ran.
	StepSkipped StepStatus = "skipped"
	// StepTimedOut: the action got no reply within its attempts and the step
	// has no compensation. It may or may not have run.
	StepTimedOut StepStatus = "timed-out"
	// StepAborted: the saga gave up on the action while it was in flight
	// (an operator cancelled the saga, or another branch of its parallel
	// group failed) and the step has no compensation. It may or may not
	// have run.
	StepAborted StepStatus = "aborted"
	// StepCompensating: the compensation command (attempt
	// StepState.CompensationAttempt) was sent and no reply has been applied.
	StepCompensating StepStatus = "compensating"
	// StepCompensated: the compensation's success reply was applied.
	StepCompensated StepStatus = "compensated"
	// StepCompensationFailed: the participant could not compensate; the saga
	// is failed.
	StepCompensationFailed StepStatus = "compensation-failed"
	// StepWaitingEvent: a WaitEvent step waits for its outside event (until
	// Deadline, if it has a timeout).
	StepWaitingEvent StepStatus = "waiting-event"
	// StepTerminated: the saga was terminated while the step's action or
	// compensation was in flight. It may or may not have run.
	StepTerminated StepStatus = "terminated"
)

// StepState is the state of one step of a saga instance. It is stored as
// part of the instance (JSON) and keeps every step's state, not only the
// current one's.
type StepState struct {
	// Name is the step's name in the definition.
	Name string `json:"name"`
	// Status is the step's state.
	Status StepStatus `json:"status"`
	// Attempt is the number of the last action attempt sent (1 for the
	// first); 0 if the action was never sent.
	Attempt int `json:"attempt,omitempty"`
	// CompensationAttempt is the number of the last compensation attempt
	// sent; 0 if the compensation was never sent.
	CompensationAttempt int `json:"compensation_attempt,omitempty"`
	// Deadline is when a timer event is due for the step: the end of the
	// attempt's timeout (StepRunning, StepCompensating) or of the backoff
	// (StepWaitingRetry). Zero when no timer is due.
	Deadline time.Time `json:"deadline,omitzero"`
	// StartBy is when the command in flight (the action's attempt
	// Attempt, or the compensation's attempt CompensationAttempt) must
	// have been published for the step's schedule-to-start timeout
	// (WithScheduleToStartTimeout) not to expire: the time it was sent plus
	// the timeout. Zero without one, and once a timer found the command
	// published.
	StartBy time.Time `json:"start_by,omitzero"`
	// StartedAt is when the step was first sent, run or skipped.
	StartedAt time.Time `json:"started_at,omitzero"`
	// FinishedAt is when the step last reached a settled status (succeeded,
	// rejected, skipped, timed-out, aborted, compensated,
	// compensation-failed).
	FinishedAt time.Time `json:"finished_at,omitzero"`
	// LastError is the most recent failure reason of the step.
	LastError string `json:"last_error,omitempty"`
	// Group is the name of the parallel group the step is a branch of; ""
	// for a step that runs alone.
	Group string `json:"group,omitempty"`
	// Run is the saga's run (Instance.Run) in which the step's action was
	// last sent. Its compensation is sent in that run, so that the
	// participant's barrier finds the action's mark even after an operator
	// restarted the saga from a later step; a reply to the step must carry
	// it.
	Run int `json:"run,omitempty"`
	// Reply is the success reply of a branch that succeeded while other
	// branches of its group were still in flight: it is applied to the data
	// when the group joins (or unwinds), in declaration order, and then
	// cleared.
	Reply json.RawMessage `json:"reply,omitempty"`
}

// Instance is the state of one saga. The orchestrator stores it (Data and
// Steps as JSONB) and passes it back to Apply with each event. Apply never
// modifies the Instance it is given.
type Instance struct {
	// ID identifies the saga; chosen by the orchestrator.
	ID uuid.UUID `json:"id"`
	// Type is the definition's name.
	Type string `json:"type"`
	// Version is the definition's version.
	Version int `json:"version"`
	// Status is the saga's lifecycle status.
	Status Status `json:"status"`
	// Phase is PhaseAction while running or completed, PhaseCompensation
	// from the first compensation on.
	Phase Phase `json:"phase"`
	// CurrentStep is the index of the step in flight (running or
	// compensating), or in StatusFailed of the step whose compensation
	// failed; for a parallel group, the index of its first branch. -1 when
	// the saga is completed, compensated or terminated.
	CurrentStep int `json:"current_step"`
	// Run counts the operator's restarts (EventRestart): 0 for the first
	// run. Commands carry it (Outgoing.Run), so that a participant tells a
	// restarted step's command from the earlier run's, and replies carry it
	// back: a reply to an earlier run is ignored.
	Run int `json:"run,omitempty"`
	// Data is the saga's typed data, JSON-encoded.
	Data json.RawMessage `json:"data"`
	// Steps holds one state per step of the definition, in order.
	Steps []StepState `json:"steps"`
	// Deadline is the earliest Deadline or StartBy of the steps: when the
	// orchestrator must deliver an EventTimer. Zero when no timer is due.
	Deadline time.Time `json:"deadline,omitzero"`
	// LastError is the most recent failure reason: a rejection, a timeout,
	// an abort or a compensation failure.
	LastError string `json:"last_error,omitempty"`
}

// EventKind says what happened to a saga.
type EventKind string

// The kinds of event Apply handles.
const (
	// EventReplySuccess: a participant's success reply arrived.
	EventReplySuccess EventKind = "reply-success"
	// EventReplyFailure: a participant's failure reply arrived (a rejected
	// action, or a compensation that could not be performed).
	EventReplyFailure EventKind = "reply-failure"
	// EventTimer: Instance.Deadline has passed. Delivered by the
	// orchestrator's deadline sweeper, with the saga's messages still
	// unpublished (Event.Unpublished); early or stale timers are ignored.
	EventTimer EventKind = "timer"
	// EventRetry: an operator asks to re-send what is in flight, or, for a
	// failed saga, the compensation that failed.
	EventRetry EventKind = "retry"
	// EventCancel: an operator or the application asks to cancel a running
	// saga: the step in flight (running or waiting for a retry) is
	// compensated through the participant's barrier, then the completed
	// steps in reverse order; the saga ends compensated (or failed).
	EventCancel EventKind = "cancel"
	// EventAbort is the former name of EventCancel, still accepted: it does
	// the same and is recorded as HistoryAborted.
	EventAbort EventKind = "abort"
	// EventOutside: an outside event sent by the application
	// (orchestrator.SendEvent): Type is its name, Payload its payload,
	// EventID the id the sender chose. Consumed by the WaitEvent step
	// waiting for it, ignored otherwise.
	EventOutside EventKind = "outside-event"
	// EventTerminate: an operator or the application asks to stop a running,
	// compensating or failed saga at once, compensating nothing: it ends
	// terminated.
	EventTerminate EventKind = "terminate"
	// EventRestart: an operator asks to run a failed or compensated saga
	// again from the step named Step (or the parallel group it is a branch
	// of), in a new run, with its stored data or with Payload, the
	// replacement data, when set. See Runner.Apply.
	EventRestart EventKind = "restart"
)

// Event is something that happened to a saga, given to Apply.
type Event struct {
	// Kind says what happened.
	Kind EventKind
	// Type is the message type of a reply: the name of the command (action
	// or compensation) it answers. Replies only.
	Type string
	// Step is the name of the step a reply is for, copied from the
	// command's envelope. Replies only.
	Step string
	// StepIndex is the index of the step a reply is for, copied from the
	// command's envelope. Replies only.
	StepIndex int
	// Attempt is the attempt number of the command a reply answers; 0 if
	// unknown. Replies only.
	Attempt int
	// Run is the run of the command a reply answers (Outgoing.Run).
	// Replies only.
	Run int
	// Payload is the reply's JSON payload: the command's reply type for a
	// success, a Failure for a failure.
	Payload json.RawMessage
	// Reason is the operator's reason (retry, abort). For a failure reply it
	// overrides the reason decoded from Payload when set.
	Reason string
	// Actor is who asked for an operator action.
	Actor string
	// EventID is the sender's id of an outside event (EventOutside),
	// recorded in the history.
	EventID string
	// MessageID is the id of the reply message (the envelope's), recorded
	// in the history.
	MessageID uuid.UUID
	// At is when the event happened (the orchestrator's clock). Required.
	At time.Time
	// Unpublished lists the saga's commands and compensations that are
	// still in the orchestrator's outbox, not yet published to the broker,
	// when the timer fires. EventTimer only. While one is listed no step
	// deadline fires (the time a command waits unpublished is not the
	// participant's, and a re-send would wait behind it); only
	// schedule-to-start timeouts do (WithScheduleToStartTimeout).
	Unpublished []MessageRef
}

// MessageRef names one command or compensation a saga sent: its step, its
// phase and its attempt.
type MessageRef struct {
	StepIndex int
	Phase     Phase
	Attempt   int
}

// Outgoing is a command or compensation that the orchestrator must put in
// its outbox, in the same transaction as the new Instance.
type Outgoing struct {
	// Type is the command's name: the message type.
	Type string
	// Phase is PhaseAction for a command, PhaseCompensation for a
	// compensation.
	Phase Phase
	// Step is the step's name; copy it to the envelope, the reply carries
	// it back.
	Step string
	// StepIndex is the step's index; copy it to the envelope, the reply
	// carries it back.
	StepIndex int
	// Attempt is the attempt number (1 for the first send). Re-sends of one
	// step and phase carry the same request; the participant's barrier
	// performs it at most once.
	Attempt int
	// Run is the saga's run (Instance.Run): the participant's barrier keeps
	// one mark per run, step and phase, so that a restarted step runs
	// again. Copy it to the envelope; the reply carries it back.
	Run int
	// Payload is the JSON request.
	Payload json.RawMessage
}

// HistoryEvent names a history entry.
type HistoryEvent string

// The history events.
const (
	// HistoryStarted: the saga was started.
	HistoryStarted HistoryEvent = "started"
	// HistoryStepSkipped: the step's predicate returned false.
	HistoryStepSkipped HistoryEvent = "step-skipped"
	// HistoryCommandSent: an action command was emitted (Attempt says which).
	HistoryCommandSent HistoryEvent = "command-sent"
	// HistoryLocalStepSucceeded: a local step returned nil.
	HistoryLocalStepSucceeded HistoryEvent = "local-step-succeeded"
	// HistoryReplyApplied: a success reply to an action was applied.
	HistoryReplyApplied HistoryEvent = "reply-applied"
	// HistoryStepRejected: an action was rejected (failure reply or local
	// step rejection); Detail is the reason.
	HistoryStepRejected HistoryEvent = "step-rejected"
	// HistoryReplyIgnored: a stale, duplicate or unexpected reply was
	// ignored; Detail is why.
	HistoryReplyIgnored HistoryEvent = "reply-ignored"
	// HistoryTimedOut: an attempt's deadline passed without a reply.
	HistoryTimedOut HistoryEvent = "timed-out"
	// HistoryRetryScheduled: the command will be re-sent after a backoff;
	// Detail gives the time.
	HistoryRetryScheduled HistoryEvent = "retry-scheduled"
	// HistoryCompensationSent: a compensation command was emitted.
	HistoryCompensationSent HistoryEvent = "compensation-sent"
	// HistoryCompensationSkipped: a succeeded step has nothing to
	// compensate.
	HistoryCompensationSkipped HistoryEvent = "compensation-skipped"
	// HistoryStepCompensated: a compensation's success reply was applied.
	HistoryStepCompensated HistoryEvent = "step-compensated"
	// HistoryCompensationFailed: a compensation's failure reply arrived;
	// Detail is the reason.
	HistoryCompensationFailed HistoryEvent = "compensation-failed"
	// HistoryCompleted: the saga completed.
	HistoryCompleted HistoryEvent = "completed"
	// HistoryCompensated: the saga's compensation finished.
	HistoryCompensated HistoryEvent = "compensated"
	// HistoryFailed: the saga failed and waits for an operator.
	HistoryFailed HistoryEvent = "failed"
	// HistoryAborted: an operator aborted the saga (EventAbort, the former
	// name of EventCancel).
	HistoryAborted HistoryEvent = "aborted"
	// HistoryCancelled: the saga was cancelled (EventCancel); Actor and
	// Detail say who and why.
	HistoryCancelled HistoryEvent = "cancelled"
	// HistoryTerminated: the saga was terminated (EventTerminate); Actor
	// and Detail say who and why.
	HistoryTerminated HistoryEvent = "terminated"
	// HistoryEventAwaited: a WaitEvent step started waiting; Detail is the
	// event's name.
	HistoryEventAwaited HistoryEvent = "event-awaited"
	// HistoryEventReceived: the outside event a step waited for was applied;
	// Detail is its name and the sender's event id.
	HistoryEventReceived HistoryEvent = "event-received"
	// HistoryRetried: an operator asked for a retry.
	HistoryRetried HistoryEvent = "retried"
	// HistoryGroupJoined: every branch of a parallel group succeeded (or
	// was skipped) and their replies were applied, in declaration order;
	// Detail is the group's name (the entry names no step).
	HistoryGroupJoined HistoryEvent = "group-joined"
	// HistoryRestarted: an operator restarted the saga (EventRestart) from
	// the step concerned; Detail says from which run, version and data.
	HistoryRestarted HistoryEvent = "restarted"
)

// HistoryEntry records one decision of the core. The orchestrator appends
// them to the saga's history, in order.
type HistoryEntry struct {
	// At is the time of the event that caused the decision.
	At time.Time `json:"at"`
	// Event names the decision.
	Event HistoryEvent `json:"event"`
	// Step is the name of the step concerned; "" for saga-level entries
	// (started, completed, compensated, failed).
	Step string `json:"step,omitempty"`
	// StepIndex is the index of the step concerned; -1 for saga-level
	// entries.
	StepIndex int `json:"step_index"`
	// Phase is the phase the entry belongs to.
	Phase Phase `json:"phase,omitempty"`
	// Attempt is the attempt number concerned, if any.
	Attempt int `json:"attempt,omitempty"`
	// Detail is a human-readable explanation: a reason, a delay.
	Detail string `json:"detail,omitempty"`
	// Actor is the operator behind an operator action.
	Actor string `json:"actor,omitempty"`
	// MessageID is the id of the reply that caused the entry; uuid.Nil if
	// none.
	MessageID uuid.UUID `json:"message_id,omitzero"`
}

// Result is the outcome of Start or Apply.
type Result struct {
	// Instance is the new state of the saga; equal to the input when
	// Ignored.
	Instance Instance
	// Emit lists the messages to write to the outbox, in order.
	Emit []Outgoing
	// Withdraw lists messages of Event.Unpublished that the saga gave up on
	// (a schedule-to-start timeout): delete them from the outbox, in the
	// same transaction, unless a relay has published them meanwhile.
	Withdraw []MessageRef
	// History lists the entries to append to the saga's history.
	History []HistoryEntry
	// Ignored is true when the event changed nothing (a stale or duplicate
	// reply, an early timer). History then holds a HistoryReplyIgnored
	// entry for a reply and nothing for a timer.
	Ignored bool
	// IgnoreReason says why the event was ignored.
	IgnoreReason string
}
