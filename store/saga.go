package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store/internal/dbsqlc"
)

// ErrConflict is returned by SagaUpdate when the saga changed since it was
// read (its revision moved on).
var ErrConflict = errors.New("saga was changed concurrently")

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
	// Revision counts applied transitions.
	Revision int64
	// Deadline is the earliest pending deadline; nil when none.
	Deadline   *time.Time
	Attempts   int
	LastError  string
	CreatedAt  time.Time
	UpdatedAt  time.Time
	FinishedAt *time.Time
	// TraceParent and TraceState are the W3C trace context of the span that
	// started the saga; empty without tracing.
	TraceParent, TraceState string
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

func sagaRecord(r *dbsqlc.SagaboxSaga) SagaRecord {
	rec := SagaRecord{
		ID: r.ID, Type: r.SagaType, Version: int(r.Version), Status: r.Status,
		Data: r.Data, Steps: r.Steps, CurrentStep: int(r.CurrentStep), Phase: r.Phase,
		Revision: r.Revision, Deadline: r.Deadline, Attempts: int(r.Attempts), LastError: r.LastError,
		CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, FinishedAt: r.FinishedAt,
		TraceParent: r.Traceparent, TraceState: r.Tracestate,
	}
	if r.StartKey != nil {
		rec.StartKey = *r.StartKey
	}
	return rec
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// SagaInsert inserts rec in tx. When rec.StartKey is set and a saga of the
// same type already has it, nothing is inserted and the existing saga is
// returned with inserted false.
func (s *Store) SagaInsert(ctx context.Context, tx pgx.Tx, rec SagaRecord, now time.Time) (SagaRecord, bool, error) {
	row, err := s.queries.SagaInsert(ctx, s.db(tx), &dbsqlc.SagaInsertParams{
		ID: rec.ID, SagaType: rec.Type, Version: int32(rec.Version), Status: rec.Status,
		StartKey: nullable(rec.StartKey), Data: rec.Data, Steps: rec.Steps,
		CurrentStep: int32(rec.CurrentStep), Phase: rec.Phase, Deadline: rec.Deadline,
		Attempts: int32(rec.Attempts), LastError: rec.LastError, Now: now, FinishedAt: rec.FinishedAt,
		Traceparent: rec.TraceParent, Tracestate: rec.TraceState,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		existing, err := s.queries.SagaGetByStartKey(ctx, s.db(tx), &dbsqlc.SagaGetByStartKeyParams{SagaType: rec.Type, StartKey: rec.StartKey})
		if err != nil {
			return SagaRecord{}, false, fmt.Errorf("get saga %s with start key %q: %w", rec.Type, rec.StartKey, err)
		}
		return sagaRecord(existing), false, nil
	}
	if err != nil {
		return SagaRecord{}, false, fmt.Errorf("insert saga %s (%s): %w", rec.ID, rec.Type, err)
	}
	return sagaRecord(row), true, nil
}

// SagaGet returns the saga id, reading through tx when it is not nil. It
// returns an error wrapping message.ErrNotFound when there is none.
func (s *Store) SagaGet(ctx context.Context, tx pgx.Tx, id uuid.UUID) (SagaRecord, error) {
	row, err := s.queries.SagaGet(ctx, s.db(tx), id)
	if errors.Is(err, pgx.ErrNoRows) {
		return SagaRecord{}, fmt.Errorf("saga %s: %w", id, message.ErrNotFound)
	}
	if err != nil {
		return SagaRecord{}, fmt.Errorf("get saga %s: %w", id, err)
	}
	return sagaRecord(row), nil
}

// SagaGetByStartKey returns the saga of type sagaType started with
// startKey, reading through tx when it is not nil, or an error wrapping
// message.ErrNotFound.
func (s *Store) SagaGetByStartKey(ctx context.Context, tx pgx.Tx, sagaType, startKey string) (SagaRecord, error) {
	row, err := s.queries.SagaGetByStartKey(ctx, s.db(tx), &dbsqlc.SagaGetByStartKeyParams{SagaType: sagaType, StartKey: startKey})
	if errors.Is(err, pgx.ErrNoRows) {
		return SagaRecord{}, fmt.Errorf("saga %s with start key %q: %w", sagaType, startKey, message.ErrNotFound)
	}
	if err != nil {
		return SagaRecord{}, fmt.Errorf("get saga %s with start key %q: %w", sagaType, startKey, err)
	}
	return sagaRecord(row), nil
}

// SagaGetForUpdate returns the saga id locked FOR UPDATE in tx, so that the
// caller applies its event alone.
func (s *Store) SagaGetForUpdate(ctx context.Context, tx pgx.Tx, id uuid.UUID) (SagaRecord, error) {
	row, err := s.queries.SagaGetForUpdate(ctx, s.db(tx), id)
	if errors.Is(err, pgx.ErrNoRows) {
		return SagaRecord{}, fmt.Errorf("saga %s: %w", id, message.ErrNotFound)
	}
	if err != nil {
		return SagaRecord{}, fmt.Errorf("lock saga %s: %w", id, err)
	}
	return sagaRecord(row), nil
}

// SagaUpdate writes rec's new state in tx if the stored revision still is
// rec.Revision, and returns an error wrapping ErrConflict otherwise.
func (s *Store) SagaUpdate(ctx context.Context, tx pgx.Tx, rec SagaRecord, now time.Time) error {
	n, err := s.queries.SagaUpdate(ctx, s.db(tx), &dbsqlc.SagaUpdateParams{
		Status: rec.Status, Data: rec.Data, Steps: rec.Steps, CurrentStep: int32(rec.CurrentStep),
		Phase: rec.Phase, Deadline: rec.Deadline, Attempts: int32(rec.Attempts), LastError: rec.LastError,
		Now: now, FinishedAt: rec.FinishedAt, ID: rec.ID, Revision: rec.Revision,
	})
	if err != nil {
		return fmt.Errorf("update saga %s: %w", rec.ID, err)
	}
	if n == 0 {
		return fmt.Errorf("update saga %s at revision %d: %w", rec.ID, rec.Revision, ErrConflict)
	}
	return nil
}

// SagaClaimDue locks in tx up to max running or compensating sagas whose
// deadline is at or before now, skipping sagas locked by others.
func (s *Store) SagaClaimDue(ctx context.Context, tx pgx.Tx, now time.Time, max int) ([]SagaRecord, error) {
	if err := s.setLocalTimeouts(ctx, tx); err != nil {
		return nil, err
	}
	rows, err := s.queries.SagaClaimDue(ctx, s.db(tx), &dbsqlc.SagaClaimDueParams{Now: now, Max: int32(max)})
	if err != nil {
		return nil, fmt.Errorf("claim due sagas: %w", err)
	}
	out := make([]SagaRecord, len(rows))
	for i, r := range rows {
		out[i] = sagaRecord(r)
	}
	return out, nil
}

// SagaKey names a saga definition: its type and version.
type SagaKey struct {
	Type    string
	Version int
}

// SagaClaimDueOf is SagaClaimDue restricted to sagas of the definitions in
// keys, so that an orchestrator claims only sagas it can run.
func (s *Store) SagaClaimDueOf(ctx context.Context, tx pgx.Tx, now time.Time, max int, keys []SagaKey) ([]SagaRecord, error) {
	if err := s.setLocalTimeouts(ctx, tx); err != nil {
		return nil, err
	}
	p := &dbsqlc.SagaClaimDueOfParams{Now: now, Max: int32(max), SagaTypes: make([]string, len(keys)), Versions: make([]int32, len(keys))}
	for i, k := range keys {
		p.SagaTypes[i], p.Versions[i] = k.Type, int32(k.Version)
	}
	rows, err := s.queries.SagaClaimDueOf(ctx, s.db(tx), p)
	if err != nil {
		return nil, fmt.Errorf("claim due sagas: %w", err)
	}
	out := make([]SagaRecord, len(rows))
	for i, r := range rows {
		out[i] = sagaRecord(r)
	}
	return out, nil
}

// SagaFilter selects sagas for SagaList.
type SagaFilter struct {
	// Type keeps only sagas of this definition name; empty keeps all.
	Type string
	// Statuses keeps only sagas in one of these statuses; empty keeps all.
	Statuses []string
	// UpdatedBefore keeps only sagas not updated since; zero keeps all.
	UpdatedBefore time.Time
	// After continues a listing after this saga (its UpdatedAt and ID).
	After *SagaRecord
	// Limit is the page size. Defaults to 100.
	Limit int
}

// SagaList returns sagas matching f, stalest (least recently updated) first.
func (s *Store) SagaList(ctx context.Context, f SagaFilter) ([]SagaRecord, error) {
	p := &dbsqlc.SagaListParams{SagaType: nullable(f.Type), Statuses: f.Statuses, Max: int32(f.Limit)}
	if p.Statuses == nil {
		p.Statuses = []string{}
	}
	if p.Max <= 0 {
		p.Max = 100
	}
	if !f.UpdatedBefore.IsZero() {
		p.UpdatedBefore = &f.UpdatedBefore
	}
	if f.After != nil {
		at := f.After.UpdatedAt
		p.AfterUpdatedAt = &at
		p.AfterID = uuid.NullUUID{UUID: f.After.ID, Valid: true}
	}
	rows, err := s.queries.SagaList(ctx, s.db(nil), p)
	if err != nil {
		return nil, fmt.Errorf("list sagas: %w", err)
	}
	out := make([]SagaRecord, len(rows))
	for i, r := range rows {
		out[i] = sagaRecord(r)
	}
	return out, nil
}

// SagaCount is the number of sagas of one type in one status.
type SagaCount struct {
	Type   string
	Status string
	Count  int64
}

// SagaCounts counts sagas by type and status.
func (s *Store) SagaCounts(ctx context.Context) ([]SagaCount, error) {
	rows, err := s.queries.SagaCountByStatus(ctx, s.db(nil))
	if err != nil {
		return nil, fmt.Errorf("count sagas: %w", err)
	}
	out := make([]SagaCount, len(rows))
	for i, r := range rows {
		out[i] = SagaCount{Type: r.SagaType, Status: r.Status, Count: r.Count}
	}
	return out, nil
}

// SagaCountOverdue counts running or compensating sagas whose deadline is
// before before.
func (s *Store) SagaCountOverdue(ctx context.Context, before time.Time) (int64, error) {
	n, err := s.queries.SagaCountOverdue(ctx, s.db(nil), before)
	if err != nil {
		return 0, fmt.Errorf("count overdue sagas: %w", err)
	}
	return n, nil
}

// SagaDeleteFinishedBefore deletes at most max sagas (with their history)
// that finished before before.
func (s *Store) SagaDeleteFinishedBefore(ctx context.Context, before time.Time, max int) (int64, error) {
	var n int64
	err := s.InTx(ctx, func(tx pgx.Tx) error {
		if err := s.setLocalTimeouts(ctx, tx); err != nil {
			return err
		}
		var err error
		n, err = s.queries.SagaDeleteFinishedBefore(ctx, s.db(tx), &dbsqlc.SagaDeleteFinishedBeforeParams{FinishedBefore: before, Max: int32(max)})
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("delete finished sagas: %w", err)
	}
	return n, nil
}

// SagaHistoryInsert appends entries to the history of saga id in tx.
func (s *Store) SagaHistoryInsert(ctx context.Context, tx pgx.Tx, id uuid.UUID, entries []HistoryRecord) error {
	if len(entries) == 0 {
		return nil
	}
	n := len(entries)
	p := &dbsqlc.SagaHistoryInsertParams{
		SagaID: id, At: make([]time.Time, n), Event: make([]string, n), Step: make([]string, n),
		StepIndex: make([]int32, n), Phase: make([]string, n), Attempt: make([]int32, n),
		Detail: make([]string, n), Actor: make([]string, n), MessageID: make([]uuid.UUID, n),
	}
	for i, e := range entries {
		p.At[i], p.Event[i], p.Step[i], p.StepIndex[i] = e.At, e.Event, e.Step, int32(e.StepIndex)
		p.Phase[i], p.Attempt[i], p.Detail[i], p.Actor[i], p.MessageID[i] = e.Phase, int32(e.Attempt), e.Detail, e.Actor, e.MessageID
	}
	if err := s.queries.SagaHistoryInsert(ctx, s.db(tx), p); err != nil {
		return fmt.Errorf("append %d history entries to saga %s: %w", n, id, err)
	}
	return nil
}

// SagaHistory returns the history of saga id, oldest first.
func (s *Store) SagaHistory(ctx context.Context, id uuid.UUID) ([]HistoryRecord, error) {
	rows, err := s.queries.SagaHistoryList(ctx, s.db(nil), id)
	if err != nil {
		return nil, fmt.Errorf("list history of saga %s: %w", id, err)
	}
	out := make([]HistoryRecord, len(rows))
	for i, r := range rows {
		out[i] = HistoryRecord{
			ID: r.ID, SagaID: r.SagaID, At: r.At, Event: r.Event, Step: r.Step, StepIndex: int(r.StepIndex),
			Phase: r.Phase, Attempt: int(r.Attempt), Detail: r.Detail, Actor: r.Actor,
		}
		if r.MessageID.Valid {
			out[i].MessageID = r.MessageID.UUID
		}
	}
	return out, nil
}
