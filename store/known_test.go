package store_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/store/driver"
)

// requireStored checks that kept, a saga as a write left it, is the row
// PostgreSQL holds: what a reply applied to the kept copy sees is what it
// would have read.
func requireStored(t *testing.T, s *dbtest.DB, kept driver.SagaRecord) {
	t.Helper()
	got, err := s.SagaGet(context.Background(), kept.ID)
	require.NoError(t, err)
	require.JSONEq(t, string(got.Data), string(kept.Data), "data")
	require.JSONEq(t, string(got.Steps), string(kept.Steps), "step states")
	got.Data, got.Steps, kept.Data, kept.Steps = nil, nil, nil, nil
	// Not kept by a write: the start's own (SagaReceive does not read them
	// either).
	got.StartDataHash, got.StartKeyReleased = nil, false
	require.Equal(t, inUTC(got), inUTC(kept))
}

// inUTC is r with its times in UTC: the same instants, as pgx reads them
// in the local zone.
func inUTC(r driver.SagaRecord) driver.SagaRecord {
	for _, at := range []*time.Time{&r.Deadline, &r.CreatedAt, &r.UpdatedAt, &r.FinishedAt, &r.AdmittedAt} {
		if !at.IsZero() {
			*at = at.UTC()
		}
	}
	return r
}

// A write leaves each saga it wrote as stored: its revision advanced and
// its times, admission and text as PostgreSQL keeps them, for a start and
// for a transition.
func TestWrittenSagaIsTheStoredRow(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t)
	ctx := context.Background()
	// Nanoseconds and a zone the columns do not keep.
	now := time.Date(2026, 12, 2, 10, 0, 0, 123456789, time.FixedZone("X", 3600))
	rec := newSaga("", now.Add(time.Minute))
	rec.Data = []byte(`{"b": 1,  "a": [1, 2]}`)
	rec.Steps = []byte(`[{"name": "reserve", "status": "running"}]`)
	st := &driver.SagaStart{Saga: rec, History: []driver.HistoryRecord{{SagaID: rec.ID, At: now, Event: "started"}}}
	require.NoError(t, s.InTx(ctx, func(tx pgx.Tx) error {
		ok, err := s.SagaStart(ctx, tx, st, now)
		require.True(t, ok)
		return err
	}))
	require.Equal(t, int64(1), st.Saga.Revision)
	requireStored(t, s, st.Saga)

	next := st.Saga
	next.LastError = "bad\x00byte \xff"
	next.Status, next.FinishedAt = "compensated", now.Add(time.Second)
	next.Deadline = time.Time{}
	later := now.Add(2 * time.Second)
	tx := s.Begin(nil)
	defer tx.Rollback(ctx)
	require.NoError(t, s.SagaWrite(ctx, tx, []driver.Transition{{Saga: &next}}, later))
	dbtest.Commit(t, tx)
	require.Equal(t, int64(2), next.Revision)
	requireStored(t, s, next)
}

// A queued saga is admitted by the write that first runs it, and the
// record says so.
func TestWrittenSagaIsAdmittedAsStored(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t)
	ctx := context.Background()
	now := time.Now()
	rec := newSaga("", time.Time{})
	rec.Status = "queued"
	st := &driver.SagaStart{Saga: rec}
	require.NoError(t, s.InTx(ctx, func(tx pgx.Tx) error {
		_, err := s.SagaStart(ctx, tx, st, now)
		return err
	}))
	require.True(t, st.Saga.AdmittedAt.IsZero(), "a queued saga is not admitted")
	requireStored(t, s, st.Saga)
	next := st.Saga
	next.Status = "running"
	tx := s.Begin(nil)
	defer tx.Rollback(ctx)
	require.NoError(t, s.SagaWrite(ctx, tx, []driver.Transition{{Saga: &next}}, now.Add(time.Second)))
	dbtest.Commit(t, tx)
	require.False(t, next.AdmittedAt.IsZero())
	requireStored(t, s, next)
}

// A reply to a saga the caller kept goes out with the write, in one round
// trip: it is recorded in the inbox and the transition written. The same
// reply received that way again, or a reply written against a revision that
// moved on, fails retryably and leaves nothing behind: no inbox entry (so
// that ReplyReceive records it afterwards), no history, no message, the
// saga as it was.
func TestKnownRepliesAreCheckedByTheInboxAndTheRevision(t *testing.T) {
	t.Parallel()
	var rts dbtest.RoundTrips
	s := dbtest.StoreOnPool(t, dbtest.PoolWith(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = &rts }))
	ctx := context.Background()
	now := time.Now()
	rec := newSaga("", time.Time{})
	require.True(t, start(t, s, rec, now))
	kept, err := s.SagaGet(ctx, rec.ID)
	require.NoError(t, err)
	reply := func() *message.Envelope {
		return &message.Envelope{MessageID: uuid.New(), Type: "inventory.reserve", Kind: message.KindReplySuccess, SagaID: rec.ID, Step: "reserve"}
	}
	apply := func(env *message.Envelope, r driver.SagaRecord) (driver.SagaRecord, error) {
		tx := s.Begin(nil)
		defer tx.Rollback(ctx)
		if err := s.ReplyReceiveKnown(ctx, tx, []*message.Envelope{env}); err != nil {
			return r, err
		}
		r.Data = json.RawMessage(`{"step": "next"}`)
		err := s.SagaWrite(ctx, tx, []driver.Transition{{
			Saga:     &r,
			History:  []driver.HistoryRecord{{SagaID: r.ID, At: now, Event: "reply-applied", MessageID: env.MessageID}},
			Messages: []message.Message{{Envelope: message.Envelope{Type: "payment.charge", Kind: message.KindCommand, SagaID: r.ID, Step: "charge"}, Payload: []byte(`{}`)}},
		}}, now)
		if err != nil {
			return r, err
		}
		_, err = tx.Commit(ctx)
		return r, err
	}
	inbox := `SELECT count(*) FROM %q.sagabox_inbox WHERE message_id = $1`
	history := `SELECT count(*) FROM %q.sagabox_saga_history`
	outbox := `SELECT count(*) FROM %q.sagabox_outbox`

	first := reply()
	rts.Start()
	written, err := apply(first, kept)
	rts.Stop()
	require.NoError(t, err)
	txs := rts.Transactions()
	require.Len(t, txs, 1)
	require.Len(t, txs[0].RoundTrips, 1, "one round trip: %v", txs[0].Statements())
	require.Equal(t, 1, count.n(t, s, inbox, first.MessageID))
	requireStored(t, s, written)

	_, err = apply(first, written)
	require.Error(t, err, "the reply was received before")
	require.True(t, store.IsRetryable(err), "a duplicate asks for the ordinary receipt: %v", err)
	stale := reply()
	_, err = apply(stale, kept)
	require.Error(t, err, "the kept saga is out of date")
	require.True(t, store.IsRetryable(err), "a stale saga asks for the ordinary receipt: %v", err)

	require.Equal(t, 0, count.n(t, s, inbox, stale.MessageID), "the failed receipt left no inbox entry")
	require.Equal(t, 2, count.n(t, s, history), "nor history")
	require.Equal(t, 2, count.n(t, s, outbox), "nor a message")
	requireStored(t, s, written)

	// The ordinary receipt then sees the duplicate as one, and the stale
	// reply as new, with the saga as stored.
	tx := s.Begin(nil)
	defer tx.Rollback(ctx)
	rcpts, err := s.ReplyReceive(ctx, tx, []*message.Envelope{first, stale})
	require.NoError(t, err)
	require.False(t, rcpts[0].Fresh)
	require.True(t, rcpts[1].Fresh)
	require.Equal(t, written.Revision, rcpts[1].Saga.Revision)
}
