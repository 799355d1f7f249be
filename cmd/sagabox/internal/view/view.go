// Package view holds the JSON shapes the sagabox command prints with
// --json: one schema for every command. Every output is a JSON object; keys
// are snake_case; times are RFC 3339 in UTC and are left out when zero;
// durations are float seconds in keys ending in _seconds; optional strings
// are left out when empty. docs/operations.md documents the shapes, and
// fields are only ever added, never renamed or removed.
package view

import (
	"encoding/json"
	"time"

	"github.com/google/uuid"

	"github.com/sagabox/sagabox/saga"
)

// Error is what a failing command prints to stderr with --json.
type Error struct {
	// Error is the message a person reads.
	Error string `json:"error"`
	// ExitCode is the command's exit code (cli.Exit… constants).
	ExitCode int `json:"exit_code"`
}

// Saga is one saga: a row of `saga list`, the subject of `saga show` (which
// adds Data, Steps and History) and the result of an applied operator
// request.
type Saga struct {
	ID      uuid.UUID `json:"id"`
	Type    string    `json:"type"`
	Version int       `json:"version"`
	Status  string    `json:"status"`
	Phase   string    `json:"phase"`
	// Run counts the operator's restarts; left out for a saga never
	// restarted.
	Run int `json:"run,omitempty"`
	// CurrentStep names the step in flight (or, in a failed saga, the step
	// whose compensation failed); left out when no step is current.
	CurrentStep string `json:"current_step,omitempty"`
	// CurrentStepIndex is that step's index; -1 when no step is current.
	CurrentStepIndex int       `json:"current_step_index"`
	StartKey         string    `json:"start_key,omitempty"`
	LastError        string    `json:"last_error,omitempty"`
	Deadline         time.Time `json:"deadline,omitzero"`
	Revision         int64     `json:"revision"`
	CreatedAt        time.Time `json:"created_at"`
	UpdatedAt        time.Time `json:"updated_at"`
	FinishedAt       time.Time `json:"finished_at,omitzero"`
	// Data, Steps and History are in `saga show` only.
	Data    json.RawMessage `json:"data,omitempty"`
	Steps   []Step          `json:"steps,omitempty"`
	History []HistoryEntry  `json:"history,omitempty"`
}

// Step is the state of one step of a saga.
type Step struct {
	Index               int       `json:"index"`
	Name                string    `json:"name"`
	Status              string    `json:"status"`
	Attempt             int       `json:"attempt"`
	CompensationAttempt int       `json:"compensation_attempt"`
	Deadline            time.Time `json:"deadline,omitzero"`
	StartedAt           time.Time `json:"started_at,omitzero"`
	FinishedAt          time.Time `json:"finished_at,omitzero"`
	LastError           string    `json:"last_error,omitempty"`
	// Group is the parallel group the step is a branch of; left out for a
	// step that runs alone.
	Group string `json:"group,omitempty"`
}

// HistoryEntry is one entry of a saga's history.
type HistoryEntry struct {
	At        time.Time `json:"at"`
	Event     string    `json:"event"`
	Step      string    `json:"step,omitempty"`
	StepIndex int       `json:"step_index"`
	Phase     string    `json:"phase,omitempty"`
	Attempt   int       `json:"attempt"`
	Detail    string    `json:"detail,omitempty"`
	Actor     string    `json:"actor,omitempty"`
	MessageID uuid.UUID `json:"message_id,omitzero"`
}

// SagaList is `saga list`.
type SagaList struct {
	Sagas []Saga `json:"sagas"`
	// NextCursor continues the listing (--after); left out on the last page.
	NextCursor string `json:"next_cursor,omitempty"`
}

// Operation states.
const (
	OperationPending   = "pending"
	OperationApplied   = "applied"
	OperationRefused   = "refused"
	OperationWithdrawn = "withdrawn"
)

// Operation is an operator request (retry or abort) recorded for an
// orchestrator to apply.
type Operation struct {
	ID     int64     `json:"id"`
	SagaID uuid.UUID `json:"saga_id"`
	Action string    `json:"action"`
	// State is pending, applied, refused or withdrawn.
	State       string    `json:"state"`
	Actor       string    `json:"actor"`
	Reason      string    `json:"reason"`
	RequestedAt time.Time `json:"requested_at"`
	// AppliedAt is when an orchestrator applied or refused the request.
	AppliedAt time.Time `json:"applied_at,omitzero"`
	// Error is why the orchestrator refused it.
	Error       string    `json:"error,omitempty"`
	WithdrawnAt time.Time `json:"withdrawn_at,omitzero"`
	WithdrawnBy string    `json:"withdrawn_by,omitempty"`
}

// OperationResult is `saga retry` and `saga abort`: the request and, once
// applied, the saga's new state.
type OperationResult struct {
	Operation Operation `json:"operation"`
	Saga      *Saga     `json:"saga,omitempty"`
}

// OperationList is `ops list`.
type OperationList struct {
	Schema     string      `json:"schema"`
	Operations []Operation `json:"operations"`
}

// OutboxStats is one schema's outbox in `outbox stats`.
type OutboxStats struct {
	Schema           string  `json:"schema"`
	Backlog          int64   `json:"backlog"`
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
	Retrying         int64   `json:"retrying"`
	Dead             int64   `json:"dead"`
}

// OutboxStatsList is `outbox stats`.
type OutboxStatsList struct {
	Schemas []OutboxStats `json:"schemas"`
}

// InboxStats is one schema's inbox in `inbox stats`.
type InboxStats struct {
	Schema             string  `json:"schema"`
	Processed          int64   `json:"processed"`
	Duplicates         int64   `json:"duplicates"`
	DuplicatedMessages int64   `json:"duplicated_messages"`
	RecentlyDuplicated int64   `json:"recently_duplicated"`
	RecentSeconds      float64 `json:"recent_seconds"`
}

// InboxStatsList is `inbox stats`.
type InboxStatsList struct {
	Schemas []InboxStats `json:"schemas"`
}

// DeadOutboxMessage is an outbox row the relay gave up on.
type DeadOutboxMessage struct {
	ID              int64     `json:"id"`
	MessageID       uuid.UUID `json:"message_id"`
	Kind            string    `json:"kind"`
	Type            string    `json:"type"`
	RoutingKey      string    `json:"routing_key"`
	SagaID          uuid.UUID `json:"saga_id,omitzero"`
	PublishAttempts int       `json:"publish_attempts"`
	Reason          string    `json:"reason"`
	DeadAt          time.Time `json:"dead_at"`
}

// DeadOutboxList is `outbox dead`.
type DeadOutboxList struct {
	Schema   string              `json:"schema"`
	Messages []DeadOutboxMessage `json:"messages"`
}

// DeadOutboxRetry is `outbox retry-dead`.
type DeadOutboxRetry struct {
	Schema    string `json:"schema"`
	Requested int    `json:"requested"`
	Matched   int64  `json:"matched"`
	Deleted   bool   `json:"deleted"`
}

// Migration is one migration of a line.
type Migration struct {
	Line    string `json:"line"`
	Version int    `json:"version"`
	Name    string `json:"name"`
	// AppliedAt is when it was applied (`migrate list`); left out while
	// pending.
	AppliedAt time.Time `json:"applied_at,omitzero"`
}

// MigrationList is `migrate list`, `migrate up` (the migrations applied)
// and `migrate down` (those reverted).
type MigrationList struct {
	Schema     string      `json:"schema"`
	Migrations []Migration `json:"migrations"`
}

// DeadLetterQueue is one dead-letter queue in `dlq list`.
type DeadLetterQueue struct {
	// Queue is the dead-letter queue, Source the queue its messages came
	// from and go back to on replay.
	Queue    string `json:"queue"`
	Source   string `json:"source"`
	Messages int    `json:"messages"`
}

// DeadLetterQueueList is `dlq list`.
type DeadLetterQueueList struct {
	Namespace string            `json:"namespace"`
	Queues    []DeadLetterQueue `json:"queues"`
}

// DeadLetter is one dead-lettered message in `dlq show`.
type DeadLetter struct {
	MessageID      string    `json:"message_id,omitempty"`
	Type           string    `json:"type,omitempty"`
	Kind           string    `json:"kind,omitempty"`
	SagaID         string    `json:"saga_id,omitempty"`
	Step           string    `json:"step,omitempty"`
	Reason         string    `json:"reason,omitempty"`
	DeadLetteredAt time.Time `json:"dead_lettered_at,omitzero"`
	Replays        int       `json:"replays"`
	Bytes          int       `json:"bytes"`
	// Payload is the message body when it is JSON.
	Payload json.RawMessage `json:"payload,omitempty"`
}

// DeadLetterList is `dlq show`.
type DeadLetterList struct {
	Queue    string       `json:"queue"`
	Source   string       `json:"source"`
	Messages []DeadLetter `json:"messages"`
}

// DeadLetterReplay is `dlq replay`.
type DeadLetterReplay struct {
	Queue    string `json:"queue"`
	Source   string `json:"source"`
	Replayed int    `json:"replayed"`
	Actor    string `json:"actor"`
	Reason   string `json:"reason"`
}

// Teardown is `namespace teardown`.
type Teardown struct {
	Namespace string   `json:"namespace"`
	DryRun    bool     `json:"dry_run"`
	Queues    []string `json:"queues"`
	Exchanges []string `json:"exchanges"`
}

// Version is `version`.
type Version struct {
	Version   string    `json:"version"`
	GoVersion string    `json:"go_version"`
	Revision  string    `json:"vcs_revision,omitempty"`
	Time      time.Time `json:"vcs_time,omitzero"`
	Modified  bool      `json:"vcs_modified"`
}

// Bulk is `saga bulk`: the sagas a filter selected for an action and, unless
// it was a dry run, the requests recorded for them.
type Bulk struct {
	Action string `json:"action"`
	DryRun bool   `json:"dry_run"`
	// Matched counts the sagas the filter selected; Applicable those of them
	// whose status the action applies to.
	Matched    int `json:"matched"`
	Applicable int `json:"applicable"`
	// First are the ids of the first applicable sagas (at most 20).
	First []uuid.UUID `json:"first"`
	// Requests are the requests recorded (empty in a dry run).
	Requests []Operation `json:"requests"`
}

// Definition is a saga definition recorded by an orchestrator: `saga graph
// --json`, and each entry of `saga definitions`.
type Definition struct {
	Type         string    `json:"type"`
	Version      int       `json:"version"`
	RegisteredAt time.Time `json:"registered_at"`
	SeenAt       time.Time `json:"seen_at"`
	// Steps counts the definition's steps (a group's branches each count).
	Steps int `json:"steps"`
	// Shape is the definition's saga.Shape: its steps, groups,
	// compensations, waits, timeouts and retry policies.
	Shape saga.Shape `json:"shape"`
}

// DefinitionList is `saga definitions`.
type DefinitionList struct {
	Schema      string       `json:"schema"`
	Definitions []Definition `json:"definitions"`
}

// Doctor is `sagabox doctor`: what it checked and what it found.
type Doctor struct {
	Schema    string        `json:"schema"`
	Namespace string        `json:"namespace"`
	Checks    []DoctorCheck `json:"checks"`
	// Findings are the problems found, each with what to do; empty when
	// there is nothing to fix.
	Findings []Finding `json:"findings"`
}

// DoctorCheck is one check of `sagabox doctor` and its result.
type DoctorCheck struct {
	Check  string `json:"check"`
	Result string `json:"result"`
}

// Finding is a problem `sagabox doctor` found. Check names the check
// ("schema", "routes", "unpublished", "relay-slot", "dead-rows",
// "dead-letters"); the fields that locate it are left out when they do
// not apply.
type Finding struct {
	Check   string `json:"check"`
	Problem string `json:"problem"`
	Fix     string `json:"fix"`
	// SagaType, Version, Step and Phase locate a command in a definition
	// (routes) or the sagas concerned (unpublished).
	SagaType string `json:"saga_type,omitempty"`
	Version  int    `json:"version,omitempty"`
	Step     string `json:"step,omitempty"`
	Phase    string `json:"phase,omitempty"`
	// RoutingKey is the command concerned (its routing key).
	RoutingKey string `json:"routing_key,omitempty"`
	// Queue is the queue concerned (dead-letters).
	Queue string `json:"queue,omitempty"`
	// Count is how many sagas, messages or bytes.
	Count int64 `json:"count,omitempty"`
}
