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
// against the real services and checks the report's structure, never a
// timing.
func TestSagaBenchSmoke(t *testing.T) {
	t.Parallel()
	dbtest.Pool(t) // creates the test database if needed
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := RunSagas(ctx, SagaConfig{
		DatabaseURL: dbtest.URL(), AMQPURL: amqptest.URL(t),
		Sagas: 50, Concurrency: 2, PoolSize: 4, Workers: 2,
		Rate: 50, Duration: 500 * time.Millisecond,
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
	}
	require.NotNil(t, rep.HalfLoad)
	require.Equal(t, 25, rep.HalfLoad.Sagas)
	require.NotNil(t, rep.HalfLoad.Baseline)
	require.NotNil(t, rep.HalfLoad.GroupBaseline)
	for name, lp := range map[string]LoadPoint{"engine": rep.HalfLoad.LoadPoint, "baseline": *rep.HalfLoad.Baseline, "group_baseline": *rep.HalfLoad.GroupBaseline} {
		require.Positive(t, lp.CPUMicros, "%s: the open loop's CPU per saga", name)
		require.InDelta(t, lp.CPUMicrosPostgres+lp.CPUMicrosRabbitMQ+lp.CPUMicrosGo, lp.CPUMicros, 0.2, name)
		require.LessOrEqual(t, lp.P50ms, lp.P99ms, name)
	}
	require.Equal(t, 4, rep.PoolSize)
	require.Equal(t, "quorum", rep.QueueType)

	out, err := json.Marshal(rep)
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(out, &doc))
	for _, k := range []string{"engine", "baseline", "group_baseline", "ratio", "ratio_group", "half_load", "pool_size", "queue_type", "machine"} {
		require.Contains(t, doc, k)
	}
	for _, p := range []string{"engine", "baseline", "group_baseline"} {
		row := doc[p].(map[string]any)
		for _, k := range []string{"sagas_per_s", "cpu_us_per_saga", "cpu_us_per_saga_pg", "cpu_us_per_saga_rabbitmq", "cpu_us_per_saga_go", "p50_ms", "p99_ms"} {
			require.Contains(t, row, k, p)
		}
	}
	for _, k := range []string{"rate", "p50_ms", "p99_ms"} {
		require.Contains(t, doc["half_load"], k)
	}
	for _, k := range []string{"nproc", "go_version", "postgres_version", "rabbitmq_version"} {
		require.Contains(t, doc["machine"], k)
	}
}
