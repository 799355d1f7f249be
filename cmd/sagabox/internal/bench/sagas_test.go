package bench

import (
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
)

// BenchmarkSagas runs the saga measurements once, with smaller sizes than
// `sagabox bench sagas`, and reports the engine's rate as a ratio of the
// baselines' measured in the same run:
//
//	go test -run '^$' -bench BenchmarkSagas -benchtime 1x ./cmd/sagabox/internal/bench
func BenchmarkSagas(b *testing.B) {
	dbtest.Pool(b) // creates the test database if needed
	for range b.N {
		rep, err := RunSagas(context.Background(), SagaConfig{
			DatabaseURL: dbtest.URL(), AMQPURL: amqptest.URL(b),
			Sagas: 500, Duration: 3 * time.Second, Log: os.Stderr,
		})
		if err != nil {
			b.Fatal(err)
		}
		rep.Print(os.Stderr)
		b.ReportMetric(rep.Ratio, "engine/baseline")
		b.ReportMetric(rep.RatioGroup, "engine/group")
		b.ReportMetric(rep.Engine.SagasPerSec, "engine-sagas/s")
		b.ReportMetric(rep.Engine.CPUMicros, "engine-cpu-µs/saga")
		b.ReportMetric(rep.Baseline.CPUMicros, "baseline-cpu-µs/saga")
	}
}

// TestSagaBenchSmoke runs every pipeline of the saga bench on a few sagas
// against the real services, saturated and then open-loop at half the
// engine's rate, and checks the report's structure, never a timing.
func TestSagaBenchSmoke(t *testing.T) {
	t.Parallel()
	dbtest.Pool(t) // creates the test database if needed
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := RunSagas(ctx, SagaConfig{
		DatabaseURL: dbtest.URL(), AMQPURL: amqptest.URL(t),
		Sagas: 50, Concurrency: 2, PoolSize: 4, Workers: 2,
		Duration: 500 * time.Millisecond,
	})
	require.NoError(t, err)

	for name, p := range map[string]*PipelineReport{"engine": rep.Engine, "baseline": rep.Baseline, "group_baseline": rep.GroupBaseline} {
		require.NotNil(t, p, name)
		require.Equal(t, 50, p.Sagas, "%s: every saga started completed (RunSagas waits for them)", name)
		require.Positive(t, p.SagasPerSec, name)
		for _, v := range []float64{p.CPUMicros, p.CPUMicrosPostgres, p.CPUMicrosRabbitMQ, p.CPUMicrosGo} {
			require.GreaterOrEqual(t, v, 0.0, name)
		}
		require.LessOrEqual(t, p.P50ms, p.P99ms, name)
		require.GreaterOrEqual(t, p.StealPct, 0.0, name)
	}
	// The half load is a sweep of one rate, one run of each pipeline.
	require.NotNil(t, rep.Sweep)
	require.Equal(t, []string{PipelineEngine, PipelineBaseline, PipelineGroup}, rep.Sweep.Pipelines)
	require.Len(t, rep.Sweep.Rates, 1)
	pt := rep.Sweep.Rates[0]
	require.InDelta(t, rep.Engine.SagasPerSec/2, pt.Rate, 0.1)
	require.Len(t, pt.Runs, 3)
	for _, run := range pt.Runs {
		require.Equal(t, max(1, int(pt.Rate*0.5)), run.Sagas, run.Pipeline)
		require.Positive(t, run.CPUMicros, "%s: the open loop's CPU per saga", run.Pipeline)
		require.InDelta(t, run.CPUMicrosPostgres+run.CPUMicrosRabbitMQ+run.CPUMicrosGo, run.CPUMicros, 0.2, run.Pipeline)
		require.LessOrEqual(t, run.P50ms, run.P99ms, run.Pipeline)
	}
	for name, m := range map[string]*LoadPoint{"engine": pt.Engine, "baseline": pt.Baseline, "group_baseline": pt.GroupBaseline} {
		require.NotNil(t, m, name)
	}
	require.Equal(t, pt.Runs[0].LoadPoint, *pt.Engine, "the median of one run is the run")
	require.Equal(t, 4, rep.PoolSize)
	require.Equal(t, "quorum", rep.QueueType)

	out, err := json.Marshal(rep)
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(out, &doc))
	for _, k := range []string{"engine", "baseline", "group_baseline", "ratio", "ratio_group", "sweep", "pool_size", "queue_type", "machine"} {
		require.Contains(t, doc, k)
	}
	for _, p := range []string{"engine", "baseline", "group_baseline"} {
		row := doc[p].(map[string]any)
		for _, k := range []string{"sagas_per_s", "cpu_us_per_saga", "cpu_us_per_saga_pg", "cpu_us_per_saga_rabbitmq", "cpu_us_per_saga_go", "p50_ms", "p99_ms", "steal_pct"} {
			require.Contains(t, row, k, p)
		}
	}
	sweep := doc["sweep"].(map[string]any)
	for _, k := range []string{"duration_s", "repeat", "pipelines", "rates"} {
		require.Contains(t, sweep, k)
	}
	for _, k := range []string{"nproc", "go_version", "postgres_version", "rabbitmq_version"} {
		require.Contains(t, doc["machine"], k)
	}
}
