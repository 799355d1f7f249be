package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The fault plan has every fault asked for, kills every kind of process
// once there are as many kills as kinds, alternates the broker and database restart
// modes, and never puts two infrastructure faults side by side when kills
// can separate them.
func TestPlan(t *testing.T) {
	t.Parallel()
	for _, c := range []config{
		{kills: 6, brokerRestarts: 2, dbRestarts: 2},
		{kills: 5, brokerRestarts: 1, dbRestarts: 1},
		{kills: 24, brokerRestarts: 3, dbRestarts: 2},
		{kills: 0, brokerRestarts: 1, dbRestarts: 0},
		{kills: 3, brokerRestarts: 0, dbRestarts: 0},
	} {
		r := &runner{c: &c}
		faults := r.plan()
		require.Len(t, faults, c.kills+c.brokerRestarts+c.dbRestarts)
		kinds := map[string]int{}
		killed := map[string]bool{}
		hows := map[string]bool{}
		for i, f := range faults {
			require.NotNil(t, f, "slot %d of %+v", i, c)
			kinds[f.kind]++
			hows[f.kind+" "+f.how] = true
			if f.kind == "SIGKILL" {
				killed[f.target[:len(f.target)-2]] = true
			} else if i > 0 && c.kills >= c.brokerRestarts+c.dbRestarts {
				require.Equal(t, "SIGKILL", faults[i-1].kind, "two infrastructure faults in a row in %+v", c)
			}
		}
		require.Equal(t, c.kills, kinds["SIGKILL"])
		require.Equal(t, c.brokerRestarts, kinds["broker"])
		require.Equal(t, c.dbRestarts, kinds["database"])
		if c.kills >= len(schemas) {
			require.Len(t, killed, len(schemas), "every kind of process is killed: %v", killed)
		}
		if c.brokerRestarts >= 2 {
			require.True(t, hows["broker kill -9"] && hows["broker graceful"], "%v", hows)
		}
		if c.dbRestarts >= 2 {
			require.True(t, hows["database immediate"] && hows["database fast"], "%v", hows)
		}
	}
}
