package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store/driver"
)

// stepsJSON is a saga's steps with the first step running, its deadline
// and schedule-to-start deadline (start_by, zero: none) as given.
func stepsJSON(deadline, startBy time.Time) []byte {
	st := map[string]any{"name": "reserve", "status": "running", "attempt": 1, "deadline": deadline.Format(time.RFC3339Nano)}
	if !startBy.IsZero() {
		st["start_by"] = startBy.Format(time.RFC3339Nano)
	}
	b, _ := json.Marshal([]any{st})
	return b
}

// A saga held by an unpublished command is claimed once a step's
// schedule-to-start deadline has passed, with the unpublished messages at
// hand; the gauges tell the sweeper's overdue sagas from those held.
func TestClaimDueSagasWithAScheduleToStartDeadline(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Microsecond)
	written := now.Add(-10 * time.Minute)
	keys := []driver.SagaKey{{Type: "checkout", Version: 1}}

	held := newSaga("", now.Add(-5*time.Minute)) // its deadline passed
	held.Steps = stepsJSON(held.Deadline, now.Add(time.Minute))
	require.True(t, start(t, s, held, written))
	late := newSaga("", now.Add(-5*time.Minute))
	late.Steps = stepsJSON(late.Deadline, now.Add(-time.Second)) // and its start_by
	require.True(t, start(t, s, late, written))
	none := newSaga("", time.Time{}) // no deadline at all, held
	require.True(t, start(t, s, none, written))

	claim := func(at time.Time) []uuid.UUID {
		tx := s.Begin(nil)
		defer tx.Rollback(ctx)
		recs, err := s.SagaClaimDue(ctx, tx, at, 10, keys)
		require.NoError(t, err)
		var ids []uuid.UUID
		for _, r := range recs {
			ids = append(ids, r.ID)
		}
		return ids
	}
	require.Equal(t, []uuid.UUID{late.ID}, claim(now), "only the saga whose start_by passed")
	require.ElementsMatch(t, []uuid.UUID{late.ID, held.ID}, claim(now.Add(2*time.Minute)))

	tx := s.Begin(nil)
	defer tx.Rollback(ctx)
	msgs, err := s.SagaUnpublished(ctx, tx, []uuid.UUID{late.ID, uuid.New()})
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	require.Equal(t, late.ID, msgs[0].SagaID)
	require.Equal(t, message.KindCommand, msgs[0].Kind)
	require.Zero(t, msgs[0].Attempt, "as written by start")
	require.WithinDuration(t, written, msgs[0].CreatedAt, time.Millisecond)
	tx.Rollback(ctx)

	overdue, err := s.SagaCountOverdue(ctx, now)
	require.NoError(t, err)
	require.Equal(t, int64(1), overdue, "only the saga the sweeper should have fired")
	counts, err := s.SagaCountUnpublishedOverdue(ctx, now.Add(-time.Minute))
	require.NoError(t, err)
	require.Equal(t, []driver.SagaCount{{Type: "checkout", Count: 3}}, counts, "past their deadline, or without one")
	counts, err = s.SagaCountUnpublishedOverdue(ctx, written)
	require.NoError(t, err)
	require.Empty(t, counts, "not waiting long enough")

	byType, err := s.OutboxUnpublishedByType(ctx, 10)
	require.NoError(t, err)
	require.Len(t, byType, 1)
	require.Equal(t, driver.OutboxTypeBacklog{Type: "inventory.reserve", Kind: message.KindCommand, Count: 3, Oldest: byType[0].Oldest}, byType[0])
	require.WithinDuration(t, written, byType[0].Oldest, time.Millisecond)
}

// A transition withdraws the unpublished messages it names, of its saga
// only, before it writes its own.
func TestTransitionWithdrawsMessages(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t)
	ctx := context.Background()
	now := time.Now()
	a, b := newSaga("", time.Time{}), newSaga("", time.Time{})
	require.True(t, start(t, s, a, now))
	require.True(t, start(t, s, b, now))
	unpublished := func(id uuid.UUID) []driver.UnpublishedMessage {
		tx := s.Begin(nil)
		defer tx.Rollback(ctx)
		msgs, err := s.SagaUnpublished(ctx, tx, []uuid.UUID{id})
		require.NoError(t, err)
		return msgs
	}
	cmdA, cmdB := unpublished(a.ID)[0], unpublished(b.ID)[0]
	got, err := s.SagaGet(ctx, a.ID)
	require.NoError(t, err)
	tx := s.Begin(nil)
	defer tx.Rollback(ctx)
	require.NoError(t, s.SagaWrite(ctx, tx, []driver.Transition{{
		Saga:     &got,
		Withdraw: []uuid.UUID{cmdA.MessageID, cmdB.MessageID}, // b's is not a's to withdraw
		Messages: []message.Message{{
			Envelope: message.Envelope{Type: "inventory.release", Kind: message.KindCompensation, SagaID: a.ID, Step: "reserve", ReplyTo: "orders"},
			Payload:  []byte(`{}`),
		}},
	}}, now))
	dbtest.Commit(t, tx)
	left := unpublished(a.ID)
	require.Len(t, left, 1)
	require.Equal(t, message.KindCompensation, left[0].Kind, "the command withdrawn, the compensation written")
	require.Equal(t, []driver.UnpublishedMessage{cmdB}, unpublished(b.ID))
	require.Zero(t, count.n(t, s, fmt.Sprintf(`SELECT count(*) FROM %%q.sagabox_outbox WHERE message_id = '%s'`, cmdA.MessageID)))
}

// A late publish pushes a step's deadline back; the saga's deadline is
// still the earliest of the deadlines and schedule-to-start deadlines.
func TestLatePublishKeepsTheScheduleToStartDeadline(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Microsecond)
	rec := newSaga("", now.Add(30*time.Second))
	rec.Steps = stepsJSON(now.Add(30*time.Second), now.Add(40*time.Second))
	require.True(t, start(t, s, rec, now))
	rows, err := s.OutboxClaim(ctx, driver.OutboxClaimOpts{Max: 10, Lease: time.Minute, ClaimedBy: "r"})
	require.NoError(t, err)
	require.Len(t, rows, 1)
	_, err = s.OutboxClaim(ctx, driver.OutboxClaimOpts{Lease: time.Minute, ClaimedBy: "r", Settle: driver.OutboxSettle{
		Published: []int64{rows[0].ID},
		Late:      []driver.LateSend{{SagaID: rec.ID, StepIndex: 0, Phase: message.PhaseAction, Attempt: 1, Delay: 20 * time.Second}},
	}})
	require.NoError(t, err)
	got, err := s.SagaGet(ctx, rec.ID)
	require.NoError(t, err)
	require.WithinDuration(t, now.Add(40*time.Second), got.Deadline, time.Millisecond, "start_by, earlier than the shifted deadline")
}
