package bench

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMedian(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		xs   []float64
		want float64
	}{
		{"none", nil, 0},
		{"one", []float64{7}, 7},
		{"odd, unsorted", []float64{30, 10, 20}, 20},
		{"even: mean of the middle two", []float64{4, 1, 3, 2}, 2.5},
		{"an outlier does not move it", []float64{10, 11, 1000}, 11},
	} {
		xs := append([]float64(nil), tc.xs...)
		require.InDelta(t, tc.want, median(tc.xs), 1e-9, tc.name)
		require.Equal(t, xs, tc.xs, "%s: median leaves its input as it was", tc.name)
	}
}

// Each field of the medians is the median of that field alone.
func TestMedianLoadTakesEachFieldsMedian(t *testing.T) {
	t.Parallel()
	runs := []LoadPoint{
		{Latency: Latency{P50ms: 10, P99ms: 90, MaxMs: 100}, CPUMicros: 600, CPUMicrosPostgres: 300, CPUMicrosRabbitMQ: 200, CPUMicrosGo: 100, StealPct: 1},
		{Latency: Latency{P50ms: 30, P99ms: 70, MaxMs: 300}, CPUMicros: 400, CPUMicrosPostgres: 100, CPUMicrosRabbitMQ: 100, CPUMicrosGo: 200, StealPct: 50},
		{Latency: Latency{P50ms: 20, P99ms: 80, MaxMs: 200}, CPUMicros: 500, CPUMicrosPostgres: 200, CPUMicrosRabbitMQ: 300, CPUMicrosGo: 300, StealPct: 2},
	}
	require.Equal(t, LoadPoint{
		Latency: Latency{P50ms: 20, P99ms: 80, MaxMs: 200}, CPUMicros: 500, CPUMicrosPostgres: 200, CPUMicrosRabbitMQ: 200, CPUMicrosGo: 200, StealPct: 2,
	}, medianLoad(runs))
}

func TestRatePointSummarize(t *testing.T) {
	t.Parallel()
	run := func(p string, r int, p50, p99 float64) LoadRun {
		return LoadRun{Pipeline: p, Repeat: r, Sagas: 10, LoadPoint: LoadPoint{Latency: Latency{P50ms: p50, P99ms: p99}}}
	}
	pt := RatePoint{Rate: 50, Runs: []LoadRun{
		run(PipelineEngine, 1, 60, 130), run(PipelineBaseline, 1, 30, 100),
		run(PipelineEngine, 2, 50, 120), run(PipelineBaseline, 2, 20, 200),
		run(PipelineEngine, 3, 40, 110), run(PipelineBaseline, 3, 25, 80),
	}}
	pt.summarize()
	require.Equal(t, 50.0, pt.Engine.P50ms)
	require.Equal(t, 120.0, pt.Engine.P99ms)
	require.Equal(t, 25.0, pt.Baseline.P50ms)
	require.Equal(t, 100.0, pt.Baseline.P99ms)
	require.Nil(t, pt.GroupBaseline, "no run, no medians")
	require.Equal(t, 2.0, pt.RatioP50, "engine ÷ baseline of the medians")
	require.Equal(t, 1.2, pt.RatioP99)

	only := RatePoint{Rate: 50, Runs: []LoadRun{run(PipelineEngine, 1, 60, 130)}}
	only.summarize()
	require.Zero(t, only.RatioP50, "no ratio without the baseline")
	require.Zero(t, only.RatioP99)
}

func TestSweepPrint(t *testing.T) {
	t.Parallel()
	pt := RatePoint{Rate: 50, Runs: []LoadRun{
		{Pipeline: PipelineEngine, Repeat: 1, LoadPoint: LoadPoint{Latency: Latency{P50ms: 60, P99ms: 120}, StealPct: 31.5}},
		{Pipeline: PipelineBaseline, Repeat: 1, LoadPoint: LoadPoint{Latency: Latency{P50ms: 30, P99ms: 100}, StealPct: 44}},
		{Pipeline: PipelineEngine, Repeat: 2, LoadPoint: LoadPoint{Latency: Latency{P50ms: 60, P99ms: 120}, StealPct: 2.25}},
		{Pipeline: PipelineBaseline, Repeat: 2, LoadPoint: LoadPoint{Latency: Latency{P50ms: 30, P99ms: 100}, StealPct: 0}},
	}}
	pt.summarize()
	var out bytes.Buffer
	(&SweepReport{Seconds: 10, Repeat: 2, Pipelines: []string{PipelineEngine, PipelineBaseline}, Rates: []RatePoint{pt}}).Print(&out, "latency sweep")
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 5, out.String())
	require.Contains(t, lines[0], "latency sweep: open loop, 10s per run, 2 run(s)")
	require.Contains(t, lines[1], "steal % per run")
	require.Regexp(t, `50\.0\s+baseline\s+30\.0\s+100\.0 .* 44\.0 0\.0$`, lines[2])
	require.Regexp(t, `50\.0\s+sagabox engine\s+60\.0\s+120\.0 .* 31\.5 2\.2$`, lines[3])
	require.Regexp(t, `50\.0\s+engine ÷ baseline\s+2\.00\s+1\.20`, lines[4])
}

func TestSagaConfigPipelines(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  SagaConfig
		want []string
	}{
		{"default: all three", SagaConfig{}, []string{PipelineEngine, PipelineBaseline, PipelineGroup}},
		{"sweep: engine and baseline", SagaConfig{Rates: []float64{50}}, []string{PipelineEngine, PipelineBaseline}},
		{"only, in run order", SagaConfig{Only: []string{PipelineGroup, PipelineEngine}}, []string{PipelineEngine, PipelineGroup}},
		{"a sweep of the group baseline", SagaConfig{Rates: []float64{50}, Only: []string{PipelineGroup}}, []string{PipelineGroup}},
	} {
		require.Equal(t, tc.want, tc.cfg.pipelines(), tc.name)
	}
}

func TestSagaConfigValidate(t *testing.T) {
	t.Parallel()
	valid := SagaConfig{DatabaseURL: "postgres://x"}
	require.NoError(t, valid.WithDefaults().Validate())
	replicas := func(n ...int) func(*SagaConfig) {
		return func(c *SagaConfig) { c.Replicas, c.ReplicaCommand = n, []string{"sagabox"} }
	}
	for _, tc := range []struct {
		name  string
		edit  func(*SagaConfig)
		field string
	}{
		{"a zero rate", func(c *SagaConfig) { c.Rates = []float64{50, 0} }, "Rates"},
		{"a negative rate", func(c *SagaConfig) { c.Rates = []float64{-5} }, "Rates"},
		{"repeat past 100", func(c *SagaConfig) { c.Repeat = 101 }, "Repeat"},
		{"an unknown pipeline", func(c *SagaConfig) { c.Only = []string{"nope"} }, `Only "nope"`},
		{"no replicas", replicas(0), "Replicas"},
		{"too many replicas", replicas(1, MaxReplicas+1), "Replicas"},
		{"replicas without a command", func(c *SagaConfig) { c.Replicas = []int{1} }, "ReplicaCommand"},
		{"replicas and rates", func(c *SagaConfig) { replicas(1)(c); c.Rates = []float64{50} }, "Rates and Replicas"},
		{"replicas and only", func(c *SagaConfig) { replicas(1)(c); c.Only = []string{PipelineEngine} }, "Only"},
	} {
		cfg := valid
		tc.edit(&cfg)
		err := cfg.WithDefaults().Validate()
		require.Error(t, err, tc.name)
		require.Contains(t, err.Error(), tc.field, tc.name)
	}
}
