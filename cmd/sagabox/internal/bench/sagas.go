package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/store"
)

// SagaReport is what RunSagas measured. Its JSON form is the --json output
// of `sagabox bench sagas`.
type SagaReport struct {
	// Engine, Baseline and GroupBaseline are the saturated runs of the
	// pipelines that ran.
	Engine        *PipelineReport `json:"engine,omitempty"`
	Baseline      *PipelineReport `json:"baseline,omitempty"`
	GroupBaseline *PipelineReport `json:"group_baseline,omitempty"`
	// Ratio is the engine's saturated rate over the baseline's; RatioGroup
	// over the group-commit baseline's. Zero when either did not run.
	Ratio      float64 `json:"ratio,omitempty"`
	RatioGroup float64 `json:"ratio_group,omitempty"`
	// Sweep is the open-loop runs: the latency sweep at Rates, or else
	// the one at half the engine's saturated rate after the saturated runs
	// (none when the engine did not run).
	Sweep *SweepReport `json:"sweep,omitempty"`
	// Replicas is the replicas measurement, one run per count of
	// orchestrator processes, when SagaConfig.Replicas asked for it.
	Replicas  []ReplicaRun `json:"replicas,omitempty"`
	PoolSize  int          `json:"pool_size"`
	QueueType string       `json:"queue_type"`
	Workers   int          `json:"workers"`
	// OrchestratorBatch and ParticipantBatch are the engine clients'
	// MaxBatch (group commit).
	OrchestratorBatch int `json:"orchestrator_batch"`
	ParticipantBatch  int `json:"participant_batch"`
	// LingerMS is the engine clients' BatchLinger, in milliseconds.
	LingerMS    float64 `json:"linger_ms"`
	Sagas       int     `json:"sagas"`
	Concurrency int     `json:"concurrency"`
	Machine     Machine `json:"machine"`
}

// PipelineReport is one pipeline's saturated run.
type PipelineReport struct {
	// Sagas is the number of sagas started and completed.
	Sagas int `json:"sagas"`
	// Seconds is the time from the first start to the last completion.
	Seconds     float64 `json:"seconds"`
	SagasPerSec float64 `json:"sagas_per_s"`
	// CPU time per saga in microseconds, in total and by side, over the
	// same interval.
	CPUMicros         float64 `json:"cpu_us_per_saga"`
	CPUMicrosPostgres float64 `json:"cpu_us_per_saga_pg"`
	CPUMicrosRabbitMQ float64 `json:"cpu_us_per_saga_rabbitmq"`
	CPUMicrosGo       float64 `json:"cpu_us_per_saga_go"`
	// StealPct is the host's CPU steal over the same interval, in percent
	// of all its CPU time: what a hypervisor gave other guests.
	StealPct float64 `json:"steal_pct"`
	// Start→completed of each saga.
	Latency
}

// Latency is a start→completed distribution in milliseconds.
type Latency struct {
	P50ms float64 `json:"p50_ms"`
	P99ms float64 `json:"p99_ms"`
	MaxMs float64 `json:"max_ms"`
}

// LoadPoint is one pipeline at a fixed start rate: its start→completed
// distribution, measured from each saga's scheduled start (a start that
// could not begin on time counts its delay), the CPU time per saga of
// PostgreSQL, RabbitMQ and this process over the run, and the host's CPU
// steal meanwhile. Below saturation deliveries come too far apart to be
// batched, so a saga costs more than in the saturated run: this is what the
// latency at that rate pays for.
type LoadPoint struct {
	Latency
	CPUMicros         float64 `json:"cpu_us_per_saga"`
	CPUMicrosPostgres float64 `json:"cpu_us_per_saga_pg"`
	CPUMicrosRabbitMQ float64 `json:"cpu_us_per_saga_rabbitmq"`
	CPUMicrosGo       float64 `json:"cpu_us_per_saga_go"`
	// StealPct is the host's CPU steal over the run, in percent of all its
	// CPU time.
	StealPct float64 `json:"steal_pct"`
}

// Machine says where the numbers were measured.
type Machine struct {
	NProc     int    `json:"nproc"`
	GoVersion string `json:"go_version"`
	OS        string `json:"os"`
	Arch      string `json:"arch"`
	Postgres  string `json:"postgres_version"`
	RabbitMQ  string `json:"rabbitmq_version"`
}

// pipeline is one running pipeline as the measurements see it.
type pipeline struct {
	name string
	pool *pgxpool.Pool
	// start starts one saga in its own transaction and returns its id.
	start func(ctx context.Context) (uuid.UUID, error)
	// countSQL counts the completed sagas; doneSQL returns id and
	// finished_at of each.
	countSQL, doneSQL string
	// errs reports failures of the pipeline's background loops and
	// processes.
	errs <-chan error
	// children are the PIDs of the pipeline's processes besides this one,
	// whose CPU time counts as the bench's (Go).
	children []int
	// close stops everything and drops what the pipeline created.
	close func()
}

// RunSagas measures three-step sagas end to end. By default it runs three
// pipelines one after the other, each with fresh schemas and queues:
// sagabox's engine, a hand-written baseline doing the same work with pgx and
// amqp091-go directly, and the baseline with group-commit consumers. For
// each it reports the saturated throughput, the CPU time per saga of
// PostgreSQL, RabbitMQ and this process, and the start→completed
// percentiles; then the latency of each in open-loop runs at half the
// engine's rate (a sweep of one rate). With cfg.Rates it runs only the
// sweep, at those rates; with cfg.Replicas only the replicas measurement.
func RunSagas(ctx context.Context, cfg SagaConfig) (*SagaReport, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("saga bench config: %w", err)
	}
	logf := func(format string, args ...any) {
		if cfg.Log != nil {
			fmt.Fprintf(cfg.Log, format+"\n", args...)
		}
	}
	rep := &SagaReport{
		PoolSize: cfg.PoolSize, QueueType: string(cfg.QueueType), Workers: cfg.Workers,
		OrchestratorBatch: orchestrator.DefaultMaxBatch, ParticipantBatch: cfg.ParticipantBatch,
		LingerMS: float64(cfg.Linger) / float64(time.Millisecond), Sagas: cfg.Sagas, Concurrency: cfg.Concurrency,
	}
	var err error
	if rep.Machine, err = readMachine(ctx, cfg); err != nil {
		return nil, err
	}
	switch {
	case len(cfg.Replicas) > 0:
		rep.Replicas, err = runReplicas(ctx, cfg, logf)
		return rep, err
	case len(cfg.Rates) > 0:
		rep.Sweep, err = runSweep(ctx, cfg, cfg.Rates, cfg.pipelines(), logf)
		return rep, err
	}

	// The saturated runs; the engine's rate sets the open-loop rate.
	for _, name := range cfg.pipelines() {
		err := withPipeline(ctx, cfg, name, pipelineOpener(name), logf, func(p *pipeline) error {
			r, err := saturate(ctx, cfg, p, logf)
			switch name {
			case PipelineEngine:
				rep.Engine = r
			case PipelineBaseline:
				rep.Baseline = r
			case PipelineGroup:
				rep.GroupBaseline = r
			}
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	if rep.Engine != nil && rep.Baseline != nil && rep.Baseline.SagasPerSec > 0 {
		rep.Ratio = round(rep.Engine.SagasPerSec/rep.Baseline.SagasPerSec, 3)
	}
	if rep.Engine != nil && rep.GroupBaseline != nil && rep.GroupBaseline.SagasPerSec > 0 {
		rep.RatioGroup = round(rep.Engine.SagasPerSec/rep.GroupBaseline.SagasPerSec, 3)
	}
	if rep.Engine != nil {
		half := max(0.1, round(rep.Engine.SagasPerSec/2, 1))
		if rep.Sweep, err = runSweep(ctx, cfg, []float64{half}, cfg.pipelines(), logf); err != nil {
			return nil, err
		}
	}
	return rep, nil
}

// pipelineOpener returns the function that opens the pipeline called name.
func pipelineOpener(name string) func(context.Context, SagaConfig) (*pipeline, error) {
	switch name {
	case PipelineBaseline:
		return func(ctx context.Context, cfg SagaConfig) (*pipeline, error) { return openBaseline(ctx, cfg, false) }
	case PipelineGroup:
		return func(ctx context.Context, cfg SagaConfig) (*pipeline, error) { return openBaseline(ctx, cfg, true) }
	}
	return func(ctx context.Context, cfg SagaConfig) (*pipeline, error) { return openEngine(ctx, cfg, 0) }
}

// withPipeline opens a pipeline with open, warms it up and runs fn on it,
// and closes it whatever happens. name is the pipeline's in messages.
func withPipeline(ctx context.Context, cfg SagaConfig, name string, open func(context.Context, SagaConfig) (*pipeline, error), logf func(string, ...any), fn func(*pipeline) error) error {
	logf("%s: setting up", name)
	p, err := open(ctx, cfg)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	defer p.close()
	if err := warmUp(ctx, cfg, p); err != nil {
		return fmt.Errorf("%s: warm up: %w", name, err)
	}
	if err := fn(p); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// warmUp runs a few sagas to the end so that the measurement starts with
// declared queues, consumers attached and pooled connections open with
// their statements prepared.
func warmUp(ctx context.Context, cfg SagaConfig, p *pipeline) error {
	n := 2 * cfg.Concurrency
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { _, errs[i] = p.start(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return waitCompleted(ctx, p, int64(n))
}

// saturate starts cfg.Sagas sagas from cfg.Concurrency goroutines as fast
// as they go and measures the time until all completed and the CPU spent
// meanwhile.
func saturate(ctx context.Context, cfg SagaConfig, p *pipeline, logf func(string, ...any)) (*PipelineReport, error) {
	n := cfg.Sagas
	logf("%s: %d sagas from %d goroutines", p.name, n, cfg.Concurrency)
	base, err := countCompleted(ctx, p)
	if err != nil {
		return nil, err
	}
	ids := make([]uuid.UUID, n)
	startedAt := make([]time.Time, n)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	u0, err := readUsage(p)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	for w := range cfg.Concurrency {
		wg.Go(func() {
			for i := w; i < n && sctx.Err() == nil; i += cfg.Concurrency {
				startedAt[i] = time.Now()
				id, err := p.start(sctx)
				if err != nil {
					once.Do(func() { firstErr = err; cancel() })
					return
				}
				ids[i] = id
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	if err := waitCompleted(ctx, p, base+int64(n)); err != nil {
		return nil, err
	}
	elapsed := time.Since(t0)
	u1, err := readUsage(p)
	if err != nil {
		return nil, err
	}
	lat, err := latencies(ctx, p, ids, startedAt)
	if err != nil {
		return nil, err
	}
	pg, rmq, goCPU, steal := u1.spent(u0, n)
	r := &PipelineReport{
		Sagas: n, Seconds: round(elapsed.Seconds(), 3), SagasPerSec: round(float64(n)/elapsed.Seconds(), 1),
		CPUMicrosPostgres: pg, CPUMicrosRabbitMQ: rmq, CPUMicrosGo: goCPU, StealPct: steal,
		Latency: lat,
	}
	r.CPUMicros = round(r.CPUMicrosPostgres+r.CPUMicrosRabbitMQ+r.CPUMicrosGo, 1)
	logf("%s: %.1f sagas/s, %.0f µs CPU per saga", p.name, r.SagasPerSec, r.CPUMicros)
	return r, nil
}

// openLoop starts sagas at rate for cfg.Duration, each at its scheduled
// time whether or not earlier ones completed, and returns the
// start→completed distribution measured from the scheduled starts (so that
// a start delayed by a busy pipeline counts its delay) with the CPU spent
// per saga and the host's steal until the last completed, and the number
// of sagas.
func openLoop(ctx context.Context, cfg SagaConfig, p *pipeline, rate float64) (LoadPoint, int, error) {
	if rate <= 0 || math.IsInf(rate, 0) {
		return LoadPoint{}, 0, fmt.Errorf("open loop rate %v: want a positive rate", rate)
	}
	total := max(1, int(rate*cfg.Duration.Seconds()))
	base, err := countCompleted(ctx, p)
	if err != nil {
		return LoadPoint{}, 0, err
	}
	u0, err := readUsage(p)
	if err != nil {
		return LoadPoint{}, 0, err
	}
	ids := make([]uuid.UUID, total)
	scheduled := make([]time.Time, total)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	t0 := time.Now()
	// Enough senders that a slow start does not hold up the next one.
	for range cfg.PoolSize {
		wg.Go(func() {
			timer := time.NewTimer(0)
			defer timer.Stop()
			for {
				i := int(next.Add(1) - 1)
				if i >= total {
					return
				}
				at := t0.Add(time.Duration(float64(i) / rate * float64(time.Second)))
				timer.Reset(time.Until(at))
				select {
				case <-sctx.Done():
					return
				case <-timer.C:
				}
				scheduled[i] = at
				id, err := p.start(sctx)
				if err != nil {
					once.Do(func() { firstErr = err; cancel() })
					return
				}
				ids[i] = id
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return LoadPoint{}, 0, firstErr
	}
	if err := ctx.Err(); err != nil {
		return LoadPoint{}, 0, err
	}
	if err := waitCompleted(ctx, p, base+int64(total)); err != nil {
		return LoadPoint{}, 0, err
	}
	u1, err := readUsage(p)
	if err != nil {
		return LoadPoint{}, 0, err
	}
	lat, err := latencies(ctx, p, ids, scheduled)
	if err != nil {
		return LoadPoint{}, 0, err
	}
	pg, rmq, goCPU, steal := u1.spent(u0, total)
	return LoadPoint{
		Latency: lat, CPUMicrosPostgres: pg, CPUMicrosRabbitMQ: rmq, CPUMicrosGo: goCPU,
		CPUMicros: round(pg+rmq+goCPU, 1), StealPct: steal,
	}, total, nil
}

// perSaga divides the CPU times used by n sagas, in microseconds.
func perSaga(used cpuTimes, n int) (pg, rmq, goCPU float64) {
	per := func(d time.Duration) float64 { return round(max(0, float64(d.Microseconds())/float64(n)), 1) }
	return per(used.Postgres), per(used.RabbitMQ), per(used.Go)
}

func countCompleted(ctx context.Context, p *pipeline) (int64, error) {
	var n int64
	if err := p.pool.QueryRow(ctx, p.countSQL).Scan(&n); err != nil {
		return 0, fmt.Errorf("count completed sagas: %w", err)
	}
	return n, nil
}

// stallTimeout is how long waitCompleted waits without any saga completing
// before it gives up.
const stallTimeout = time.Minute

// waitCompleted polls the count of completed sagas until it reaches
// target: every 5 ms at first, then every 1/200 of the time waited so far
// (at most 50 ms), so that the end of a run is seen within 0.5% of its
// length while the polls, each a scan of the saga table that the CPU
// figures include, stay few and nearly as many for a slow pipeline as for a
// fast one.
func waitCompleted(ctx context.Context, p *pipeline, target int64) error {
	t0 := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	last, progressAt := int64(-1), t0
	for {
		done, err := countCompleted(ctx, p)
		if err != nil {
			return err
		}
		if done >= target {
			return nil
		}
		if done > last {
			last, progressAt = done, time.Now()
		} else if time.Since(progressAt) > stallTimeout {
			return fmt.Errorf("%d of %d sagas completed, none in the last %s", done, target, stallTimeout)
		}
		timer.Reset(min(50*time.Millisecond, max(5*time.Millisecond, time.Since(t0)/200)))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-p.errs:
			return err
		case <-timer.C:
		}
	}
}

// latencies returns the distribution of finished_at − start of each saga
// in ids.
func latencies(ctx context.Context, p *pipeline, ids []uuid.UUID, started []time.Time) (Latency, error) {
	rows, err := p.pool.Query(ctx, p.doneSQL)
	if err != nil {
		return Latency{}, fmt.Errorf("read finished sagas: %w", err)
	}
	finished := map[uuid.UUID]time.Time{}
	var id uuid.UUID
	var at time.Time
	if _, err := pgx.ForEachRow(rows, []any{&id, &at}, func() error { finished[id] = at; return nil }); err != nil {
		return Latency{}, fmt.Errorf("read finished sagas: %w", err)
	}
	d := make([]time.Duration, len(ids))
	for i, id := range ids {
		at, ok := finished[id]
		if !ok {
			return Latency{}, fmt.Errorf("saga %s is not completed", id)
		}
		d[i] = at.Sub(started[i])
	}
	pc := percentiles(d)
	ms := func(d time.Duration) float64 { return round(float64(d)/float64(time.Millisecond), 3) }
	return Latency{P50ms: ms(pc.P50), P99ms: ms(pc.P99), MaxMs: ms(pc.Max)}, nil
}

func round(x float64, digits int) float64 {
	f := math.Pow10(digits)
	return math.Round(x*f) / f
}

// newPool opens a pool of exactly size connections at most.
func newPool(ctx context.Context, url string, size int) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("database url: %w", store.ExplainParseError(url, err))
	}
	pc.MaxConns = int32(size)
	pc.ConnConfig.RuntimeParams["application_name"] = "sagabox-bench"
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connect to postgres: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to postgres: %w", err)
	}
	return pool, nil
}

// dropSchema drops schema (best effort: the run is over).
func dropSchema(pool *pgxpool.Pool, schema string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _ = pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
}

// readMachine reads the CPU count, the Go version and the servers'
// versions (PostgreSQL's version(), RabbitMQ's AMQP server properties).
func readMachine(ctx context.Context, cfg SagaConfig) (Machine, error) {
	m := Machine{NProc: runtime.NumCPU(), GoVersion: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH}
	conn, err := pgx.Connect(ctx, cfg.DatabaseURL)
	if err != nil {
		return m, fmt.Errorf("connect to postgres: %w", store.ExplainParseError(cfg.DatabaseURL, err))
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if err := conn.QueryRow(ctx, "SELECT version()").Scan(&m.Postgres); err != nil {
		return m, fmt.Errorf("read postgres version: %w", err)
	}
	amqpConn, err := dialAMQP(cfg.AMQPURL, "sagabox-bench")
	if err != nil {
		return m, err
	}
	defer func() { _ = amqpConn.Close() }()
	m.RabbitMQ = fmt.Sprintf("%v %v", amqpConn.Properties["product"], amqpConn.Properties["version"])
	return m, nil
}

// Print writes the report as tables under the machine and setup lines:
// the saturated runs, the open-loop runs and the replicas, those that ran.
func (r *SagaReport) Print(w io.Writer) {
	m := r.Machine
	fmt.Fprintf(w, "machine: %d CPUs, %s %s/%s, %s, %s\n", m.NProc, m.GoVersion, m.OS, m.Arch, m.Postgres, m.RabbitMQ)
	fmt.Fprintf(w, "setup:   one pool of %d connections per pipeline (the engine's 3 clients share theirs); %s queues; %d workers per queue (group: %d consumers × up to %d per tx, %s linger)\n",
		r.PoolSize, r.QueueType, r.Workers, GroupConsumers, GroupMaxBatch, GroupLinger)
	if r.Engine != nil || r.Baseline != nil || r.GroupBaseline != nil || len(r.Replicas) > 0 {
		fmt.Fprintf(w, "         saturated runs: %d sagas from %d goroutines each\n", r.Sagas, r.Concurrency)
	}
	fmt.Fprintf(w, "engine:  orchestrator MaxBatch %d, participants MaxBatch %d (group commit; %s linger)\n",
		r.OrchestratorBatch, r.ParticipantBatch, time.Duration(r.LingerMS*float64(time.Millisecond)))
	if r.Engine != nil || r.Baseline != nil || r.GroupBaseline != nil {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "pipeline\tsagas/s\t× baseline\tCPU µs/saga PG\tRMQ\tGo\ttotal\tp50 ms\tp99 ms\tsteal %\t")
		for _, row := range []struct {
			name string
			p    *PipelineReport
		}{{"baseline (hand-written)", r.Baseline}, {"group-commit baseline", r.GroupBaseline}, {"sagabox engine", r.Engine}} {
			if row.p == nil {
				continue
			}
			ratio := "-"
			if r.Baseline != nil && r.Baseline.SagasPerSec > 0 {
				ratio = fmt.Sprintf("%.2f", row.p.SagasPerSec/r.Baseline.SagasPerSec)
			}
			fmt.Fprintf(tw, "%s\t%.0f\t%s\t%.0f\t%.0f\t%.0f\t%.0f\t%.1f\t%.1f\t%.1f\t\n", row.name, row.p.SagasPerSec, ratio,
				row.p.CPUMicrosPostgres, row.p.CPUMicrosRabbitMQ, row.p.CPUMicrosGo, row.p.CPUMicros, row.p.P50ms, row.p.P99ms, row.p.StealPct)
		}
		_ = tw.Flush()
	}
	if r.Ratio > 0 || r.RatioGroup > 0 {
		fmt.Fprintf(w, "\nengine / baseline: %.2f   engine / group-commit baseline: %.2f\n", r.Ratio, r.RatioGroup)
	}
	if r.Sweep != nil {
		fmt.Fprintln(w)
		title := "latency sweep"
		if r.Engine != nil {
			title = "half load (half the engine's saturated rate)"
		}
		r.Sweep.Print(w, title)
	}
	if len(r.Replicas) > 0 {
		fmt.Fprintln(w)
		printReplicas(w, r.Replicas)
	}
}
