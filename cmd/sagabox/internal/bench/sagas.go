package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/participant"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

// SagaConfig configures RunSagas.
type SagaConfig struct {
	// DatabaseURL and AMQPURL locate the services.
	DatabaseURL, AMQPURL string
	// Sagas is the number of sagas started.
	Sagas int
	// Concurrency is the number of goroutines starting sagas.
	Concurrency int
	// Log receives progress lines.
	Log io.Writer
}

// SagaReport is what RunSagas measured.
type SagaReport struct {
	// RawCommitPerSec is the single-row commit rate of the database, from 16
	// writers: the baseline.
	RawCommitPerSec float64
	// TxPerSaga is the number of local transactions one saga takes.
	TxPerSaga int
	// SagasPerSec is the rate at which sagas completed.
	SagasPerSec float64
	// Duration is the start→completed time of each saga.
	Duration Percentiles
}

type benchData struct {
	N int `json:"n"`
}

var (
	benchStep1 = saga.NewCommand[benchData, saga.None]("bench.one")
	benchStep2 = saga.NewCommand[benchData, saga.None]("bench.two")
	benchStep3 = saga.NewCommand[benchData, saga.None]("bench.three")
	benchUndo  = saga.NewCommand[benchData, saga.None]("bench.undo")
)

// RunSagas measures end-to-end throughput of a three-step saga (an
// orchestrator and two participants in this process, each with its own
// schema), against the database's raw commit rate measured in the same run.
func RunSagas(ctx context.Context, cfg SagaConfig) (*SagaReport, error) {
	logf := func(format string, args ...any) {
		if cfg.Log != nil {
			fmt.Fprintf(cfg.Log, format+"\n", args...)
		}
	}
	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("connect to postgres: %w", err)
	}
	defer pool.Close()
	suffix := uuid.NewString()[:8]
	stores := map[string]*store.Store{}
	for _, name := range []string{"orch", "alpha", "beta"} {
		schema := "bench_" + name + "_" + suffix
		st, err := store.New(pool, schema)
		if err != nil {
			return nil, err
		}
		defer pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE") //nolint:errcheck // best-effort cleanup
		if _, err := st.MigrateUp(ctx); err != nil {
			return nil, err
		}
		stores[name] = st
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	broker, err := rabbitmq.New(ctx, rabbitmq.Config{URL: cfg.AMQPURL, Namespace: "sagabox-bench-" + suffix, ConnectionName: "sagabox-bench", Logger: quiet})
	if err != nil {
		return nil, err
	}
	defer func() { _ = broker.Close() }()

	rep := &SagaReport{TxPerSaga: 7} // start + 3 × (participant + reply)
	logf("raw commits: 16 writers for 3s")
	if rep.RawCommitPerSec, err = rawCommits(ctx, pool, stores["orch"], 16, 3*time.Second); err != nil {
		return nil, err
	}

	def := saga.MustNew("bench", 1,
		saga.Step("one", saga.Invoke(benchStep1, func(d *benchData) benchData { return *d }, nil),
			saga.Compensate(benchUndo, func(d *benchData) benchData { return *d })),
		saga.Step("two", saga.Invoke(benchStep2, func(d *benchData) benchData { return *d }, nil)),
		saga.Step("three", saga.Invoke(benchStep3, func(d *benchData) benchData { return *d }, nil)),
	)
	orch, err := orchestrator.NewClient(orchestrator.Config{
		Pool: pool, Schema: stores["orch"].Schema(), Service: "orch", Broker: broker,
		Definitions: []saga.Runner{def}, Workers: 8, Logger: quiet,
	})
	if err != nil {
		return nil, err
	}
	ok := func(context.Context, pgx.Tx, *participant.Request[benchData]) (saga.None, error) {
		return saga.None{}, nil
	}
	alpha, err := participant.NewClient(participant.Config{Pool: pool, Schema: stores["alpha"].Schema(), Service: "alpha", Broker: broker, Workers: 8, Logger: quiet})
	if err != nil {
		return nil, err
	}
	participant.HandleCommand(alpha, benchStep1, ok)
	participant.HandleCommand(alpha, benchStep3, ok)
	participant.HandleCompensation(alpha, benchUndo, func(context.Context, pgx.Tx, *participant.Request[benchData]) error { return nil })
	beta, err := participant.NewClient(participant.Config{Pool: pool, Schema: stores["beta"].Schema(), Service: "beta", Broker: broker, Workers: 8, Logger: quiet})
	if err != nil {
		return nil, err
	}
	participant.HandleCommand(beta, benchStep2, ok)

	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for _, r := range []interface{ Run(context.Context) error }{orch, alpha, beta} {
		wg.Go(func() {
			if err := r.Run(runCtx); err != nil {
				errs <- err
			}
		})
	}
	defer func() { stop(); wg.Wait() }()
	// The warm-up saga completes once every queue is declared and every
	// connection is open.
	if err := warmUp(ctx, pool, orch, def); err != nil {
		return nil, err
	}

	logf("sagas: %d, started from %d goroutines", cfg.Sagas, cfg.Concurrency)
	ids := make([]uuid.UUID, cfg.Sagas)
	start := time.Now()
	var sg sync.WaitGroup
	var startErr error
	var mu sync.Mutex
	for w := range cfg.Concurrency {
		sg.Go(func() {
			for i := w; i < cfg.Sagas; i += cfg.Concurrency {
				id, err := startOne(ctx, pool, orch, def, i)
				if err != nil {
					mu.Lock()
					startErr = err
					mu.Unlock()
					return
				}
				ids[i] = id
			}
		})
	}
	sg.Wait()
	if startErr != nil {
		return nil, startErr
	}
	if err := waitCompleted(ctx, stores["orch"], cfg.Sagas, 10*time.Minute, errs); err != nil {
		return nil, err
	}
	rep.SagasPerSec = float64(cfg.Sagas) / time.Since(start).Seconds()
	durations := make([]time.Duration, 0, len(ids))
	for _, id := range ids {
		s, err := orch.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		durations = append(durations, s.FinishedAt.Sub(s.CreatedAt))
	}
	slices.Sort(durations)
	rep.Duration = percentiles(durations)
	return rep, nil
}

func startOne(ctx context.Context, pool *pgxpool.Pool, orch *orchestrator.Client, def *saga.Definition[benchData], n int) (uuid.UUID, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return uuid.Nil, err
	}
	defer tx.Rollback(ctx)
	started, err := orchestrator.Start(ctx, orch, tx, def, benchData{N: n}, nil)
	if err != nil {
		return uuid.Nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return uuid.Nil, err
	}
	orch.Wake()
	return started.ID, nil
}

// warmUp runs one saga to the end so that the measurement starts with
// declared queues and warm connections.
func warmUp(ctx context.Context, pool *pgxpool.Pool, orch *orchestrator.Client, def *saga.Definition[benchData]) error {
	id, err := startOne(ctx, pool, orch, def, -1)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		s, err := orch.Get(ctx, id)
		if err != nil {
			return err
		}
		if s.Status.Terminal() {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("warm-up saga %s did not finish", id)
}

func waitCompleted(ctx context.Context, st *store.Store, n int, timeout time.Duration, errs <-chan error) error {
	deadline := time.Now().Add(timeout)
	for {
		counts, err := st.Executor().SagaCounts(ctx)
		if err != nil {
			return err
		}
		var done int64
		for _, c := range counts {
			if c.Status == string(saga.StatusCompleted) {
				done += c.Count
			}
		}
		if done >= int64(n)+1 { // the warm-up saga too
			return nil
		}
		select {
		case err := <-errs:
			return err
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d sagas completed within %s", done-1, n, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// rawCommits measures single-row outbox insert commits from writers.
func rawCommits(ctx context.Context, pool *pgxpool.Pool, st *store.Store, writers int, d time.Duration) (float64, error) {
	var mu sync.Mutex
	commits := 0
	cctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			for cctx.Err() == nil {
				if err := pgx.BeginFunc(cctx, pool, func(tx pgx.Tx) error {
					return st.Executor().OutboxWrite(cctx, tx, []message.Message{benchMessage(0)})
				}); err == nil {
					mu.Lock()
					commits++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	_, err := pool.Exec(ctx, fmt.Sprintf("TRUNCATE %s.sagabox_outbox", pgx.Identifier{st.Schema()}.Sanitize()))
	return float64(commits) / d.Seconds(), err
}

// Print writes the report with the saga rate as a ratio of its ceiling.
func (r *SagaReport) Print(w io.Writer) {
	ceiling := r.RawCommitPerSec / float64(r.TxPerSaga)
	fmt.Fprintf(w, "raw single-row insert commits          : %8.0f tx/s (baseline)\n", r.RawCommitPerSec)
	fmt.Fprintf(w, "ceiling at %d transactions per saga      : %8.0f sagas/s\n", r.TxPerSaga, ceiling)
	fmt.Fprintf(w, "three-step sagas completed              : %8.0f sagas/s = %.2f × ceiling\n", r.SagasPerSec, r.SagasPerSec/ceiling)
	fmt.Fprintf(w, "saga start→completed                    : p50 %v  p99 %v  max %v  (n=%d)\n",
		r.Duration.P50.Round(100*time.Microsecond), r.Duration.P99.Round(100*time.Microsecond), r.Duration.Max.Round(100*time.Microsecond), r.Duration.N)
}
