package driver

import (
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sagabox/sagabox/message"
)

// OutboxStats is the publishing state of an outbox.
type OutboxStats struct {
	// Backlog is the number of unpublished rows.
	Backlog int64
	// OldestAge is the age of the oldest unpublished row; zero when none.
	OldestAge time.Duration
	// Retrying counts unpublished rows that were claimed at least once.
	Retrying int64
	// Dead counts rows the relay gave up on (OutboxSettle.Dead).
	Dead int64
}

// LateSend is a saga's command or compensation that was published Delay
// after it was written.
type LateSend struct {
	SagaID    uuid.UUID
	StepIndex int
	Phase     message.Phase
	Attempt   int
	Delay     time.Duration
}

// DeadRow is a row of a batch that the relay gives up on, and why.
type DeadRow struct {
	ID     int64
	Reason string
}

// SagaCount is the number of sagas of one type in one status.
type SagaCount struct {
	Type   string
	Status string
	Count  int64
}

// UnpublishedMessage is a saga's command or compensation still in the
// outbox, not yet published.
type UnpublishedMessage struct {
	SagaID    uuid.UUID
	MessageID uuid.UUID
	Kind      message.Kind
	StepIndex int
	Attempt   int
	// CreatedAt is when it was written.
	CreatedAt time.Time
}

// OutboxTypeBacklog is the unpublished commands (or compensations) of one
// type in an outbox.
type OutboxTypeBacklog struct {
	Type  string
	Kind  message.Kind
	Count int64
	// Oldest is when the oldest of them was written.
	Oldest time.Time
	// Attempts is the most publish attempts one of them had.
	Attempts int
	// LastError is the last error a relay recorded for the newest one
	// that has one; empty if none has.
	LastError string
}

// OutboxRow is a claimed outbox row: the message and its publishing state.
type OutboxRow struct {
	// ID is the row's position in write order.
	ID int64
	// Message is the message to publish, exactly as written.
	Message message.Message
	// PublishAttempts counts claims of the row, this one included.
	PublishAttempts int
}

// OutboxClaimOpts tunes OutboxClaim.
type OutboxClaimOpts struct {
	// Max is the most rows to claim; 0 only settles.
	Max int
	// Lease is how long the claim holds; past it another relay may claim the
	// rows again.
	Lease time.Duration
	// ClaimedBy names the claimer, for inspection.
	ClaimedBy string
	// Settle is the outcome of the claimer's previous batch, recorded in the
	// same statement.
	Settle OutboxSettle
}

// OutboxSettle is the outcome of a published batch.
type OutboxSettle struct {
	// Published are the rows the broker confirmed: deleted, or marked
	// published when KeepPublished.
	Published []int64
	// KeepPublished keeps published rows (marked) for retention to delete
	// later, for inspection.
	KeepPublished bool
	// Failed are the rows not confirmed; they can be claimed again after
	// RetryAfter, with Cause recorded.
	Failed     []int64
	RetryAfter time.Duration
	Cause      error
	// Dead are the rows given up on: set aside, with their reason, until an
	// operator retries or deletes them (OutboxDeadRetry, OutboxDeadDelete).
	Dead []DeadRow
	// Late are the saga commands and compensations among Published that
	// were published late: their steps' deadlines are pushed back by the
	// delay in the same transaction (a schema with sagas only).
	Late []LateSend
}

// Empty reports whether s records nothing: no row published, failed or
// dead.
func (s OutboxSettle) Empty() bool {
	return len(s.Published) == 0 && len(s.Failed) == 0 && len(s.Dead) == 0
}

// Attempt is the record of a message's failed processing attempts.
type Attempt struct {
	MessageID uuid.UUID
	Kind      message.Kind
	Type      string
	SagaID    uuid.UUID
	// Attempts counts the failed processing attempts.
	Attempts int
	// LastError is the error of the last failed attempt, or the reason the
	// message was dead-lettered.
	LastError string
	// DeadLetteredAt is when the message was dead-lettered; zero if it was
	// not.
	DeadLetteredAt time.Time
	UpdatedAt      time.Time
}

// Operation is an operator action requested from outside an orchestrator
// (the CLI), which a running orchestrator applies.
type Operation struct {
	ID     int64
	SagaID uuid.UUID
	// Action is "retry", "cancel" ("abort", its former name), "terminate"
	// or "restart".
	Action string
	// Params are the action's parameters as JSON: a restart's
	// orchestrator.RestartOpts; nil for the other actions.
	Params      []byte
	Actor       string
	Reason      string
	RequestedAt time.Time
	// AppliedAt is when an orchestrator handled the request; zero while it
	// is pending.
	AppliedAt time.Time
	// Error is why the orchestrator refused the action; empty when applied.
	Error string
	// WithdrawnAt is when the request was withdrawn (no orchestrator
	// applies it), and WithdrawnBy who withdrew it; zero and empty unless
	// withdrawn.
	WithdrawnAt time.Time
	WithdrawnBy string
}

// Pending reports whether the request waits for an orchestrator.
func (o *Operation) Pending() bool { return o.AppliedAt.IsZero() && o.WithdrawnAt.IsZero() }

// SagaRecord is a saga instance row.
type SagaRecord struct {
	ID       uuid.UUID
	Type     string
	Version  int
	Status   string
	StartKey string
	// Data is the saga's data as JSON.
	Data []byte
	// Steps is the per-step state as JSON, as written by the saga core.
	Steps       []byte
	CurrentStep int
	Phase       string
	// Run counts the operator's restarts (saga.Instance.Run).
	Run int
	// Revision counts applied transitions.
	Revision int64
	// Deadline is the earliest pending deadline; zero when none.
	Deadline   time.Time
	Attempts   int
	LastError  string
	CreatedAt  time.Time
	UpdatedAt  time.Time
	FinishedAt time.Time
	// TraceParent and TraceState are the W3C trace context of the span that
	// started the saga; empty without tracing.
	TraceParent, TraceState string
	// StartDataHash is the hash of the data a saga with a start key was
	// started with; nil without a key (or for sagas started before it was
	// kept).
	StartDataHash []byte
	// StartKeyReleased is true once a newer saga holds the start key.
	StartKeyReleased bool
	// ConcurrencyKey is the key of which at most one saga of the type runs
	// at a time; empty for none.
	ConcurrencyKey string
	// AdmittedAt is when the saga left the queue (its start time if it
	// never waited); zero while it is queued.
	AdmittedAt time.Time
}

// Admission is what a start needs to know to run a saga at once or queue
// it (Executor.SagaAdmission).
type Admission struct {
	// Running counts the type's running and compensating sagas, up to the
	// limit asked for; 0, not counted, when Queued (the start queues then
	// whatever the count).
	Running int
	// Queued is true when sagas of the type without a concurrency key wait
	// for admission.
	Queued bool
	// KeyTaken is true when a saga of the type and the start's concurrency
	// key is queued, running or compensating.
	KeyTaken bool
}

// QueuedCount counts the queued sagas of a type.
type QueuedCount struct {
	Type  string
	Count int64
	// Oldest is the start time of the longest-waiting saga.
	Oldest time.Time
}

// HistoryRecord is one entry of a saga's history.
type HistoryRecord struct {
	ID        int64
	SagaID    uuid.UUID
	At        time.Time
	Event     string
	Step      string
	StepIndex int
	Phase     string
	Attempt   int
	Detail    string
	Actor     string
	MessageID uuid.UUID
}

// SagaKey names a saga definition: its type and version.
type SagaKey struct {
	Type    string
	Version int
}

// SagaStart is a saga about to be started: its row, its history and its
// first messages.
type SagaStart struct {
	Saga     SagaRecord
	History  []HistoryRecord
	Messages []message.Message
}

// Receipt is what ReplyReceive found for one reply.
type Receipt struct {
	// Fresh is false for a reply the inbox had: a duplicate, which counted
	// itself and must change nothing.
	Fresh bool
	// Saga is the reply's saga, locked; nil for a duplicate and for a saga
	// that does not exist here.
	Saga *SagaRecord
}

// Transition is what applying one event to a saga decided: its new state,
// its history and its outgoing messages.
type Transition struct {
	// Saga is the saga's new state, computed from the saga at
	// Saga.Revision; nil when only History is written (an ignored reply).
	Saga *SagaRecord
	// History is appended to the history of the saga History[i].SagaID.
	History []HistoryRecord
	// Messages go to the outbox; they are prepared in place
	// (message.Message.Prepare).
	Messages []message.Message
	// WithdrawUnsent deletes the saga's commands and compensations that no
	// relay has published yet, in the same transaction: the saga was
	// terminated and sends nothing more.
	WithdrawUnsent bool
	// Withdraw deletes the saga's commands and compensations with these
	// message ids that no relay has published yet, in the same
	// transaction, before Messages are written: the saga gave up on them.
	Withdraw []uuid.UUID
}

// SagaFilter selects sagas for SagaList.
type SagaFilter struct {
	// Type keeps only sagas of this definition name; empty keeps all.
	Type string
	// Version keeps only sagas of this definition version; 0 keeps all.
	Version int
	// StartKey keeps only sagas started with this key; empty keeps all.
	StartKey string
	// Statuses keeps only sagas in one of these statuses; empty keeps all.
	Statuses []string
	// UpdatedBefore keeps only sagas not updated since; zero keeps all.
	UpdatedBefore time.Time
	// DeadlineBefore keeps only running or compensating sagas whose
	// deadline is before it (overdue ones); zero keeps all.
	DeadlineBefore time.Time
	// After continues a listing after this saga (its CreatedAt and ID).
	After *SagaRecord
	// Limit is the page size. Defaults to 100.
	Limit int
}

// Retention says which processed rows Prune deletes: those older than each
// cutoff (a zero cutoff keeps the table as it is), at most Batch rows per
// statement.
type Retention struct {
	// Outbox: published rows published before it.
	Outbox time.Time
	// Inbox: inbox rows received before it, and attempt rows last updated
	// before it.
	Inbox time.Time
	// Barrier: barrier marks left before it.
	Barrier time.Time
	// Sagas: completed and compensated sagas (with their history) finished
	// before it.
	Sagas time.Time
	// Batch is the most rows one statement deletes.
	Batch int
}

// Pruned counts the rows one Prune deleted, by table.
type Pruned struct {
	Outbox, Inbox, InboxAttempts, Barrier, Sagas int64
}

// Total is the number of rows deleted.
func (p Pruned) Total() int64 { return p.Outbox + p.Inbox + p.InboxAttempts + p.Barrier + p.Sagas }

// BarrierOutcome is what happened to one phase of a saga step at a
// participant, as its barrier mark records it.
type BarrierOutcome string

// The barrier outcomes.
const (
	// BarrierApplied: the handler ran and its effect committed.
	BarrierApplied BarrierOutcome = "applied"
	// BarrierRejected: the action was rejected (or given up on); it had no
	// effect.
	BarrierRejected BarrierOutcome = "rejected"
	// BarrierSkipped: a compensation with nothing to undo (the action never
	// ran or was rejected), answered with success.
	BarrierSkipped BarrierOutcome = "skipped"
	// BarrierBlocked: an action mark left by a compensation that came first;
	// the action, should it arrive, is not applied.
	BarrierBlocked BarrierOutcome = "blocked"
	// BarrierStarted: a phase whose handler calls an outside system, marked
	// before the call and committed; the outcome is not known yet. A
	// compensation waits for its action to leave this state.
	BarrierStarted BarrierOutcome = "started"
)

// Delivery is what DeliveryBegin found for one message at a participant.
type Delivery struct {
	// Duplicate is true when the inbox had the message: it counted itself
	// and nothing else may change.
	Duplicate bool
	// Marked is true when this message left the barrier mark of its saga
	// step and phase: the handler runs (for a compensation, if Action says
	// so). Otherwise Prior is the mark an earlier message left, and its
	// reply is this message's too.
	Marked bool
	Prior  BarrierMark
	// Action is, for a compensation that left its mark, the outcome of the
	// step's action here: BarrierBlocked when the action never arrived (the
	// compensation left the action's mark itself, so that a late action is
	// not applied).
	Action BarrierOutcome
	// Resumed is true for a message of an outside handler whose inbox entry
	// was left "started" by an earlier delivery: its call is made again.
	Resumed bool
	// Attempt is, for an outside handler's message, how many times its
	// outside call was begun, this one included.
	Attempt int
	// Tx is the transaction the handler runs in: a savepoint of the
	// delivery's, begun in the same round trip. Its Commit and Rollback end
	// the savepoint, never the delivery.
	Tx pgx.Tx
}

// BarrierMark is the record of one phase of one saga step at a participant,
// with the reply every later message of that phase gets.
type BarrierMark struct {
	Outcome BarrierOutcome
	// ReplyKind and ReplyPayload are the reply sent for the phase.
	ReplyKind    message.Kind
	ReplyPayload []byte
}

// DeliveryEnd is how a delivery ends.
type DeliveryEnd struct {
	// Discard rolls the handler's writes back (a rejection).
	Discard bool
	// Mark, when set, is the outcome and reply of the barrier mark this
	// delivery left.
	Mark *BarrierMark
	// Reply, when set, is written to the outbox (it is prepared in place).
	Reply *message.Message
	// Settle marks the message's "started" inbox entry "done": an outside
	// handler's delivery that ends in the transaction that began it.
	Settle bool
	// Undo, for a delivery of a group (Executor.DeliveryBeginMany), leaves
	// nothing of it: its handler failed, so its handler's writes are rolled
	// back and its inbox entry and barrier marks removed, and it is
	// delivered again on its own.
	Undo bool
}

// LogBatch is what OutboxLog.Next read: rows in commit order, and how far
// the slot may be confirmed once all of them are published.
type LogBatch struct {
	Rows []OutboxRow
	// Xids are the transactions (their 32-bit ids) whose rows Rows holds,
	// in commit order. A commit is streamed before the transaction is
	// visible to other sessions (the committer may still wait for a
	// synchronous standby): OutboxLogAwaitVisible waits for them before the
	// rows are looked up or settled.
	Xids []uint32
	// Through is the log position that may be confirmed once every row of
	// Rows is published: the end of the last transaction completed in the
	// batch, or, when the reader is idle (no transaction open, no row
	// returned), the server's position; 0 when the batch completes no
	// transaction (it is the head of a large one).
	Through uint64
}

// LogStatus is the state of log mode's set-up and slot in the database.
type LogStatus struct {
	// WALLevel is the server's wal_level; log mode needs "logical".
	WALLevel string
	// PublicationExists and SlotExists say whether the publication and the
	// replication slot exist.
	PublicationExists, SlotExists bool
	// Active is whether a reader holds the slot, ActivePID its backend.
	Active    bool
	ActivePID int
	// LagBytes is how much write-ahead log the slot holds behind the
	// server's current position (pg_current_wal_lsn - confirmed_flush_lsn).
	LagBytes int64
	// ConfirmedLSN is the slot's confirmed flush position.
	ConfirmedLSN uint64
}

// OutsideEvent is an event the application sent to a saga
// (orchestrator.SendEvent).
type OutsideEvent struct {
	SagaID uuid.UUID
	// EventID is the sender's id of the event, unique per saga.
	EventID string
	// Name is the event's name and Payload its JSON payload.
	Name    string
	Payload []byte
	// ReceivedAt is when it was sent (the orchestrator's clock).
	ReceivedAt time.Time
}

// SchemaNeeds is what a client needs of its schema (Executor.SchemaCheck).
type SchemaNeeds struct {
	// Sagas: the saga tables (an orchestrator's schema).
	Sagas bool
	// LogRelay: the REPLICATION attribute, for a relay in log mode.
	LogRelay bool
}

// In is the transaction an operation runs in: one of the engine's (T) or,
// when T is nil, a caller's (Caller).
type In struct {
	T      Tx
	Caller pgx.Tx
}

// EventSettlement is what became of an outside event (Executor.EventSettle).
type EventSettlement struct {
	SagaID  uuid.UUID
	EventID string
	// Status is "consumed" or "ignored", and Detail why it was ignored.
	Status, Detail string
	At             time.Time
}

// StartKeyRelease names the start key a finished saga gives up to a new
// saga (Executor.SagaReleaseStartKey), and the history entry (Event,
// Detail) it leaves on the finished saga.
type StartKeyRelease struct {
	SagaType, StartKey string
	Event, Detail      string
	At                 time.Time
}

// NewOperation is an operator request about to be recorded
// (Executor.OperationRequest).
type NewOperation struct {
	SagaID uuid.UUID
	// Action is "retry", "cancel", "terminate" or "restart"; Params its
	// parameters as JSON (a restart's options; nil for the others).
	Action        string
	Params        []byte
	Actor, Reason string
}
