package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sagabox/sagabox/store/driver"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store/internal/dbsqlc"
)

func sagaRecord(r *dbsqlc.SagaboxSaga) driver.SagaRecord {
	rec := driver.SagaRecord{
		ID: r.ID, Type: r.SagaType, Version: int(r.Version), Status: r.Status,
		Data: r.Data, Steps: r.Steps, CurrentStep: int(r.CurrentStep), Phase: r.Phase, Run: int(r.Run),
		Revision: r.Revision, Attempts: int(r.Attempts), LastError: r.LastError,
		CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, TraceParent: r.Traceparent, TraceState: r.Tracestate,
	}
	if r.StartKey != nil {
		rec.StartKey = *r.StartKey
	}
	rec.StartDataHash, rec.StartKeyReleased = r.StartDataHash, r.StartKeyReleased
	if r.Deadline != nil {
		rec.Deadline = r.Deadline.UTC()
	}
	if r.FinishedAt != nil {
		rec.FinishedAt = *r.FinishedAt
	}
	if r.ConcurrencyKey != nil {
		rec.ConcurrencyKey = *r.ConcurrencyKey
	}
	if r.AdmittedAt != nil {
		rec.AdmittedAt = *r.AdmittedAt
	}
	return rec
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// historyCols are history records as the columns of an unnest insert.
type historyCols struct {
	sagaID    []uuid.UUID
	at        []time.Time
	event     []string
	step      []string
	stepIndex []int32
	phase     []string
	attempt   []int32
	detail    []string
	actor     []string
	messageID []uuid.UUID
}

func (c *historyCols) add(h *driver.HistoryRecord) {
	c.sagaID = append(c.sagaID, h.SagaID)
	c.at = append(c.at, h.At)
	c.event = append(c.event, h.Event)
	c.step = append(c.step, h.Step)
	c.stepIndex = append(c.stepIndex, int32(h.StepIndex))
	c.phase = append(c.phase, h.Phase)
	c.attempt = append(c.attempt, int32(h.Attempt))
	c.detail = append(c.detail, storableText(h.Detail))
	c.actor = append(c.actor, h.Actor)
	c.messageID = append(c.messageID, h.MessageID)
}

// SagaStart writes st in tx, the caller's transaction, in one statement: the
// saga exists, and its first messages are sent, if and only if tx commits.
// It prepares the messages (message.Message.Prepare). When the saga's start
// key is taken by a saga of the same type, it writes nothing and returns
// false (a concurrent start with the same key waits for the other
// transaction to end).
func (s *executor) SagaStart(ctx context.Context, tx pgx.Tx, st *driver.SagaStart, now time.Time) (bool, error) {
	if tx == nil {
		return false, errors.New("start saga: transaction is nil")
	}
	o, err := outboxColumns(st.Messages, now)
	if err != nil {
		return false, fmt.Errorf("start saga %s: %w", st.Saga.ID, err)
	}
	var h historyCols
	for i := range st.History {
		h.add(&st.History[i])
	}
	r := &st.Saga
	inserted, err := s.queries.SagaStart(ctx, s.db(tx), &dbsqlc.SagaStartParams{
		ID: r.ID, SagaType: r.Type, Version: int32(r.Version), Status: r.Status, StartKey: nullable(r.StartKey),
		Data: r.Data, Steps: r.Steps, CurrentStep: int32(r.CurrentStep), Phase: r.Phase, Deadline: timePtr(r.Deadline),
		Attempts: int32(r.Attempts), LastError: r.LastError, Now: now, FinishedAt: timePtr(r.FinishedAt),
		Traceparent: r.TraceParent, Tracestate: r.TraceState, ConcurrencyKey: nullable(r.ConcurrencyKey), StartDataHash: r.StartDataHash,
		HAt: nonNil(h.at), HEvent: nonNil(h.event), HStep: nonNil(h.step), HStepIndex: nonNil(h.stepIndex),
		HPhase: nonNil(h.phase), HAttempt: nonNil(h.attempt), HDetail: nonNil(h.detail), HActor: nonNil(h.actor),
		HMessageID: nonNil(h.messageID),
		OMessageID: o.messageID, OOrderingKey: o.orderingKey, OKind: o.kind, OType: o.typ, ORoutingKey: o.routingKey,
		OSagaType: o.sagaType, OStep: o.step, OStepIndex: o.stepIndex, OAttempt: o.attempt, OReplyTo: o.replyTo,
		OCorrelationID: o.correlationID, OTraceparent: o.traceparent, OTracestate: o.tracestate, OHeaders: o.headers,
		OPayload: o.payload, OCreatedAt: o.createdAt,
	})
	if err != nil {
		return false, fmt.Errorf("start saga %s (%s) in schema %q: %w", r.ID, r.Type, s.schema, err)
	}
	if inserted {
		s.noteUnleased(tx, len(st.Messages))
		asWritten(&st.Saga, now, true)
	}
	return inserted, nil
}

// SagaGetByStartKey returns the saga of type sagaType started with startKey,
// read in tx (nil: on the pool), or an error wrapping message.ErrNotFound.
func (s *executor) SagaGetByStartKey(ctx context.Context, tx pgx.Tx, sagaType, startKey string) (driver.SagaRecord, error) {
	db, err := s.pooled()
	if tx != nil {
		db, err = s.db(tx), nil
	}
	if err != nil {
		return driver.SagaRecord{}, err
	}
	row, err := s.queries.SagaGetByStartKey(ctx, db, &dbsqlc.SagaGetByStartKeyParams{SagaType: sagaType, StartKey: startKey})
	if errors.Is(err, pgx.ErrNoRows) {
		return driver.SagaRecord{}, fmt.Errorf("saga %s with start key %q: %w", sagaType, startKey, message.ErrNotFound)
	}
	if err != nil {
		return driver.SagaRecord{}, fmt.Errorf("get saga %s with start key %q: %w", sagaType, startKey, err)
	}
	return sagaRecord(row), nil
}

// SagaReleaseStartKey releases in tx the start key of the finished saga
// holding it (r), with a history entry on that saga, and returns its id;
// none if no finished saga holds the key.
func (s *executor) SagaReleaseStartKey(ctx context.Context, tx pgx.Tx, r driver.StartKeyRelease) ([]uuid.UUID, error) {
	if tx == nil {
		return nil, errors.New("release start key: transaction is nil")
	}
	ids, err := s.queries.SagaReleaseStartKey(ctx, s.db(tx), &dbsqlc.SagaReleaseStartKeyParams{
		SagaType: r.SagaType, StartKey: r.StartKey, Now: r.At, Event: r.Event, Detail: r.Detail,
	})
	if err != nil {
		return nil, fmt.Errorf("release start key %q of %s sagas: %w", r.StartKey, r.SagaType, err)
	}
	return ids, nil
}

// ReplyReceive begins t with the replies envs: in one statement it records
// each in the inbox and locks, in id order, the sagas of those seen for the
// first time, so that one saga's replies are applied one at a time. The
// receipts are in the order of envs; envs must not repeat a message id.
func (s *executor) ReplyReceive(ctx context.Context, t driver.Tx, envs []*message.Envelope) ([]driver.Receipt, error) {
	n := len(envs)
	p := receiptColumns(envs)
	// Planned once per connection, not per reply (see planGeneric); the
	// session's setting is back before any user code runs in t (a local
	// step), in the same round trip.
	rows, err := s.queries.SagaReceive(ctx, txOf(t).execAround(false, []string{planGeneric}, []string{planSession}), p)
	if err != nil {
		return nil, fmt.Errorf("receive %d replies in schema %q: %w", n, s.schema, err)
	}
	byID := make(map[uuid.UUID]*dbsqlc.SagaReceiveRow, len(rows))
	for _, r := range rows {
		byID[r.MessageID] = r
	}
	out := make([]driver.Receipt, n)
	for i, e := range envs {
		r := byID[e.MessageID]
		if r == nil {
			return nil, fmt.Errorf("receive replies in schema %q: no inbox row for message %s", s.schema, e.MessageID)
		}
		out[i].Fresh = r.Fresh
		if r.ID.Valid {
			rec := sagaRecord(receivedSaga(r))
			out[i].Saga = &rec
		}
	}
	return out, nil
}

// ReplyReceiveKnown begins t with the replies envs to sagas whose state
// the caller kept from its own last write of them: it records each in the
// inbox in a statement that goes out with t's next one (the transitions'
// write and COMMIT: one round trip for the whole transaction) and reads no
// saga. If the inbox had any of them, t fails with an error for which
// IsRetryable is true; so does the write if a saga moved on since the
// caller's copy. Run the transaction again with ReplyReceive then.
func (s *executor) ReplyReceiveKnown(_ context.Context, t driver.Tx, envs []*message.Envelope) error {
	p := dbsqlc.SagaReceiveKnownParams(*receiptColumns(envs))
	// Queued: it cannot fail before it is sent.
	return s.queries.SagaReceiveKnown(context.Background(), txOf(t).ahead(), &p)
}

// receiptColumns are the inbox columns of the replies envs, as the
// parameters of a receipt (SagaReceive, SagaReceiveKnown).
func receiptColumns(envs []*message.Envelope) *dbsqlc.SagaReceiveParams {
	n := len(envs)
	p := &dbsqlc.SagaReceiveParams{
		MessageID: make([]uuid.UUID, n), Kind: make([]string, n), Type: make([]string, n),
		SagaID: make([]uuid.UUID, n), Step: make([]string, n),
	}
	for i, e := range envs {
		p.MessageID[i], p.Kind[i], p.Type[i], p.SagaID[i], p.Step[i] = e.MessageID, string(e.Kind), e.Type, e.SagaID, e.Step
	}
	return p
}

// receivedSaga is the saga of a receipt as a row of its table, for the one
// mapper, sagaRecord. SagaReceive left-joins the sagas it locks to the
// inbox rows, so sqlc types the saga's columns as nullable; a receipt with
// a saga (r.ID.Valid) has all of them that the table has.
func receivedSaga(r *dbsqlc.SagaReceiveRow) *dbsqlc.SagaboxSaga {
	return &dbsqlc.SagaboxSaga{
		ID: r.ID.UUID, SagaType: deref(r.SagaType), Version: r.Version.Int32, Status: deref(r.Status),
		StartKey: r.StartKey, Data: r.Data, Steps: r.Steps, CurrentStep: r.CurrentStep.Int32, Phase: deref(r.Phase),
		Revision: r.Revision.Int64, Deadline: r.Deadline, Attempts: r.Attempts.Int32, LastError: deref(r.LastError),
		CreatedAt: derefTime(r.CreatedAt), UpdatedAt: derefTime(r.UpdatedAt), FinishedAt: r.FinishedAt,
		Traceparent: deref(r.Traceparent), Tracestate: deref(r.Tracestate), ConcurrencyKey: r.ConcurrencyKey,
		AdmittedAt: r.AdmittedAt, StartDataHash: r.StartDataHash, StartKeyReleased: r.StartKeyReleased.Bool, Run: r.Run.Int32,
	}
}

func derefTime(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// SagaLock locks the sagas ids in t, in id order, and returns those that
// exist.
func (s *executor) SagaLock(ctx context.Context, t driver.Tx, ids []uuid.UUID) ([]driver.SagaRecord, error) {
	rows, err := s.queries.SagaLock(ctx, txOf(t).exec(ctx, false), ids)
	if err != nil {
		return nil, fmt.Errorf("lock %d sagas in schema %q: %w", len(ids), s.schema, err)
	}
	return sagaRecords(rows), nil
}

// SagaClaimDue locks in t up to max running or compensating sagas of the
// definitions keys whose deadline is at or before now, skipping sagas that
// others hold, under the statement and lock timeouts of background work.
func (s *executor) SagaClaimDue(ctx context.Context, t driver.Tx, now time.Time, max int, keys []driver.SagaKey) ([]driver.SagaRecord, error) {
	txOf(t).queue(backgroundTimeouts)
	p := &dbsqlc.SagaClaimDueParams{Now: now, Max: int32(max), SagaTypes: make([]string, len(keys)), Versions: make([]int32, len(keys))}
	for i, k := range keys {
		p.SagaTypes[i], p.Versions[i] = k.Type, int32(k.Version)
	}
	rows, err := s.queries.SagaClaimDue(ctx, txOf(t).exec(ctx, false), p)
	if err != nil {
		return nil, fmt.Errorf("claim due sagas in schema %q: %w", s.schema, err)
	}
	return sagaRecords(rows), nil
}

// SagaUnpublished implements driver.Executor.
func (s *executor) SagaUnpublished(ctx context.Context, t driver.Tx, ids []uuid.UUID) ([]driver.UnpublishedMessage, error) {
	rows, err := s.queries.SagaUnpublished(ctx, txOf(t).exec(ctx, false), nonNil(ids))
	if err != nil {
		return nil, fmt.Errorf("read the unpublished messages of %d sagas in schema %q: %w", len(ids), s.schema, err)
	}
	out := make([]driver.UnpublishedMessage, len(rows))
	for i, r := range rows {
		out[i] = driver.UnpublishedMessage{
			SagaID: r.SagaID, MessageID: r.MessageID, Kind: message.Kind(r.Kind), StepIndex: int(r.StepIndex),
			Attempt: int(r.Attempt), CreatedAt: r.CreatedAt,
		}
	}
	return out, nil
}

// backgroundTimeouts bounds the statements of a background transaction so
// that a stuck lock or a slow plan cannot hold it forever.
const backgroundTimeouts = "select set_config('statement_timeout', '30s', true), set_config('lock_timeout', '10s', true)"

func sagaRecords(rows []*dbsqlc.SagaboxSaga) []driver.SagaRecord {
	out := make([]driver.SagaRecord, len(rows))
	for i, r := range rows {
		out[i] = sagaRecord(r)
	}
	return out
}

// SagaWrite implements driver.Executor: the write goes out with t's
// next round trip, under writePlan (restored after it, unless COMMIT
// follows), and under t's write-time lease if it has one.
func (s *executor) SagaWrite(ctx context.Context, t driver.Tx, trs []driver.Transition, now time.Time) error {
	tx := txOf(t)
	what := fmt.Sprintf("write %d saga transitions in schema %q", len(trs), s.schema)
	tx.queue(writePlan)
	w, err := s.writeTransitions(ctx, tx.later(what), tx.ahead(), trs, now, tx.lease)
	if err != nil {
		return err
	}
	tx.pending = append(tx.pending, &pendingStmt{sql: writePlanEnd, restore: true})
	tx.onCommit(func() { w.done(tx) })
	return nil
}

// SagaWriteIn writes trs in tx, a caller's transaction, in one
// statement, as SagaWrite does (without committing).
func (s *executor) SagaWriteIn(ctx context.Context, tx pgx.Tx, trs []driver.Transition, now time.Time) error {
	if tx == nil {
		return errors.New("write transitions: transaction is nil")
	}
	db := s.db(plannedTx{tx: tx})
	w, err := s.writeTransitions(ctx, db, db, trs, now, nil)
	if err != nil {
		return err
	}
	// The statement has run: the sagas are as stored, and a savepoint of
	// an engine transaction counts the rows.
	w.done(nil)
	s.noteUnleased(tx, len(w.msgs))
	return nil
}

// SagaLockIn locks the sagas ids in tx, a caller's transaction, in id
// order.
func (s *executor) SagaLockIn(ctx context.Context, tx pgx.Tx, ids []uuid.UUID) ([]driver.SagaRecord, error) {
	if tx == nil {
		return nil, errors.New("lock sagas: transaction is nil")
	}
	rows, err := s.queries.SagaLock(ctx, s.db(tx), ids)
	if err != nil {
		return nil, fmt.Errorf("lock %d sagas in schema %q: %w", len(ids), s.schema, err)
	}
	return sagaRecords(rows), nil
}

// transitionWrite is a transition write sent, or queued: done completes
// it once its statement's result is read (and, for an engine transaction,
// committed).
type transitionWrite struct {
	trs  []driver.Transition
	msgs []message.Message
	now  time.Time
	row  *dbsqlc.SagaWriteRow
}

// done makes each written saga the row as stored and, for t, an engine
// transaction that committed, adds the rows the write leased, and those it
// wrote without the lease, to what t's Commit returns.
func (w *transitionWrite) done(t *engineTx) {
	for i := range w.trs {
		if r := w.trs[i].Saga; r != nil {
			asWritten(r, w.now, false)
		}
	}
	if t == nil {
		return
	}
	t.noteLeased(w.msgs, w.row.LeasedIds, w.row.LeasedMessageIds)
}

// writeTransitions writes trs through db under lease (nil: none). The
// withdrawal of terminated sagas' unsent messages goes through ahead, which
// sends it before db's statement (in the same round trip, for an engine
// transaction).
func (s *executor) writeTransitions(ctx context.Context, db, ahead dbsqlc.DBTX, trs []driver.Transition, now time.Time, lease *driver.OutboxLease) (*transitionWrite, error) {
	var msgs []message.Message
	var h historyCols
	var withdraw []uuid.UUID
	withdrawMsgs := &dbsqlc.OutboxWithdrawMessagesParams{}
	p := &dbsqlc.SagaWriteParams{Now: now}
	for i := range trs {
		tr := &trs[i]
		if tr.WithdrawUnsent && tr.Saga != nil {
			withdraw = append(withdraw, tr.Saga.ID)
		}
		if len(tr.Withdraw) > 0 && tr.Saga != nil {
			withdrawMsgs.SagaIds = append(withdrawMsgs.SagaIds, tr.Saga.ID)
			withdrawMsgs.MessageIds = append(withdrawMsgs.MessageIds, tr.Withdraw...)
		}
		for j := range tr.History {
			h.add(&tr.History[j])
		}
		msgs = append(msgs, tr.Messages...)
		if r := tr.Saga; r != nil {
			p.ID = append(p.ID, r.ID)
			p.Revision = append(p.Revision, r.Revision)
			p.Status = append(p.Status, r.Status)
			p.Version = append(p.Version, int32(r.Version))
			p.Run = append(p.Run, int32(r.Run))
			p.Data = append(p.Data, r.Data)
			p.Steps = append(p.Steps, r.Steps)
			p.CurrentStep = append(p.CurrentStep, int32(r.CurrentStep))
			p.Phase = append(p.Phase, r.Phase)
			p.Deadline = append(p.Deadline, r.Deadline)
			p.Attempts = append(p.Attempts, int32(r.Attempts))
			p.LastError = append(p.LastError, storableText(r.LastError))
			p.FinishedAt = append(p.FinishedAt, r.FinishedAt)
		}
	}
	o, err := outboxColumns(msgs, now)
	if err != nil {
		return nil, fmt.Errorf("write transitions: %w", err)
	}
	// Prepare wrote the message ids into msgs; give them back.
	k := 0
	for i := range trs {
		k += copy(trs[i].Messages, msgs[k:k+len(trs[i].Messages)])
	}
	p.ID, p.Revision, p.Status, p.Data, p.Steps = nonNil(p.ID), nonNil(p.Revision), nonNil(p.Status), nonNil(p.Data), nonNil(p.Steps)
	p.CurrentStep, p.Phase, p.Deadline, p.Attempts = nonNil(p.CurrentStep), nonNil(p.Phase), nonNil(p.Deadline), nonNil(p.Attempts)
	p.LastError, p.FinishedAt, p.Version, p.Run = nonNil(p.LastError), nonNil(p.FinishedAt), nonNil(p.Version), nonNil(p.Run)
	p.HSagaID, p.HAt, p.HEvent, p.HStep, p.HStepIndex = nonNil(h.sagaID), nonNil(h.at), nonNil(h.event), nonNil(h.step), nonNil(h.stepIndex)
	p.HPhase, p.HAttempt, p.HDetail, p.HActor, p.HMessageID = nonNil(h.phase), nonNil(h.attempt), nonNil(h.detail), nonNil(h.actor), nonNil(h.messageID)
	p.OMessageID, p.OOrderingKey, p.OKind, p.OType, p.ORoutingKey = o.messageID, o.orderingKey, o.kind, o.typ, o.routingKey
	p.OSagaID, p.OSagaType, p.OStep, p.OStepIndex, p.OAttempt = o.sagaID, o.sagaType, o.step, o.stepIndex, o.attempt
	p.OReplyTo, p.OCorrelationID, p.OTraceparent, p.OTracestate = o.replyTo, o.correlationID, o.traceparent, o.tracestate
	p.OHeaders, p.OPayload, p.OCreatedAt = o.headers, o.payload, o.createdAt
	p.LeaseSeconds, p.ClaimedBy, p.Confirmed = leaseArgs(lease)
	if len(withdraw) > 0 {
		if _, err := s.queries.OutboxWithdraw(ctx, ahead, withdraw); err != nil {
			return nil, fmt.Errorf("withdraw the unsent messages of %d terminated sagas in schema %q: %w", len(withdraw), s.schema, err)
		}
	}
	if len(withdrawMsgs.MessageIds) > 0 {
		if _, err := s.queries.OutboxWithdrawMessages(ctx, ahead, withdrawMsgs); err != nil {
			return nil, fmt.Errorf("withdraw %d unsent messages of %d sagas in schema %q: %w", len(withdrawMsgs.MessageIds), len(withdrawMsgs.SagaIds), s.schema, err)
		}
	}
	row, err := s.queries.SagaWrite(ctx, db, p)
	if err != nil {
		return nil, fmt.Errorf("write %d saga transitions in schema %q: %w", len(trs), s.schema, err)
	}
	return &transitionWrite{trs: trs, msgs: msgs, now: now, row: row}, nil
}

// asWritten makes r, a saga just written at now (inserted, or updated),
// the row as PostgreSQL holds it, for a caller that keeps sagas between
// transitions: its revision advanced, its admission, its times at the
// microsecond (in UTC, where a read gives the local zone: the same
// instants), its error text as stored. Data and Steps stay the bytes
// written; jsonb may store them re-formatted (key order, spacing, number
// forms), which decodes to the same values.
func asWritten(r *driver.SagaRecord, now time.Time, inserted bool) {
	now = storedTime(now)
	if inserted {
		r.Revision, r.CreatedAt = 1, now
	} else {
		r.Revision++
	}
	r.UpdatedAt = now
	// As SagaStart and SagaWrite admit a saga: the first time it is written
	// in a status other than 'queued'.
	if r.AdmittedAt.IsZero() && r.Status != "queued" {
		r.AdmittedAt = now
	}
	r.Deadline, r.FinishedAt = storedTime(r.Deadline), storedTime(r.FinishedAt)
	r.LastError = storableText(r.LastError)
}

// storedTime is t as a timestamptz column holds it: microseconds, UTC. The
// zero time stays zero (a null column).
func storedTime(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.Truncate(time.Microsecond).UTC()
}

// leaseArgs returns the lease parameters of a write under lease (none
// when nil).
func leaseArgs(lease *driver.OutboxLease) (seconds float64, claimedBy string, confirmed []int64) {
	if lease == nil {
		return 0, "", []int64{}
	}
	return lease.Lease.Seconds(), lease.ClaimedBy, nonNil(lease.Confirmed)
}

// noteLeased adds to what t's Commit returns the rows ids (with message ids
// mids) that a write of msgs leased, and counts the others as unleased.
func (t *engineTx) noteLeased(msgs []message.Message, ids []int64, mids []uuid.UUID) {
	leased := leasedRows(msgs, ids, mids)
	t.committed.Leased = append(t.committed.Leased, leased...)
	t.committed.Unleased += len(msgs) - len(leased)
}

// leasedRows returns the messages msgs, as written, that the rows ids
// (with message ids mids) hold: what a claim of those rows would return.
func leasedRows(msgs []message.Message, ids []int64, mids []uuid.UUID) []driver.OutboxRow {
	if len(ids) == 0 {
		return nil
	}
	byID := make(map[uuid.UUID]*message.Message, len(msgs))
	for i := range msgs {
		byID[msgs[i].MessageID] = &msgs[i]
	}
	rows := make([]driver.OutboxRow, 0, len(ids))
	for i, id := range ids {
		m, ok := byID[mids[i]]
		if !ok {
			continue
		}
		written := *m
		written.Version = message.Version
		// The column keeps microseconds: the row as a claim reads it.
		written.CreatedAt = m.CreatedAt.Truncate(time.Microsecond)
		rows = append(rows, driver.OutboxRow{ID: id, Message: written, PublishAttempts: 1})
	}
	return rows
}

// SagaGet returns the saga id, or an error wrapping message.ErrNotFound.
func (s *executor) SagaGet(ctx context.Context, id uuid.UUID) (driver.SagaRecord, error) {
	db, err := s.pooled()
	if err != nil {
		return driver.SagaRecord{}, err
	}
	row, err := s.queries.SagaGet(ctx, db, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return driver.SagaRecord{}, fmt.Errorf("saga %s: %w", id, message.ErrNotFound)
	}
	if err != nil {
		return driver.SagaRecord{}, fmt.Errorf("get saga %s: %w", id, err)
	}
	return sagaRecord(row), nil
}

// SagaList returns sagas matching f, oldest (first started) first.
func (s *executor) SagaList(ctx context.Context, f driver.SagaFilter) ([]driver.SagaRecord, error) {
	db, err := s.pooled()
	if err != nil {
		return nil, err
	}
	p := &dbsqlc.SagaListParams{SagaType: nullable(f.Type), Statuses: nonNil(f.Statuses), StartKey: nullable(f.StartKey), Max: int32(f.Limit)}
	if p.Max <= 0 {
		p.Max = 100
	}
	p.UpdatedBefore = timePtr(f.UpdatedBefore)
	p.DeadlineBefore = timePtr(f.DeadlineBefore)
	p.StartKey = nullable(f.StartKey)
	if f.Version != 0 {
		p.Version = pgtype.Int4{Int32: int32(f.Version), Valid: true}
	}
	if f.After != nil {
		at := f.After.CreatedAt
		p.AfterCreatedAt = &at
		p.AfterID = uuid.NullUUID{UUID: f.After.ID, Valid: true}
	}
	rows, err := s.queries.SagaList(ctx, db, p)
	if err != nil {
		return nil, fmt.Errorf("list sagas: %w", err)
	}
	return sagaRecords(rows), nil
}

// SagaHistory returns the history of saga id, oldest first.
func (s *executor) SagaHistory(ctx context.Context, id uuid.UUID) ([]driver.HistoryRecord, error) {
	db, err := s.pooled()
	if err != nil {
		return nil, err
	}
	rows, err := s.queries.SagaHistoryList(ctx, db, id)
	if err != nil {
		return nil, fmt.Errorf("list history of saga %s: %w", id, err)
	}
	out := make([]driver.HistoryRecord, len(rows))
	for i, r := range rows {
		out[i] = driver.HistoryRecord{
			ID: r.ID, SagaID: r.SagaID, At: r.At, Event: r.Event, Step: r.Step, StepIndex: int(r.StepIndex),
			Phase: r.Phase, Attempt: int(r.Attempt), Detail: r.Detail, Actor: r.Actor, MessageID: nullUUID(r.MessageID),
		}
	}
	return out, nil
}
