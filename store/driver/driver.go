// Package driver is the contract between sagabox's delivery engine and its
// persistence, in the manner of River's driver: one method per unit of work
// of the engine (start a saga, begin and finish a delivery, receive replies,
// write transitions, claim and settle an outbox batch, prune), each sent as
// one pipelined round trip where SQL allows, in the types of package message
// and of this package. Package store implements it on PostgreSQL
// (store.NewExecutor); the engine, the clients and sagabox's own tools
// use it. It is internal: its shape follows the engine's needs.
package driver

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sagabox/sagabox/message"
)

// Tx is one of the engine's own transactions (a delivery, a reply, a sweep,
// an operator action). It costs no round trip of its own: BEGIN goes out in
// one batch with its first operation's statement, and COMMIT with the last
// one's (operations that end a transaction say so). Operations take it as
// their t. A Tx is used by one goroutine at a time.
type Tx interface {
	// Commit sends the statements the transaction has pending (the write
	// of the operation that ended it, say) and COMMIT in one round trip,
	// and returns what the transaction wrote to the outbox. A transaction
	// that never began commits nothing, and costs nothing.
	Commit(ctx context.Context) (Committed, error)
	// Rollback ends the transaction without committing what it did. It is a
	// no-op once it is over, so it can be deferred.
	Rollback(ctx context.Context)
	// Savepoint returns a savepoint of the transaction, as pgx.Tx, for code
	// that does its own writes in it (a local step): its Commit releases
	// the savepoint, its Rollback rolls back to it, and it cannot end the
	// transaction.
	Savepoint(ctx context.Context) (pgx.Tx, error)
}

// Executor is the engine's persistence for one schema.
type Executor interface {
	// Schema returns the schema the executor works in.
	Schema() string
	// MaxConns returns the most connections the executor's pool opens; 0
	// when it has no pool.
	MaxConns() int
	// Begin returns a transaction that begins with its first operation; it
	// acquires a connection then. opts may be nil.
	Begin(opts *BeginOpts) Tx
	// SchemaCheck checks that the schema is ready for a client that needs
	// what needs says: the role it connects as has the privileges of its
	// part (an error naming the missing GRANTs otherwise), and the schema
	// holds the messaging tables at their latest version, and with
	// needs.Sagas the saga tables too (an error wrapping ErrSchemaOutdated,
	// which names the command to run, otherwise).
	SchemaCheck(ctx context.Context, needs SchemaNeeds) error
	// InterpretError marks err, an error of code the engine runs besides
	// the executor's operations (a handler, a local step, which may reach
	// the database through pools of their own), with the sentinel errors
	// of this package (ErrConflict, ErrConnection, ErrDataRefused) as the
	// executor marks its own errors; other errors pass unchanged.
	InterpretError(err error) error

	// SagaStart writes st in tx, the caller's transaction, in one statement:
	// the saga exists, and its first messages are sent, if and only if tx
	// commits. It prepares the messages (message.Message.Prepare). When the
	// saga's start key is taken by a saga of the same type, it writes
	// nothing and returns false (a concurrent start with the same key waits
	// for the other transaction to end). A saga written is left in st.Saga
	// as stored (see SagaWrite).
	SagaStart(ctx context.Context, tx pgx.Tx, st *SagaStart, now time.Time) (bool, error)
	// SagaAdmission reads, in tx (the caller's transaction), what a start
	// of a saga of sagaType needs to run at once or be queued: its running
	// sagas counted up to maxRunning, whether sagas without a concurrency
	// key wait for admission, and whether a saga holds or waits for key
	// ("" for none).
	SagaAdmission(ctx context.Context, tx pgx.Tx, sagaType string, maxRunning int, key string) (Admission, error)
	// SagaConcurrencyKeyLock takes, in tx and until it ends, the lock of the
	// concurrency key key of sagaType, waiting for a transaction that holds
	// it. SagaAdmission must follow it, as a statement of its own.
	SagaConcurrencyKeyLock(ctx context.Context, tx pgx.Tx, sagaType, key string) error
	// AdmissionTryLock takes, in t and until it ends, the schema's
	// admission lock, and reports false when another transaction holds it.
	AdmissionTryLock(ctx context.Context, t Tx) (bool, error)
	// SagaCountRunning counts, in t, the running and compensating sagas of
	// sagaType, up to max.
	SagaCountRunning(ctx context.Context, t Tx, sagaType string, max int) (int, error)
	// SagaClaimQueued locks in t, in start order, up to max queued sagas
	// of sagaType and of one of the versions that may be admitted now:
	// those without a concurrency key and the first queued saga of each key
	// no saga of the type is running or compensating for.
	SagaClaimQueued(ctx context.Context, t Tx, sagaType string, versions []int, max int) ([]SagaRecord, error)
	// SagaConcurrencyKeysFree takes, in t, the locks of those keys of sagaType
	// that no transaction holds and returns those of them that no saga of
	// the type is running or compensating for: two statements, so that the
	// second sees what the lock's last holder committed.
	SagaConcurrencyKeysFree(ctx context.Context, t Tx, sagaType string, keys []string) (map[string]bool, error)
	// SagaQueued counts the sagas waiting for admission, per type.
	SagaQueued(ctx context.Context) ([]QueuedCount, error)
	// SagaGetByStartKey returns the saga of type sagaType started with
	// startKey, read in tx (nil: on the pool), or an error wrapping
	// message.ErrNotFound.
	SagaGetByStartKey(ctx context.Context, tx pgx.Tx, sagaType, startKey string) (SagaRecord, error)
	// SagaLockIn locks the sagas ids in tx, a caller's transaction, in id
	// order.
	SagaLockIn(ctx context.Context, tx pgx.Tx, ids []uuid.UUID) ([]SagaRecord, error)
	// SagaWriteIn writes trs in tx, a caller's transaction, in one
	// statement, without committing.
	SagaWriteIn(ctx context.Context, tx pgx.Tx, trs []Transition, now time.Time) error
	// EventRecord records ev in in (the sender's transaction, or an engine
	// transaction delivering the event) and reports whether it is new
	// (false: its saga has an event with its id).
	EventRecord(ctx context.Context, in In, ev *OutsideEvent) (bool, error)
	// EventPending returns the oldest pending event called name of saga
	// id, read in in; nil if none.
	EventPending(ctx context.Context, in In, id uuid.UUID, name string) (*OutsideEvent, error)
	// EventSettle records, in in, what became of an event (s).
	EventSettle(ctx context.Context, in In, s EventSettlement) error
	// SagaReleaseStartKey releases in tx, the caller's transaction, the
	// start key of the finished saga holding it (r), appending a history
	// entry to it, and returns its id; none if no finished saga holds the
	// key.
	SagaReleaseStartKey(ctx context.Context, tx pgx.Tx, r StartKeyRelease) ([]uuid.UUID, error)
	// ReplyReceive begins t with the replies envs: in one statement it
	// records each in the inbox and locks, in id order, the sagas of those
	// seen for the first time, so that one saga's replies are applied one at
	// a time. The receipts are in the order of envs; envs must not repeat a
	// message id.
	ReplyReceive(ctx context.Context, t Tx, envs []*message.Envelope) ([]Receipt, error)
	// ReplyReceiveKnown begins t with the replies envs to sagas whose
	// state the caller kept from its own last write of them: their inbox
	// record goes out with t's next statement, and no saga is read or
	// locked. If the inbox had any of them, t fails with an error for which
	// errors.Is(err, ErrConflict) (as the write does if a saga moved on since
	// the caller's copy): run the transaction again with ReplyReceive.
	ReplyReceiveKnown(ctx context.Context, t Tx, envs []*message.Envelope) error
	// SagaLock locks the sagas ids in t, in id order, and returns those
	// that exist.
	SagaLock(ctx context.Context, t Tx, ids []uuid.UUID) ([]SagaRecord, error)
	// SagaClaimDue locks in t up to max running or compensating sagas of
	// the definitions keys whose deadline is at or before now, skipping
	// sagas that others hold, under the statement and lock timeouts of
	// background work.
	SagaClaimDue(ctx context.Context, t Tx, now time.Time, max int, keys []SagaKey) ([]SagaRecord, error)
	// SagaUnpublished returns, in t, the commands and compensations of the
	// sagas ids still in the outbox, not yet published, in write order.
	SagaUnpublished(ctx context.Context, t Tx, ids []uuid.UUID) ([]UnpublishedMessage, error)
	// SagaWrite writes trs in t in one statement, sent with t's next
	// round trip: Commit (the usual case: one round trip for the write and
	// COMMIT), or the next operation's statement. A saga whose revision
	// moved on since its transition was computed fails the statement with
	// an error marked ErrConflict, and nothing is written: run the
	// transaction again. The messages are prepared in place (the caller
	// learns their ids at once), and once t has committed each trs[i].Saga
	// is the row as stored: its revision advanced, its times at the
	// microsecond in UTC, its error text as kept (its JSON as written, which
	// jsonb may re-format). Under t's write-time lease its commands are
	// leased (Committed.Leased).
	SagaWrite(ctx context.Context, t Tx, trs []Transition, now time.Time) error
	// SagaGet returns the saga id, or an error wrapping message.ErrNotFound.
	SagaGet(ctx context.Context, id uuid.UUID) (SagaRecord, error)
	// SagaList returns the sagas f selects, oldest (first started) first.
	SagaList(ctx context.Context, f SagaFilter) ([]SagaRecord, error)
	// SagaHistory returns the history of saga id, oldest first.
	SagaHistory(ctx context.Context, id uuid.UUID) ([]HistoryRecord, error)
	// DefinitionUpsert records the shapes of defs (their RegisteredAt and
	// SeenAt are ignored), seen at now, in one statement: a new name and
	// version is registered at now, a known one gets its shape and SeenAt
	// updated. It returns those whose recorded shape was another.
	DefinitionUpsert(ctx context.Context, defs []DefinitionRecord, now time.Time) ([]SagaKey, error)
	// DefinitionList returns every recorded definition, by name then
	// version.
	DefinitionList(ctx context.Context) ([]DefinitionRecord, error)
	// DefinitionGet returns the recorded definition sagaType at version, or
	// at its highest version when version is 0, or an error wrapping
	// message.ErrNotFound.
	DefinitionGet(ctx context.Context, sagaType string, version int) (DefinitionRecord, error)

	// DeliveryBegin begins t, the delivery of env at a participant, in one
	// round trip with BEGIN: it records env in the inbox and, for a saga
	// step's command or compensation seen for the first time, leaves the
	// step's barrier mark (a compensation also leaves the action's mark,
	// blocked, with the failure reply blockedReply, when the action never
	// arrived). It ends with the savepoint the handler runs in. A concurrent
	// delivery of the same message, or of the same step's action and
	// compensation, waits for the other's transaction to end.
	DeliveryBegin(ctx context.Context, t Tx, env *message.Envelope, blockedReply []byte) (*Delivery, error)
	// DeliveryBeginOutside is DeliveryBegin for a handler that calls an
	// outside system: the inbox entry is left "started", and so is the
	// barrier mark when the message leaves it, so that t can be committed
	// before the call. A message whose entry is still "started" (its
	// delivery died, or failed, after that commit) is no duplicate:
	// Delivery.Resumed is set and the entry counts an attempt. It begins no
	// savepoint.
	DeliveryBeginOutside(ctx context.Context, t Tx, env *message.Envelope, blockedReply []byte) (*Delivery, error)
	// DeliveryResume begins t, the transaction that records the outcome of
	// the outside call of env, in one round trip with BEGIN: it marks env's
	// "started" inbox entry "done", locks it, and ends with the savepoint the
	// handler's writes run in. Delivery.Duplicate is set when the entry was
	// not "started" (another delivery of env recorded it first): t must
	// change nothing then. End it with DeliveryFinish.
	DeliveryResume(ctx context.Context, t Tx, env *message.Envelope) (*Delivery, error)
	// InboxSettleStarted marks env's inbox entry "done" in t if it was left
	// "started" (an outside call given up on), and reports whether it was.
	InboxSettleStarted(ctx context.Context, t Tx, env *message.Envelope) (bool, error)
	// BarrierDropStarted removes, in t, the "started" mark env left in its
	// phase, if it is still there (a compensation given up on).
	BarrierDropStarted(ctx context.Context, t Tx, env *message.Envelope) error
	// DeliveryFinish ends d, the delivery of env begun in t (nil: one given
	// up on, begun with InboxRecord), as end says, with t's next round trip:
	// Commit. Under t's write-time lease its reply is leased.
	DeliveryFinish(ctx context.Context, t Tx, env *message.Envelope, d *Delivery, end DeliveryEnd) error
	// DeliveryBeginMany begins t with the deliveries envs of a group applied
	// in one transaction (group commit), in one round trip with BEGIN: what
	// DeliveryBegin does for each, in one statement. envs must not repeat a
	// message id nor a saga step, and hold commands, compensations and
	// events only. blockedReplies[i] is envs[i]'s (see DeliveryBegin). Each
	// Delivery's Tx is its handler's: a savepoint of t begun with the
	// handler's first statement. The handlers run one after the other, each
	// ended with DeliveryEndHandler before the next begins.
	DeliveryBeginMany(ctx context.Context, t Tx, envs []*message.Envelope, blockedReplies [][]byte) ([]*Delivery, error)
	// DeliveryEndHandler ends the handler's savepoint of d, a delivery of a group,
	// as end says: released, or rolled back when end discards the
	// handler's writes (Discard, Undo), with t's next statement.
	DeliveryEndHandler(ctx context.Context, d *Delivery, end DeliveryEnd) error
	// DeliveryFinishMany ends the deliveries dels of envs, a group begun with
	// DeliveryBeginMany, as ends say (ends[i] for envs[i]), in one statement
	// sent with t's next round trip: Commit. Under t's write-time lease the
	// replies are leased.
	DeliveryFinishMany(ctx context.Context, t Tx, envs []*message.Envelope, dels []*Delivery, ends []DeliveryEnd) error
	// InboxRecord records env in the inbox in t (the first statement of a
	// delivery given up on) and reports whether it is new there; a
	// duplicate counts itself.
	InboxRecord(ctx context.Context, t Tx, env *message.Envelope) (bool, error)
	// BarrierGet returns, read in t, the mark of env's saga step in phase, or
	// an error wrapping message.ErrNotFound.
	BarrierGet(ctx context.Context, t Tx, env *message.Envelope, phase message.Phase) (BarrierMark, error)
	// BarrierLeave leaves, in t, the final mark of env's saga step in env's
	// phase unless one is there, and reports whether it did. A "started"
	// mark that env itself left (an outside call given up on) is completed
	// with mark.
	BarrierLeave(ctx context.Context, t Tx, env *message.Envelope, mark BarrierMark) (bool, error)

	// AttemptRecord counts one failed processing attempt of env, with its
	// cause, in a statement of its own (the processing transaction was
	// rolled back), and returns the number of failed attempts so far. Text
	// Postgres cannot hold (NUL, invalid UTF-8) is stored with it replaced.
	AttemptRecord(ctx context.Context, env *message.Envelope, cause string) (int, error)
	// AttemptMarkDeadLettered records that env was dead-lettered for reason: in t
	// (with the rest of the delivery that gives it up), or on its own when
	// t is nil.
	AttemptMarkDeadLettered(ctx context.Context, t Tx, env *message.Envelope, reason string) error
	// AttemptGet returns the attempt record of message id, or an error
	// wrapping message.ErrNotFound when it never failed.
	AttemptGet(ctx context.Context, id uuid.UUID) (Attempt, error)

	// OutboxWrite inserts msgs into the outbox in tx, the caller's
	// transaction, so they are published if and only if tx commits. It
	// prepares each message (message.Message.Prepare) in place, so the
	// caller learns the ids.
	OutboxWrite(ctx context.Context, tx pgx.Tx, msgs []message.Message) error
	// OutboxClaim settles the claimer's previous batch (opts.Settle) and
	// claims unpublished rows, in one statement of a transaction of its own
	// (one round trip), and returns them in write order. Rows another relay
	// holds are skipped; a row is claimed only when it is its ordering key's
	// first unpublished row or that row is claimed with it, so one key's rows
	// are never published out of order by two relays. Its cost is bounded by
	// opts.Max whatever the backlog.
	OutboxClaim(ctx context.Context, opts OutboxClaimOpts) ([]OutboxRow, error)
	// OutboxPresent returns which of the rows ids are still in the outbox.
	OutboxPresent(ctx context.Context, ids []int64) ([]int64, error)
	// OutboxNotify wakes the relays of the schema that Listen in other processes
	// once tx commits.
	OutboxNotify(ctx context.Context, tx pgx.Tx) error
	// OutboxListen holds a connection of its own, LISTENs on the schema's channel
	// and calls onNotify for every notification (and once right after LISTEN
	// succeeds), until ctx is done or the connection fails; it never returns
	// nil.
	OutboxListen(ctx context.Context, onNotify func()) error

	// OutboxLogOpen opens a replication connection and starts streaming
	// the publication's inserts into the outbox from the slot's confirmed
	// position. It fails with an error wrapping ErrLogSlotBusy when another
	// reader holds the slot, and says what to change when the server's
	// wal_level is not logical or the slot or publication is missing.
	OutboxLogOpen(ctx context.Context, slot, publication string) (OutboxLog, error)
	// OutboxLogSetup creates the publication of the outbox's inserts and
	// the logical replication slot (pgoutput) unless they exist, and
	// reports whether it created the slot.
	OutboxLogSetup(ctx context.Context, slot, publication string) (bool, error)
	// OutboxLogOwed returns how many rows written before slot was created
	// (by OutboxLogSetup) are still unpublished: the slot does not stream
	// them, so a relay publishes them by claims first. Once none is, the
	// slot is recorded as caught up and it returns 0 from then on.
	OutboxLogOwed(ctx context.Context, slot string) (int64, error)
	// OutboxLogAwaitVisible waits until the committed transactions xids
	// (LogBatch.Xids) are visible to new snapshots, polling, or until ctx
	// ends: before that, their rows can be neither found nor deleted.
	OutboxLogAwaitVisible(ctx context.Context, xids []uint32) error
	// OutboxLogStatus returns the state of the set-up and of the slot.
	OutboxLogStatus(ctx context.Context, slot, publication string) (LogStatus, error)

	// RetentionPrune deletes the rows r selects in small batches, each its own
	// transaction of one round trip under the timeouts of background work.
	RetentionPrune(ctx context.Context, r Retention) (Pruned, error)
	// OutboxStats returns the backlog of the outbox.
	OutboxStats(ctx context.Context) (OutboxStats, error)
	// SagaCountOpen counts the running, compensating and failed sagas of
	// the given types, by type and status (statuses without sagas are
	// left out).
	SagaCountOpen(ctx context.Context, sagaTypes []string) ([]SagaCount, error)
	// SagaCountOverdue counts running or compensating sagas whose deadline
	// is before before.
	SagaCountOverdue(ctx context.Context, before time.Time) (int64, error)
	// SagaCountUnpublishedOverdue counts, by type (SagaCount.Status
	// empty), the running or compensating sagas that wait for a command or
	// compensation written before before and still unpublished, past their
	// deadline (before before) or without one.
	SagaCountUnpublishedOverdue(ctx context.Context, before time.Time) ([]SagaCount, error)
	// OutboxUnpublishedByType returns the unpublished commands and
	// compensations by type, most first, at most max types.
	OutboxUnpublishedByType(ctx context.Context, max int) ([]OutboxTypeBacklog, error)

	// OperationRequest records the operator request op.
	OperationRequest(ctx context.Context, op NewOperation) (Operation, error)
	// OperationGet returns request id, or an error wrapping
	// message.ErrNotFound.
	OperationGet(ctx context.Context, id int64) (Operation, error)
	// OperationListPending lists up to max pending requests, oldest first,
	// after request afterID (0: from the first).
	OperationListPending(ctx context.Context, afterID int64, max int) ([]Operation, error)
	// OperationClaim begins t by locking the oldest pending request for a
	// saga of the definitions keys (or for a saga that does not exist),
	// skipping requests another orchestrator holds; nil when there is none.
	OperationClaim(ctx context.Context, t Tx, keys []SagaKey) (*Operation, error)
	// OperationMark records in t that request id was handled at at (refusal
	// is why it was refused, or empty), with t's next round trip: Commit.
	OperationMark(ctx context.Context, t Tx, id int64, at time.Time, refusal string) error
	// OperationWithdraw withdraws pending request id on behalf of actor so
	// that no orchestrator applies it, and returns it. It returns an error
	// wrapping ErrNotPending, with the request, if it was applied or
	// withdrawn before, and one wrapping message.ErrNotFound if it does not
	// exist.
	OperationWithdraw(ctx context.Context, id int64, actor string) (Operation, error)
	// OperationList returns up to limit requests: the pending ones oldest
	// first, or with all every one newest first.
	OperationList(ctx context.Context, all bool, limit int) ([]Operation, error)
	// OperationCountPending counts the pending requests.
	OperationCountPending(ctx context.Context) (int64, error)
}

// ErrSchemaOutdated is wrapped by SchemaCheck's error when the schema is not
// migrated to the version the executor needs.
var ErrSchemaOutdated = errors.New("schema is not migrated")

// ErrNotPending says an operator request was already applied, refused or
// withdrawn.
var ErrNotPending = errors.New("operator request is not pending")

// OutboxLog reads the inserts into an outbox from PostgreSQL's
// write-ahead log through a logical replication slot (pgoutput), over a
// replication connection of its own. It is used by one goroutine.
type OutboxLog interface {
	// Next waits for the next committed rows, in commit order, up to max
	// (a transaction larger than max spans several batches), or for the
	// server's keepalive when idle; it then returns at once with what it has
	// read. With wait above 0 it returns an empty batch when nothing came
	// within wait.
	Next(ctx context.Context, max int, wait time.Duration) (LogBatch, error)
	// Confirm reports to the server that everything up to lsn is
	// processed: the slot's confirmed flush position moves there and the
	// server may recycle the log before it. With lsn 0 (or behind the last
	// confirmed position) it repeats the last one, as a keepalive.
	Confirm(ctx context.Context, lsn uint64) error
	// Close closes the replication connection without confirming anything
	// more.
	Close(ctx context.Context) error
}

// ErrLogSlotBusy is the error OutboxLogOpen wraps when another reader holds
// the replication slot: the caller stands by.
var ErrLogSlotBusy = errors.New("the replication slot is in use by another reader")

// ErrLogSlotMissing is the error OutboxLogOpen wraps when the publication
// exists but the replication slot does not: a promoted standby has none
// (slots are not replicated), or an operator dropped it. The caller creates
// it again (OutboxLogSetup) and publishes what it owes (OutboxLogOwed).
var ErrLogSlotMissing = errors.New("the replication slot does not exist")

// LogNames returns the replication slot and the publication of schema's
// outbox in log mode: both "sagabox_<schema>" (cut to PostgreSQL's 63
// characters).
func LogNames(schema string) (slot, publication string) {
	n := "sagabox_" + schema
	if len(n) > 63 {
		n = n[:63]
	}
	return n, n
}
