package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/cmd/sagabox/internal/bench"
	"github.com/sagabox/sagabox/cmd/sagabox/internal/cli"
	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
)

// runBench runs `sagabox bench sagas` with args against the test servers,
// with more time than run gives.
func runBench(t *testing.T, args ...string) result {
	t.Helper()
	dbtest.Pool(t) // creates the test database if needed
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	args = append([]string{"--database-url", dbtest.URL(), "--json", "bench", "sagas", "--amqp-url", amqptest.URL(t),
		"--pool", "4", "--workers", "2", "--concurrency", "2"}, args...)
	code := cli.Run(ctx, args, &out, &errOut)
	return result{code, out.String(), errOut.String()}
}

// Bad sweep and replicas flags are usage errors, found before anything
// connects.
func TestBenchSagasFlagErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--rates", "50,fast"}, "--rates"},
		{[]string{"--rates", "50,0"}, "Rates"},
		{[]string{"--rates", "-20"}, "Rates"},
		{[]string{"--repeat", "0"}, "--repeat 0"},
		{[]string{"--only", "engine,nope"}, `Only "nope"`},
		{[]string{"--replicas", "0"}, "Replicas"},
		{[]string{"--replicas", "1,x"}, "--replicas"},
		{[]string{"--replicas", "1,2", "--rates", "50"}, "Rates and Replicas"},
		{[]string{"--replicas", "1", "--only", "baseline"}, "Only"},
	} {
		var out, errOut bytes.Buffer
		args := append([]string{"--database-url", "postgres://nobody@127.0.0.1:1/none", "bench", "sagas"}, tc.args...)
		code := cli.Run(context.Background(), args, &out, &errOut)
		require.Equal(t, cli.ExitUsage, code, "%v: %s", tc.args, errOut.String())
		require.Contains(t, errOut.String(), tc.want, tc.args)
		require.Empty(t, out.String(), tc.args)
	}
}

// One short sweep: its JSON has each run and the medians per rate, the
// engine's ratios to the baseline and the steal of each run; no saturated
// run. Structure only, never a timing.
func TestBenchSagasSweep(t *testing.T) {
	t.Parallel()
	r := runBench(t, "--rates", "20", "--repeat", "1", "--duration", "2s")
	require.Equal(t, cli.ExitOK, r.code, r.stderr)
	var rep bench.SagaReport
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &rep), r.stdout)
	require.Nil(t, rep.Engine, "a sweep runs no saturated run")
	require.Nil(t, rep.Baseline)
	require.NotNil(t, rep.Sweep)
	require.Equal(t, 2.0, rep.Sweep.Seconds)
	require.Equal(t, 1, rep.Sweep.Repeat)
	require.Equal(t, []string{bench.PipelineEngine, bench.PipelineBaseline}, rep.Sweep.Pipelines)
	require.Len(t, rep.Sweep.Rates, 1)
	pt := rep.Sweep.Rates[0]
	require.Equal(t, 20.0, pt.Rate)
	require.Len(t, pt.Runs, 2)
	for i, want := range []string{bench.PipelineEngine, bench.PipelineBaseline} {
		run := pt.Runs[i]
		require.Equal(t, want, run.Pipeline, "engine and baseline alternate, the engine first")
		require.Equal(t, 1, run.Repeat)
		require.Equal(t, 40, run.Sagas, "20 sagas/s for 2 s")
		require.Positive(t, run.CPUMicros, want)
		require.LessOrEqual(t, run.P50ms, run.P99ms, want)
		require.GreaterOrEqual(t, run.StealPct, 0.0, want)
		require.LessOrEqual(t, run.StealPct, 100.0, want)
	}
	require.Equal(t, pt.Runs[0].LoadPoint, *pt.Engine, "the median of one run is the run")
	require.Equal(t, pt.Runs[1].LoadPoint, *pt.Baseline)
	require.Nil(t, pt.GroupBaseline)
	require.Positive(t, pt.RatioP50)
	require.Positive(t, pt.RatioP99)

	var doc struct {
		Sweep struct {
			Rates []struct {
				Engine map[string]any   `json:"engine"`
				Runs   []map[string]any `json:"runs"`
			} `json:"rates"`
		} `json:"sweep"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &doc))
	for _, k := range []string{"p50_ms", "p99_ms", "cpu_us_per_saga", "cpu_us_per_saga_pg", "cpu_us_per_saga_rabbitmq", "cpu_us_per_saga_go", "steal_pct"} {
		require.Contains(t, doc.Sweep.Rates[0].Engine, k)
		require.Contains(t, doc.Sweep.Rates[0].Runs[0], k)
	}
	for _, k := range []string{"pipeline", "repeat", "sagas"} {
		require.Contains(t, doc.Sweep.Rates[0].Runs[0], k)
	}
	for _, k := range []string{`"ratio_p50"`, `"ratio_p99"`, `"duration_s"`, `"pipelines"`} {
		require.Contains(t, r.stdout, k)
	}
	require.NotContains(t, r.stdout, "half_load")
}

// One short replicas measurement with 1 and 2 orchestrator processes: its
// JSON has a row per count, and every replica process is gone afterwards.
func TestBenchSagasReplicas(t *testing.T) {
	t.Parallel()
	r := runBench(t, "--replicas", "1,2", "--sagas", "40")
	require.Equal(t, cli.ExitOK, r.code, r.stderr)
	var rep bench.SagaReport
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &rep), r.stdout)
	require.Nil(t, rep.Engine, "the replicas measurement runs nothing else")
	require.Nil(t, rep.Sweep)
	require.Len(t, rep.Replicas, 2)
	for i, n := range []int{1, 2} {
		run := rep.Replicas[i]
		require.Equal(t, n, run.Replicas)
		require.Equal(t, 40, run.Sagas, "every saga started completed")
		require.Positive(t, run.SagasPerSec)
		require.Positive(t, run.RatioToOne)
		require.Positive(t, run.CPUMicrosGo, "the replicas' CPU counts")
		require.InDelta(t, run.CPUMicrosPostgres+run.CPUMicrosRabbitMQ+run.CPUMicrosGo, run.CPUMicros, 0.2)
		require.LessOrEqual(t, run.P50ms, run.P99ms)
	}
	require.Equal(t, 1.0, rep.Replicas[0].RatioToOne)
	var doc struct {
		Replicas []map[string]any `json:"replicas"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &doc))
	for _, k := range []string{"replicas", "ratio_to_one_replica", "sagas_per_s", "cpu_us_per_saga", "cpu_us_per_saga_pg", "cpu_us_per_saga_rabbitmq", "cpu_us_per_saga_go", "p50_ms", "p99_ms", "steal_pct"} {
		require.Contains(t, doc.Replicas[1], k)
	}
	require.Empty(t, replicaChildren(t), "every replica was stopped and waited for")
}

// replicaChildren returns the PIDs of this process's children that run
// `bench orchestrator-replica`.
func replicaChildren(t *testing.T) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		cmdline, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if len(fields) > 1 && fields[1] == strconv.Itoa(os.Getpid()) && strings.Contains(string(cmdline), "orchestrator-replica") {
			out = append(out, pid)
		}
	}
	return out
}
