package faulttest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/saga"
)

// The kit's end-to-end tests run the checkout example under it
// (examples/checkout/faults_test.go): the real services pass, and two
// deliberately wrong payment services are caught. These are its pure parts.

func TestScenarioValidateNamesTheFields(t *testing.T) {
	t.Parallel()
	_, err := Execute(context.Background(), Scenario[int]{Participants: []Participant{{}}, Sagas: -1})
	require.Error(t, err)
	for _, field := range []string{"Pool", "Dial", "Input", "Start", "Plan", "Participants[0].Register", "Sagas -1"} {
		require.ErrorContains(t, err, field)
	}
}

func TestSeedFromEnvironment(t *testing.T) {
	t.Setenv(SeedEnv, "42")
	seed, err := Seed()
	require.NoError(t, err)
	require.EqualValues(t, 42, seed)

	t.Setenv(SeedEnv, "forty-two")
	_, err = Seed()
	require.ErrorContains(t, err, SeedEnv)
}

func TestReportShowsTheFirstViolationWithItsTimelineAndTheSeed(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	id := uuid.New()
	r := &Report{
		Seed: 7, Sagas: 2, Duration: time.Second,
		Outcomes: map[saga.Status]int{saga.StatusCompleted: 1, saga.StatusCompensated: 1},
		Faults:   map[Fault]int{FaultDuplicate: 3, FaultKill: 1},
		Violations: []Violation{
			{Invariant: "stock", Err: errors.New("2 taken, 1 bought"), SagaID: id, Timeline: []saga.HistoryEntry{
				{At: at, Event: saga.HistoryStarted},
				{At: at.Add(time.Second), Event: saga.HistoryCommandSent, Step: "reserve", Attempt: 2},
			}},
			{Invariant: InvariantOutbox, Err: errors.New("1 unpublished")},
		},
	}
	require.True(t, r.Failed())
	require.Equal(t, 4, r.FaultCount())
	require.NotNil(t, r.Violated(InvariantOutbox))
	require.Nil(t, r.Violated(InvariantTerminal))
	out := r.String()
	for _, want := range []string{
		"seed 7", "1 completed, 1 compensated", "duplicate=3", "kill-connection=1", `VIOLATED "stock": 2 taken, 1 bought`,
		"timeline of saga " + id.String(), "command-sent", "(attempt 2)", `also violated "no message left unpublished"`,
		"repeat with FAULTTEST_SEED=7",
	} {
		require.Contains(t, out, want)
	}
	require.Contains(t, (&Report{Seed: 1}).String(), "invariants: OK")
}
