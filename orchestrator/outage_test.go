package orchestrator

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The broker's outages do not count against step timeouts: deadlines are
// paused while it is down, then compared with a clock that runs behind by
// the outage for as long as the outage lasted, then catches up.
func TestOutageClock(t *testing.T) {
	t.Parallel()
	var o outageClock
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := func(sec int, downSince time.Time) (time.Time, bool) {
		return o.at(t0.Add(time.Duration(sec)*time.Second), downSince)
	}
	due, paused := at(0, time.Time{})
	require.Equal(t, t0, due)
	require.False(t, paused)

	down := t0.Add(10 * time.Second)
	_, paused = at(12, down)
	require.True(t, paused, "nothing fires while the broker is down")
	_, paused = at(40, down)
	require.True(t, paused)

	// Back at 40 after 30 s away: 30 s of credit until 70.
	due, paused = at(40, time.Time{})
	require.False(t, paused)
	require.Equal(t, t0.Add(10*time.Second), due, "a deadline at 10 (when the broker left) is due at 40")
	due, _ = at(69, time.Time{})
	require.Equal(t, t0.Add(39*time.Second), due)
	due, _ = at(70, time.Time{})
	require.Equal(t, t0.Add(70*time.Second), due, "the clock has caught up")

	// An outage while credit is left adds to what is left.
	_, paused = at(80, t0.Add(80*time.Second))
	require.True(t, paused)
	due, _ = at(90, time.Time{}) // 10 s of credit until 100
	require.Equal(t, t0.Add(80*time.Second), due)
	_, _ = at(92, t0.Add(92*time.Second))
	due, _ = at(96, time.Time{}) // 4 s away, 4 s of credit left
	require.Equal(t, t0.Add(96*time.Second-8*time.Second), due)
	due, _ = at(104, time.Time{})
	require.Equal(t, t0.Add(104*time.Second), due, "caught up again")

	// With a recovery grace, the clock runs behind by the outage and the
	// grace, for as long.
	g := outageClock{grace: 5 * time.Second}
	_, paused = g.at(t0.Add(10*time.Second), t0.Add(10*time.Second))
	require.True(t, paused)
	due, _ = g.at(t0.Add(20*time.Second), time.Time{}) // 10 s away + 5 s grace: 15 s of credit until 35
	require.Equal(t, t0.Add(5*time.Second), due)
	due, _ = g.at(t0.Add(34*time.Second), time.Time{})
	require.Equal(t, t0.Add(19*time.Second), due)
	due, _ = g.at(t0.Add(35*time.Second), time.Time{})
	require.Equal(t, t0.Add(35*time.Second), due)
}
