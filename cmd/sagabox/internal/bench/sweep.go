package bench

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// SweepReport is the open-loop runs of a latency sweep: at each rate, Repeat
// runs of each pipeline, alternating, each on fresh schemas and queues.
type SweepReport struct {
	// Seconds is how long each run started sagas.
	Seconds float64 `json:"duration_s"`
	// Repeat is how many runs each pipeline had at each rate.
	Repeat int `json:"repeat"`
	// Pipelines are the pipelines in the order they ran at each repeat.
	Pipelines []string `json:"pipelines"`
	// Rates holds one entry per rate, in the order they ran.
	Rates []RatePoint `json:"rates"`
}

// RatePoint is every pipeline at one start rate: each run, and per
// pipeline the medians over its runs.
type RatePoint struct {
	// Rate is the start rate in sagas per second.
	Rate float64 `json:"rate"`
	// Engine, Baseline and GroupBaseline are the medians over the runs of
	// the pipelines that ran, each field the median of its own.
	Engine        *LoadPoint `json:"engine,omitempty"`
	Baseline      *LoadPoint `json:"baseline,omitempty"`
	GroupBaseline *LoadPoint `json:"group_baseline,omitempty"`
	// RatioP50 and RatioP99 are the engine's median p50 and p99 over the
	// baseline's; zero when either did not run.
	RatioP50 float64 `json:"ratio_p50,omitempty"`
	RatioP99 float64 `json:"ratio_p99,omitempty"`
	// Runs is every run, in the order they ran.
	Runs []LoadRun `json:"runs"`
}

// LoadRun is one open-loop run of one pipeline.
type LoadRun struct {
	Pipeline string `json:"pipeline"`
	// Repeat counts the pipeline's runs at this rate, from 1.
	Repeat int `json:"repeat"`
	// Sagas is how many sagas were started, and completed.
	Sagas int `json:"sagas"`
	LoadPoint
}

// runSweep runs the open-loop runs at each of rates: cfg.Repeat times each
// of names (pipelines, in that order), each on a pipeline of its own,
// opened, warmed up and closed around it.
func runSweep(ctx context.Context, cfg SagaConfig, rates []float64, names []string, logf func(string, ...any)) (*SweepReport, error) {
	rep := &SweepReport{Seconds: cfg.Duration.Seconds(), Repeat: cfg.Repeat, Pipelines: names}
	for _, rate := range rates {
		pt := RatePoint{Rate: rate}
		for r := 1; r <= cfg.Repeat; r++ {
			for _, name := range names {
				run := LoadRun{Pipeline: name, Repeat: r}
				err := withPipeline(ctx, cfg, name, pipelineOpener(name), logf, func(p *pipeline) error {
					logf("%s: open loop at %.1f sagas/s for %s (run %d of %d)", name, rate, cfg.Duration, r, cfg.Repeat)
					var err error
					run.LoadPoint, run.Sagas, err = openLoop(ctx, cfg, p, rate)
					return err
				})
				if err != nil {
					return nil, fmt.Errorf("open loop at %v sagas/s: %w", rate, err)
				}
				logf("%s: p50 %.1f ms, p99 %.1f ms, %.0f µs CPU per saga, %.1f %% steal", name, run.P50ms, run.P99ms, run.CPUMicros, run.StealPct)
				pt.Runs = append(pt.Runs, run)
			}
		}
		pt.summarize()
		rep.Rates = append(rep.Rates, pt)
	}
	return rep, nil
}

// summarize sets the medians of each pipeline's runs and the ratios.
func (pt *RatePoint) summarize() {
	of := func(name string) *LoadPoint {
		var runs []LoadPoint
		for _, r := range pt.Runs {
			if r.Pipeline == name {
				runs = append(runs, r.LoadPoint)
			}
		}
		if len(runs) == 0 {
			return nil
		}
		m := medianLoad(runs)
		return &m
	}
	pt.Engine, pt.Baseline, pt.GroupBaseline = of(PipelineEngine), of(PipelineBaseline), of(PipelineGroup)
	if pt.Engine != nil && pt.Baseline != nil {
		if pt.Baseline.P50ms > 0 {
			pt.RatioP50 = round(pt.Engine.P50ms/pt.Baseline.P50ms, 3)
		}
		if pt.Baseline.P99ms > 0 {
			pt.RatioP99 = round(pt.Engine.P99ms/pt.Baseline.P99ms, 3)
		}
	}
}

// medianLoad returns the median of each field of runs (at least one).
func medianLoad(runs []LoadPoint) LoadPoint {
	m := func(field func(LoadPoint) float64) float64 {
		xs := make([]float64, len(runs))
		for i, r := range runs {
			xs[i] = field(r)
		}
		return round(median(xs), 3)
	}
	return LoadPoint{
		Latency: Latency{
			P50ms: m(func(p LoadPoint) float64 { return p.P50ms }),
			P99ms: m(func(p LoadPoint) float64 { return p.P99ms }),
			MaxMs: m(func(p LoadPoint) float64 { return p.MaxMs }),
		},
		CPUMicros:         m(func(p LoadPoint) float64 { return p.CPUMicros }),
		CPUMicrosPostgres: m(func(p LoadPoint) float64 { return p.CPUMicrosPostgres }),
		CPUMicrosRabbitMQ: m(func(p LoadPoint) float64 { return p.CPUMicrosRabbitMQ }),
		CPUMicrosGo:       m(func(p LoadPoint) float64 { return p.CPUMicrosGo }),
		StealPct:          m(func(p LoadPoint) float64 { return p.StealPct }),
	}
}

// median returns the median of xs: the middle value, or the mean of the two
// middle values of an even count; 0 for none. xs is left as it was.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	mid := len(s) / 2
	if len(s)%2 == 1 {
		return s[mid]
	}
	return (s[mid-1] + s[mid]) / 2
}

// Print writes the sweep as a table under title: per rate, each
// pipeline's medians and the host's steal in each of its runs, then the
// engine's p50 and p99 as ratios of the baseline's.
func (s *SweepReport) Print(w io.Writer, title string) {
	fmt.Fprintf(w, "%s: open loop, %s per run, %d run(s) of each pipeline per rate, alternating, each on fresh schemas and queues; medians over the runs\n",
		title, time.Duration(s.Seconds*float64(time.Second)), s.Repeat)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "sagas/s\tpipeline\tp50 ms\tp99 ms\tCPU µs/saga PG\tRMQ\tGo\ttotal\tsteal % per run\t")
	for _, pt := range s.Rates {
		for _, row := range []struct {
			name, label string
			m           *LoadPoint
		}{{PipelineBaseline, "baseline", pt.Baseline}, {PipelineGroup, "group-commit baseline", pt.GroupBaseline}, {PipelineEngine, "sagabox engine", pt.Engine}} {
			if row.m == nil {
				continue
			}
			var steal []string
			for _, r := range pt.Runs {
				if r.Pipeline == row.name {
					steal = append(steal, fmt.Sprintf("%.1f", r.StealPct))
				}
			}
			fmt.Fprintf(tw, "%.1f\t%s\t%.1f\t%.1f\t%.0f\t%.0f\t%.0f\t%.0f\t%s\t\n", pt.Rate, row.label,
				row.m.P50ms, row.m.P99ms, row.m.CPUMicrosPostgres, row.m.CPUMicrosRabbitMQ, row.m.CPUMicrosGo, row.m.CPUMicros, strings.Join(steal, " "))
		}
		if pt.RatioP50 > 0 || pt.RatioP99 > 0 {
			fmt.Fprintf(tw, "%.1f\tengine ÷ baseline\t%.2f\t%.2f\t\t\t\t\t\t\n", pt.Rate, pt.RatioP50, pt.RatioP99)
		}
	}
	_ = tw.Flush()
}
