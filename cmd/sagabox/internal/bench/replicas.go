package bench

// The replicas measurement: the engine saturated with its orchestrator in
// 1, 2, 3… processes of their own on one database, to show whether
// orchestrator replicas add throughput or only availability. The
// participants and the load generator stay in the bench's process; each
// replica is the sagabox binary itself (`sagabox bench orchestrator-replica`,
// RunOrchestratorReplica), started with os/exec and stopped by its PID.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

// MaxReplicas is the most orchestrator processes SagaConfig.Replicas may
// ask for in one run.
const MaxReplicas = 16

const (
	// replicaStopTimeout is each replica's orchestrator.Config.StopTimeout:
	// at the end of a run nothing is in flight any more.
	replicaStopTimeout = 5 * time.Second
	// replicaKillAfter is how long a replica has to exit after SIGTERM
	// before it is killed.
	replicaKillAfter = replicaStopTimeout + 10*time.Second
	// replicaStartTimeout bounds the wait for every replica to consume.
	replicaStartTimeout = time.Minute
	// stderrTail is how much of a replica's stderr is kept for its error.
	stderrTail = 16 << 10
)

// ReplicaRun is the engine saturated with its orchestrator in Replicas
// processes.
type ReplicaRun struct {
	// Replicas is the number of orchestrator processes.
	Replicas int `json:"replicas"`
	// RatioToOne is SagasPerSec over the one-replica run's; zero when
	// that did not run.
	RatioToOne float64 `json:"ratio_to_one_replica,omitempty"`
	// The saturated run; its CPU time of Go is this process's (the
	// participants and the load generator) and the replicas'.
	PipelineReport
}

// ReplicaSpec is what one orchestrator replica runs: the parent writes it
// as JSON on the replica's stdin, never on its command line, where every
// user of the machine could read the database URL's password.
type ReplicaSpec struct {
	DatabaseURL string        `json:"database_url"`
	AMQPURL     string        `json:"amqp_url"`
	Schema      string        `json:"schema"`
	Namespace   string        `json:"namespace"`
	QueueType   string        `json:"queue_type"`
	PoolSize    int           `json:"pool_size"`
	Workers     int           `json:"workers"`
	Linger      time.Duration `json:"linger"`
	MaxRunning  int           `json:"max_running"`
}

// runReplicas measures the engine saturated with each count of
// orchestrator processes in cfg.Replicas, each on fresh schemas and queues.
func runReplicas(ctx context.Context, cfg SagaConfig, logf func(string, ...any)) ([]ReplicaRun, error) {
	var runs []ReplicaRun
	for _, n := range cfg.Replicas {
		name := replicasName(n)
		open := func(ctx context.Context, cfg SagaConfig) (*pipeline, error) { return openEngine(ctx, cfg, n) }
		err := withPipeline(ctx, cfg, name, open, logf, func(p *pipeline) error {
			r, err := saturate(ctx, cfg, p, logf)
			if err != nil {
				return err
			}
			runs = append(runs, ReplicaRun{Replicas: n, PipelineReport: *r})
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	for _, one := range runs {
		if one.Replicas != 1 || one.SagasPerSec <= 0 {
			continue
		}
		for i := range runs {
			runs[i].RatioToOne = round(runs[i].SagasPerSec/one.SagasPerSec, 3)
		}
		break
	}
	return runs, nil
}

// replicasName names the engine pipeline with n orchestrator processes.
func replicasName(n int) string {
	if n == 1 {
		return "engine with 1 orchestrator process"
	}
	return fmt.Sprintf("engine with %d orchestrator processes", n)
}

// printReplicas writes the replicas measurement as a table.
func printReplicas(w io.Writer, runs []ReplicaRun) {
	fmt.Fprintln(w, "orchestrator replicas: the engine saturated, its orchestrator in N processes (each with its own pool) on one database; participants and starts in the bench's process (Go CPU: it and the replicas)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "replicas\tsagas/s\t× 1 replica\tCPU µs/saga PG\tRMQ\tGo\ttotal\tp50 ms\tp99 ms\tsteal %\t")
	for _, r := range runs {
		ratio := "-"
		if r.RatioToOne > 0 {
			ratio = fmt.Sprintf("%.2f", r.RatioToOne)
		}
		fmt.Fprintf(tw, "%d\t%.0f\t%s\t%.0f\t%.0f\t%.0f\t%.0f\t%.1f\t%.1f\t%.1f\t\n", r.Replicas, r.SagasPerSec, ratio,
			r.CPUMicrosPostgres, r.CPUMicrosRabbitMQ, r.CPUMicrosGo, r.CPUMicros, r.P50ms, r.P99ms, r.StealPct)
	}
	_ = tw.Flush()
}

// replicaSet is the running replica processes of one pipeline.
type replicaSet struct {
	procs    []*replicaProc
	stopping atomic.Bool
}

type replicaProc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr *tailBuffer
	// done is closed once the process has exited and been waited for.
	done chan struct{}
}

// startReplicas starts n processes of command, each given spec on its
// stdin. A process that exits before stop is called sends an error with
// the end of its stderr to errs (without blocking: one is enough).
func startReplicas(ctx context.Context, command []string, spec ReplicaSpec, n int, errs chan<- error) (_ *replicaSet, err error) {
	set := &replicaSet{}
	defer func() {
		if err != nil {
			set.stop()
		}
	}()
	body, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("encode the replica spec: %w", err)
	}
	for i := range n {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		cmd := exec.Command(command[0], command[1:]...) //nolint:gosec // the bench's own binary, from its config
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return nil, fmt.Errorf("orchestrator replica %d: %w", i+1, err)
		}
		p := &replicaProc{cmd: cmd, stdin: stdin, stderr: &tailBuffer{max: stderrTail}, done: make(chan struct{})}
		cmd.Stderr = p.stderr
		if err := cmd.Start(); err != nil {
			_ = stdin.Close()
			return nil, fmt.Errorf("start orchestrator replica %d (%s): %w", i+1, command[0], err)
		}
		set.procs = append(set.procs, p)
		go func() {
			defer close(p.done)
			err := cmd.Wait()
			if set.stopping.Load() {
				return
			}
			if err == nil {
				err = errors.New("exit status 0")
			}
			select {
			case errs <- fmt.Errorf("orchestrator replica %d of %d (pid %d) exited: %w; its stderr:\n%s", i+1, n, cmd.Process.Pid, err, p.stderr.String()):
			default:
			}
		}()
		// The replica holds stdin open after the spec: its end stops it.
		if _, err := stdin.Write(append(body, '\n')); err != nil {
			// It has exited, or is about to: say why, if it said.
			select {
			case <-p.done:
			case <-time.After(5 * time.Second):
			}
			return nil, fmt.Errorf("send orchestrator replica %d (pid %d) its spec: %w; its stderr:\n%s", i+1, cmd.Process.Pid, err, p.stderr.String())
		}
	}
	return set, nil
}

// pids returns the replicas' process ids.
func (s *replicaSet) pids() []int {
	out := make([]int, len(s.procs))
	for i, p := range s.procs {
		out[i] = p.cmd.Process.Pid
	}
	return out
}

// stop sends SIGTERM to each replica by its PID and closes its stdin, then
// waits for each to exit, killing one that takes longer than
// replicaKillAfter.
func (s *replicaSet) stop() {
	s.stopping.Store(true)
	for _, p := range s.procs {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		_ = p.stdin.Close()
	}
	deadline := time.NewTimer(replicaKillAfter)
	defer deadline.Stop()
	for _, p := range s.procs {
		select {
		case <-p.done:
		case <-deadline.C:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
}

// awaitConsumers waits until queue has at least n consumers: each replica
// consumes its reply queue with one (an orchestrator that groups replies,
// MaxBatch > 1, runs one consumer), so that the measurement starts with
// every replica taking replies. A replica's exit (errs) ends the wait.
func awaitConsumers(ctx context.Context, amqpURL, queue string, n int, errs <-chan error) error {
	conn, err := dialAMQP(amqpURL, "sagabox-bench-replicas")
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	deadline := time.Now().Add(replicaStartTimeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	consumers := 0
	for {
		ch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("count consumers of %s: %w", queue, err)
		}
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		_ = ch.Close()
		if err != nil {
			return fmt.Errorf("count consumers of %s: %w", queue, err)
		}
		if consumers = q.Consumers; consumers >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d orchestrator replicas started, %d consumers on %s after %s", n, consumers, queue, replicaStartTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-errs:
			return err
		case <-tick.C:
		}
	}
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// RunOrchestratorReplica is one orchestrator replica of the replicas
// measurement: it reads a ReplicaSpec as JSON from stdin and runs the
// bench's orchestrator on the spec's schema and broker namespace, with its
// own pool and broker connection, its relay woken by NOTIFY from the
// process that starts the sagas, until ctx is cancelled (SIGTERM) or stdin
// ends (the bench closed it, or died). Errors are logged to stderr.
func RunOrchestratorReplica(ctx context.Context, stdin io.Reader, stderr io.Writer) error {
	var spec ReplicaSpec
	if err := json.NewDecoder(stdin).Decode(&spec); err != nil {
		return fmt.Errorf("read the replica spec on stdin: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Ends with stdin, at the latest when the process exits.
	go func() {
		_, _ = io.Copy(io.Discard, stdin)
		cancel()
	}()

	pool, err := newPool(ctx, spec.DatabaseURL, spec.PoolSize)
	if err != nil {
		return err
	}
	defer pool.Close()
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	broker, err := rabbitmq.New(ctx, rabbitmq.Config{
		URL: spec.AMQPURL, Namespace: spec.Namespace, QueueType: rabbitmq.QueueType(spec.QueueType),
		ConnectionName: spec.Namespace + ".replica-" + strconv.Itoa(os.Getpid()), Logger: logger,
	})
	if err != nil {
		return fmt.Errorf("connect orchestrator replica's broker: %w", err)
	}
	defer func() { _ = broker.Close() }()
	orch, err := orchestrator.NewClient(orchestrator.Config{
		Pool: pool, Schema: spec.Schema, Service: svcOrch, Broker: broker,
		Definitions: []saga.Runner{benchSaga}, Workers: spec.Workers, Logger: logger, TracerProvider: probeTP,
		Admission: orchestrator.AdmissionConfig{MaxRunning: spec.MaxRunning}, BatchLinger: spec.Linger,
		Relay: orchestrator.RelayConfig{Listen: true}, StopTimeout: replicaStopTimeout,
	})
	if err != nil {
		return err
	}
	return orch.Run(ctx)
}
