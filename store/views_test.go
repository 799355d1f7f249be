package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit/dbtest"
)

// The inspection views are a supported query API: they must exist and
// answer with the documented columns.
func TestInspectionViews(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t)
	ctx := context.Background()
	now := time.Now()
	rec := newSaga("order-9", time.Time{})
	rec.Steps = []byte(`[{"name":"reserve-stock","status":"succeeded","attempt":1},{"name":"charge","status":"running","attempt":2,"last_error":"slow"}]`)
	rec.CurrentStep = 1
	require.True(t, start(t, s, rec, now))
	q := func(sql string, dest ...any) {
		t.Helper()
		require.NoError(t, s.Pool.QueryRow(ctx, fmt.Sprintf(sql, s.Schema())).Scan(dest...), sql)
	}
	var step, status string
	q(`SELECT current_step_name, status FROM %q.sagabox_saga_v`, &step, &status)
	require.Equal(t, "charge", step)
	require.Equal(t, "running", status)

	var attempt int
	var lastErr string
	q(`SELECT attempt, last_error FROM %q.sagabox_saga_step_v WHERE step_index = 1`, &attempt, &lastErr)
	require.Equal(t, 2, attempt)
	require.Equal(t, "slow", lastErr)

	var event string
	q(`SELECT event FROM %q.sagabox_saga_history_v`, &event)
	require.Equal(t, "started", event)

	var backlog int64
	var age float64
	q(`SELECT backlog, oldest_age_seconds FROM %q.sagabox_outbox_backlog_v`, &backlog, &age)
	require.EqualValues(t, 1, backlog)
	require.GreaterOrEqual(t, age, 0.0)
}

// A finished saga has no current step (current_step -1): the view must not
// name one. `steps -> -1` counts from the end of the array in PostgreSQL,
// which named the last step, one a compensated saga may never have run.
func TestInspectionViewFinishedSagaHasNoCurrentStep(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t)
	ctx := context.Background()
	rec := newSaga("order-10", time.Time{})
	rec.Status = "compensated"
	rec.Phase = "compensation"
	rec.Steps = []byte(`[{"name":"reserve-stock","status":"compensated","attempt":1},{"name":"charge","status":"rejected","attempt":1},{"name":"ship","status":"pending"}]`)
	rec.CurrentStep = -1
	require.True(t, start(t, s, rec, time.Now()))
	var step *string
	var current int
	require.NoError(t, s.Pool.QueryRow(ctx, fmt.Sprintf(`SELECT current_step, current_step_name FROM %q.sagabox_saga_v`, s.Schema())).Scan(&current, &step))
	require.Equal(t, -1, current)
	require.Nil(t, step, "a finished saga has no current step name")
}
