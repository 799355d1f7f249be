// Command chaos is the project's fault-injection run of the checkout
// example. It starts a private PostgreSQL cluster and a private RabbitMQ
// node (or, with -cluster, a three-node RabbitMQ cluster), so it never
// touches the shared servers; runs the example as separate processes (two
// orders/orchestrator instances and two instances of each participant);
// places sagas whose outcome is known in advance; and while they run it
// SIGKILLs and restarts processes of every kind, restarts the broker
// (gracefully and with kill -9; with -cluster it kills the node leading the
// queues), restarts the database (-m immediate and -m fast) and injects
// duplicate deliveries (a trigger copies some outbox rows, so the relay
// publishes those messages twice). At the end it audits the databases and
// prints a table: sagas placed and present, outcomes against the plan,
// double effects, backlog, dead letters and the recovery after each fault.
// It exits 1 when any check fails.
//
//	go run ./cmd/chaos            # the short form (CI)
//	go run ./cmd/chaos -long      # 10,000 sagas, 24 kills, 3 broker and 2 database restarts
//	go run ./cmd/chaos -cluster   # against a three-node RabbitMQ cluster
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sagabox/sagabox/internal/testkit/servers"
	"github.com/sagabox/sagabox/store"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout)
	stop()
	os.Exit(code)
}

// config is the run's flags.
type config struct {
	sagas          int
	rate           float64
	kills          int
	brokerRestarts int
	dbRestarts     int
	duplicates     float64
	failRate       float64
	cluster        bool
	drainTimeout   time.Duration
	keep           bool
	dir            string
}

func parseFlags(args []string, out io.Writer) (*config, error) {
	c := &config{}
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(out)
	long := fs.Bool("long", false, "the long form: 10,000 sagas, 24 kills, 3 broker and 2 database restarts (overrides the counts)")
	fs.IntVar(&c.sagas, "sagas", 500, "sagas (orders) to place")
	fs.Float64Var(&c.rate, "rate", 10, "orders placed per second")
	fs.IntVar(&c.kills, "kills", 6, "SIGKILLs of example processes (each restarted), cycling over every kind")
	fs.IntVar(&c.brokerRestarts, "broker-restarts", 2, "broker restarts, alternating kill -9 and graceful (with -cluster: kill -9 of the node leading the queues)")
	fs.IntVar(&c.dbRestarts, "db-restarts", 2, "database restarts, alternating -m immediate and -m fast")
	fs.Float64Var(&c.duplicates, "duplicates", 0.02, "fraction of outbox rows written twice (duplicate deliveries)")
	fs.Float64Var(&c.failRate, "fail-rate", 0.3, "fraction of orders planned to be compensated")
	fs.BoolVar(&c.cluster, "cluster", false, "run against a three-node RabbitMQ cluster (quorum queues on all three)")
	fs.DurationVar(&c.drainTimeout, "drain-timeout", 10*time.Minute, "how long to wait, after the last fault, for every saga to end and every outbox to drain")
	fs.BoolVar(&c.keep, "keep", false, "keep the run's directory (process logs) even when it passes")
	fs.StringVar(&c.dir, "dir", "", "directory of the run's servers and logs (default: a new temporary directory)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if *long {
		c.sagas, c.kills, c.brokerRestarts, c.dbRestarts, c.rate = 10000, 24, 3, 2, 25
	}
	if c.sagas <= 0 || c.rate <= 0 || c.kills < 0 || c.brokerRestarts < 0 || c.dbRestarts < 0 {
		return nil, errors.New("-sagas and -rate must be positive, the fault counts not negative")
	}
	if c.duplicates < 0 || c.duplicates >= 1 || c.failRate < 0 || c.failRate > 1 {
		return nil, errors.New("-duplicates and -fail-rate are fractions")
	}
	return c, nil
}

func run(ctx context.Context, args []string, out io.Writer) int {
	c, err := parseFlags(args, out)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(out, "chaos:", err)
		return 2
	}
	r := &runner{c: c, out: out, started: time.Now()}
	passed, err := r.run(ctx)
	r.cleanup(passed && err == nil)
	if err != nil {
		fmt.Fprintln(out, "chaos:", err)
		return 1
	}
	if !passed {
		return 1
	}
	return 0
}

// runner is one chaos run.
type runner struct {
	c       *config
	out     io.Writer
	started time.Time
	dir     string

	pg     *servers.Postgres
	nodes  []*servers.RabbitMQ
	pool   *pgxpool.Pool
	procs  []*proc
	placer *proc

	samples *sampler
	faults  []*fault
}

func (r *runner) logf(format string, args ...any) {
	fmt.Fprintf(r.out, "[%6.1fs] %s\n", time.Since(r.started).Seconds(), fmt.Sprintf(format, args...))
}

const namespace = "chaos"

// confirmTimeout is how long a checkout of the run waits for its payment
// confirmation.
const confirmTimeout = 30 * time.Second

// freeAddr returns a local address no one listens on now.
func freeAddr(ctx context.Context) (string, error) {
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	addr := ln.Addr().String()
	return addr, ln.Close()
}

var schemas = []string{"orders", "inventory", "payment", "shipping", "loyalty"}

func (r *runner) run(ctx context.Context) (bool, error) {
	var err error
	if r.dir, err = dirFor(r.c.dir); err != nil {
		return false, err
	}
	r.logf("run directory %s", r.dir)
	root, err := moduleRoot()
	if err != nil {
		return false, err
	}
	binDir := filepath.Join(r.dir, "bin")
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return false, fmt.Errorf("create %s: %w", binDir, err)
	}
	bin, err := build(ctx, root, binDir)
	if err != nil {
		return false, err
	}
	r.logf("built the checkout example")
	if err := r.startServers(ctx); err != nil {
		return false, err
	}
	if err := r.startProcesses(ctx, bin); err != nil {
		return false, err
	}
	r.samples = newSampler(r.pool)
	go r.samples.run(ctx)
	if err := r.injectFaults(ctx); err != nil {
		return false, err
	}
	drained := r.drain(ctx)
	for _, p := range r.procs {
		p.stop()
	}
	r.samples.stop()
	r.logf("stopped every process; auditing")
	rep, err := r.audit(ctx, drained)
	if err != nil {
		return false, err
	}
	rep.print(r.out)
	return rep.passed(), nil
}

func dirFor(dir string) (string, error) {
	if dir == "" {
		// The servers run as the postgres and rabbitmq users: the directory
		// must be traversable by them.
		d, err := os.MkdirTemp("", "sagabox-chaos-")
		if err != nil {
			return "", fmt.Errorf("create the run directory: %w", err)
		}
		dir = d
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create the run directory: %w", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return "", fmt.Errorf("create the run directory: %w", err)
	}
	return dir, nil
}

func (r *runner) startServers(ctx context.Context) error {
	var err error
	r.pg, err = servers.StartPostgres(ctx, servers.PostgresOptions{
		Dir:      filepath.Join(r.dir, "postgres"),
		Settings: map[string]string{"max_connections": "300"},
	})
	if err != nil {
		return err
	}
	r.logf("PostgreSQL on port %d", r.pg.Port())
	n := 1
	if r.c.cluster {
		n = 3
	}
	for i := range n {
		node, err := servers.StartRabbitMQ(ctx, servers.RabbitMQOptions{
			Dir:  filepath.Join(r.dir, fmt.Sprintf("rabbitmq-%d", i+1)),
			Name: fmt.Sprintf("sagabox-chaos-%d-%d", os.Getpid(), i+1),
		})
		if err != nil {
			return err
		}
		r.nodes = append(r.nodes, node)
		if i > 0 {
			if err := node.JoinCluster(ctx, r.nodes[0]); err != nil {
				return err
			}
		}
		r.logf("RabbitMQ node %s on port %d", node.Node(), node.Port())
	}
	if r.c.cluster {
		status, err := r.nodes[0].Ctl(ctx, "cluster_status", "--formatter", "json")
		if err != nil {
			return err
		}
		for _, node := range r.nodes {
			if !strings.Contains(status, node.Node()) {
				return fmt.Errorf("node %s is not in the cluster: %s", node.Node(), status)
			}
		}
		r.logf("three-node RabbitMQ cluster formed")
	}
	cfg, err := pgxpool.ParseConfig(r.pg.URL())
	if err != nil {
		return fmt.Errorf("parse the database URL: %w", store.ExplainParseError(r.pg.URL(), err))
	}
	cfg.MaxConns = 4
	if r.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return fmt.Errorf("open the audit pool: %w", err)
	}
	return nil
}

// amqpURLs returns the node URLs for the i-th process, starting at a
// different node for each so that the processes spread over the cluster.
func (r *runner) amqpURLs(i int) string {
	urls := make([]string, len(r.nodes))
	for j := range r.nodes {
		urls[j] = r.nodes[(i+j)%len(r.nodes)].URL()
	}
	return strings.Join(urls, ",")
}

func (r *runner) startProcesses(ctx context.Context, bin string) error {
	logs := filepath.Join(r.dir, "logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", logs, err)
	}
	// Each orders instance serves the payment provider's webhook at an
	// address of its own, kept across its restarts; the providers (in the
	// payment processes) call them in turn.
	hooks := make([]string, 2)
	urls := make([]string, len(hooks))
	for i := range hooks {
		addr, err := freeAddr(ctx)
		if err != nil {
			return err
		}
		hooks[i], urls[i] = addr, "http://"+addr+"/webhooks/payment"
	}
	common := []string{
		"-database-url", r.pg.URL(), "-namespace", namespace, "-run-id", "chaos",
		"-orders", fmt.Sprint(r.c.sagas), "-fail-rate", fmt.Sprint(r.c.failRate),
		"-timeout", "2h", "-v", "-webhook-url", strings.Join(urls, ","),
		// Long enough that a confirmation delayed by a fault still arrives:
		// only the planned ones (an account on hold) time out.
		"-confirm-timeout", confirmTimeout.String(),
	}
	add := func(name, kind string, extra ...string) *proc {
		i := len(r.procs)
		args := append(append(append([]string{}, common...), "-service", kind, "-amqp-url", r.amqpURLs(i)), extra...)
		p := &proc{name: name, kind: kind, bin: bin, args: args, log: filepath.Join(logs, name+".log"), ready: "service running"}
		r.procs = append(r.procs, p)
		return p
	}
	// The second orders instance first: it runs the orchestrator only. Then
	// the participants (which seed their tables from the plan), and last the
	// instance that places the orders and waits for their sagas.
	add("orders-2", "orders", "-place=false", "-webhook-addr", hooks[1])
	for _, kind := range schemas[1:] {
		add(kind+"-1", kind)
		add(kind+"-2", kind)
	}
	for _, p := range r.procs {
		if err := p.start(ctx); err != nil {
			return err
		}
	}
	if err := r.installDuplicates(ctx); err != nil {
		return err
	}
	r.placer = add("orders-1", "orders", "-rate", fmt.Sprint(r.c.rate), "-webhook-addr", hooks[0])
	r.placer.ready = "placing"
	if err := r.placer.start(ctx); err != nil {
		return err
	}
	r.logf("started %d processes; orders-1 places %d orders at %.0f/s", len(r.procs), r.c.sagas, r.c.rate)
	if r.c.cluster {
		return r.checkReplicas(ctx)
	}
	return nil
}

// checkReplicas checks that every quorum queue of the run has a member on
// each of the three nodes.
func (r *runner) checkReplicas(ctx context.Context) error {
	out, err := r.nodes[0].Ctl(ctx, "list_queues", "name", "type", "members", "--no-table-headers")
	if err != nil {
		return err
	}
	queues := 0
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || !strings.HasPrefix(f[0], namespace+".") {
			continue
		}
		if f[1] != "quorum" {
			return fmt.Errorf("queue %s is %s, not quorum", f[0], f[1])
		}
		members := strings.Join(f[2:], " ")
		for _, n := range r.nodes {
			if !strings.Contains(members, n.Node()) {
				return fmt.Errorf("queue %s has no member on %s: %s", f[0], n.Node(), members)
			}
		}
		queues++
	}
	if queues == 0 {
		return fmt.Errorf("no quorum queue of namespace %s: %s", namespace, out)
	}
	r.logf("%d quorum queues, each with a member on all three nodes", queues)
	return nil
}

// cleanup stops the servers and removes the run's directory unless the run
// failed or -keep was given.
func (r *runner) cleanup(passed bool) {
	for _, p := range r.procs {
		if p.cmd != nil && p.running() {
			p.stop()
		}
	}
	if r.pool != nil {
		r.pool.Close()
	}
	for _, n := range r.nodes {
		_ = n.Kill()
	}
	if r.pg != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_ = r.pg.Stop(ctx, "immediate")
		cancel()
	}
	if r.dir == "" {
		return
	}
	if passed && !r.c.keep {
		_ = os.RemoveAll(r.dir)
		return
	}
	fmt.Fprintf(r.out, "chaos: servers stopped; logs kept in %s\n", r.dir)
}
