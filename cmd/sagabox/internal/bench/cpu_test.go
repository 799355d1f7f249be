package bench

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestHostStealFromProcStat(t *testing.T) {
	t.Parallel()
	// user nice system idle iowait irq softirq steal guest guest_nice: the
	// guest columns are part of user and nice already.
	before, err := parseProcStat("cpu  1000 0 500 8000 100 0 50 350 900 0\ncpu0 500 0 250 4000 50 0 25 175 450 0\nintr 1 2 3\n")
	require.NoError(t, err)
	require.Equal(t, hostTicks{total: 10000, steal: 350}, before)
	after, err := parseProcStat("cpu  1600 0 700 8800 100 0 50 750 1500 0\n")
	require.NoError(t, err)
	require.Equal(t, hostTicks{total: 12000, steal: 750}, after)
	require.Equal(t, 20.0, after.stealPercent(before), "400 stolen of 2000 ticks")
	require.Zero(t, before.stealPercent(before), "no tick passed")

	old, err := parseProcStat("cpu  1000 0 500 8000\n")
	require.NoError(t, err, "a kernel without the steal column")
	require.Equal(t, hostTicks{total: 9500}, old)

	for _, bad := range []string{"", "intr 1 2\n", "cpu  1 x 3 4\n", "cpu  1 2\n"} {
		_, err := parseProcStat(bad)
		require.Error(t, err, "%q", bad)
	}
}

// The host's real /proc/stat parses, and its ticks only grow.
func TestReadHostTicks(t *testing.T) {
	t.Parallel()
	h0, err := readHostTicks()
	require.NoError(t, err)
	require.Positive(t, h0.total)
	h1, err := readHostTicks()
	require.NoError(t, err)
	require.GreaterOrEqual(t, h1.total, h0.total)
	require.GreaterOrEqual(t, h1.steal, h0.steal)
	require.GreaterOrEqual(t, h1.stealPercent(h0), 0.0)
	require.LessOrEqual(t, h1.stealPercent(h0), 100.0)
}
