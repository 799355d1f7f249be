package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sagabox/sagabox/internal/testkit/servers"
)

// sample is the orders database's progress at one moment.
type sample struct {
	at       time.Time
	history  int64 // the highest saga history id: grows with every step
	placed   int64 // sagas present
	terminal int64 // sagas completed, compensated or failed
}

// sampler reads the progress every half second (and skips a moment when
// the database is down).
type sampler struct {
	pool *pgxpool.Pool
	mu   sync.Mutex
	list []sample
	quit chan struct{}
	done chan struct{}
}

func newSampler(pool *pgxpool.Pool) *sampler {
	return &sampler{pool: pool, quit: make(chan struct{}), done: make(chan struct{})}
}

func (s *sampler) run(ctx context.Context) {
	defer close(s.done)
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		var smp sample
		err := s.pool.QueryRow(qctx, `SELECT
			(SELECT coalesce(max(id), 0) FROM orders.sagabox_saga_history),
			(SELECT count(*) FROM orders.sagabox_saga),
			(SELECT count(*) FROM orders.sagabox_saga WHERE status IN ('completed', 'compensated', 'failed'))`).
			Scan(&smp.history, &smp.placed, &smp.terminal)
		cancel()
		if err == nil {
			smp.at = time.Now()
			s.mu.Lock()
			s.list = append(s.list, smp)
			s.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-s.quit:
			return
		case <-t.C:
		}
	}
}

func (s *sampler) stop() {
	close(s.quit)
	<-s.done
}

// last returns the latest sample.
func (s *sampler) last() sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.list) == 0 {
		return sample{}
	}
	return s.list[len(s.list)-1]
}

// resumed returns how long after back the saga history first grew past
// what it was at the first sample taken at or after back, and false when it
// never did (nothing was left to do).
func (s *sampler) resumed(back time.Time) (time.Duration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := sort.Search(len(s.list), func(i int) bool { return !s.list[i].at.Before(back) })
	if i == len(s.list) {
		return 0, false
	}
	base := s.list[i].history
	if i > 0 && s.list[i-1].history < base {
		// It grew between the last sample before and the first after.
		return s.list[i].at.Sub(back), true
	}
	for _, smp := range s.list[i+1:] {
		if smp.history > base {
			return smp.at.Sub(back), true
		}
	}
	return 0, false
}

// fault is one injected fault and what it did.
type fault struct {
	kind     string // "SIGKILL", "broker", "database"
	target   string
	how      string
	inject   time.Time
	back     time.Time // the process or server is up again
	inflight int64     // sagas placed and not yet ended at injection
	err      error
}

// plan returns the faults of the run in the order they are injected: the
// broker and database restarts spread among the kills.
func (r *runner) plan() []*fault {
	var infra []*fault
	for i := range max(r.c.brokerRestarts, r.c.dbRestarts) {
		if i < r.c.brokerRestarts {
			how := "kill -9"
			if i%2 == 1 {
				how = "graceful"
			}
			if r.c.cluster {
				how = "kill -9 of the queue leader"
			}
			infra = append(infra, &fault{kind: "broker", how: how})
		}
		if i < r.c.dbRestarts {
			how := "immediate"
			if i%2 == 1 {
				how = "fast"
			}
			infra = append(infra, &fault{kind: "database", how: how})
		}
	}
	total := r.c.kills + len(infra)
	all := make([]*fault, total)
	// The infrastructure faults at even intervals among the kills.
	for j, f := range infra {
		all[(2*j+1)*total/(2*len(infra))] = f
	}
	// Kills cycle over the kinds before the second instances, so that any
	// four kills hit every kind of process.
	var victims []string
	for _, inst := range []string{"-1", "-2"} {
		for _, kind := range schemas {
			victims = append(victims, kind+inst)
		}
	}
	k := 0
	for i := range all {
		if all[i] != nil {
			continue
		}
		all[i] = &fault{kind: "SIGKILL", target: victims[k%len(victims)], how: "kill -9, restart"}
		k++
	}
	return all
}

// injectFaults injects the planned faults at even intervals over the time
// placing the orders takes (the first nine tenths of it, so that the last
// fault too meets sagas in flight). A fault that takes long (a broker
// restart) delays the next ones; they then follow at least a second apart.
func (r *runner) injectFaults(ctx context.Context) error {
	r.faults = r.plan()
	start := time.Now()
	window := time.Duration(0.9 * float64(r.c.sagas) / r.c.rate * float64(time.Second))
	for i, f := range r.faults {
		at := start.Add(window * time.Duration(i+1) / time.Duration(len(r.faults)+1))
		wait := max(time.Until(at), time.Second)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		last := r.samples.last()
		f.inflight = last.placed - last.terminal
		f.inject = time.Now()
		f.err = r.inject(ctx, f)
		f.back = time.Now()
		if f.err != nil {
			r.logf("fault %s %s (%s): %v", f.kind, f.target, f.how, f.err)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			continue
		}
		r.logf("fault %s %s (%s): back after %s, %d sagas in flight", f.kind, f.target, f.how,
			f.back.Sub(f.inject).Round(10*time.Millisecond), f.inflight)
		if err := r.superviseExits(ctx); err != nil {
			return err
		}
	}
	return nil
}

func (r *runner) inject(ctx context.Context, f *fault) error {
	switch f.kind {
	case "SIGKILL":
		for _, p := range r.procs {
			if p.name != f.target {
				continue
			}
			if !p.running() {
				return fmt.Errorf("%s is not running", p.name)
			}
			if err := p.kill(); err != nil {
				return err
			}
			return p.start(ctx)
		}
		return fmt.Errorf("no process %s", f.target)
	case "broker":
		if r.c.cluster {
			return r.killLeader(ctx, f)
		}
		f.target = r.nodes[0].Node()
		return r.nodes[0].Restart(ctx, f.how == "kill -9")
	case "database":
		f.target = fmt.Sprintf("postgres :%d", r.pg.Port())
		return r.pg.Restart(ctx, f.how)
	}
	return fmt.Errorf("unknown fault %s", f.kind)
}

// killLeader kills (kill -9) the node that leads most of the run's quorum
// queues, waits until another node leads them, and starts the node again.
func (r *runner) killLeader(ctx context.Context, f *fault) error {
	leaders, err := r.queueLeaders(ctx, nil)
	if err != nil {
		return err
	}
	var leader *servers.RabbitMQ
	most := 0
	for _, n := range r.nodes {
		if leaders[n.Node()] > most {
			leader, most = n, leaders[n.Node()]
		}
	}
	if leader == nil {
		return fmt.Errorf("no node leads the queues: %v", leaders)
	}
	f.target = fmt.Sprintf("%s (led %d queues)", leader.Node(), most)
	if err := leader.Kill(); err != nil {
		return err
	}
	// Let the cluster run on two nodes for a while before the node returns.
	deadline := time.Now().Add(time.Minute)
	for {
		after, err := r.queueLeaders(ctx, leader)
		if err == nil && after[leader.Node()] == 0 && sum(after) >= most {
			f.how = fmt.Sprintf("kill -9 of the queue leader; %d queues re-elected", most)
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("queues not re-elected a minute after the leader died: %v (%w)", after, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	time.Sleep(5 * time.Second)
	return leader.Start(ctx)
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// queueLeaders counts the run's quorum queues by leading node, asking a node
// other than skip.
func (r *runner) queueLeaders(ctx context.Context, skip *servers.RabbitMQ) (map[string]int, error) {
	var lastErr error
	for _, n := range r.nodes {
		if n == skip || n.PID() == 0 {
			continue
		}
		out, err := n.Ctl(ctx, "list_queues", "name", "type", "leader", "--no-table-headers")
		if err != nil {
			lastErr = err
			continue
		}
		leaders := map[string]int{}
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) == 3 && strings.HasPrefix(f[0], namespace+".") && f[1] == "quorum" {
				leaders[f[2]]++
			}
		}
		return leaders, nil
	}
	return nil, fmt.Errorf("no node answers: %w", lastErr)
}

// superviseExits restarts a process that exited on its own (an unplanned
// exit, which the report counts), except the placer once it has succeeded.
func (r *runner) superviseExits(ctx context.Context) error {
	for _, p := range r.procs {
		if p.running() || (p == r.placer && p.exitError() == nil) {
			continue
		}
		r.logf("%s exited on its own (%v); restarting it", p.name, p.exitError())
		if err := p.start(ctx); err != nil {
			return err
		}
	}
	return nil
}

// drain waits until every saga has ended and every outbox is empty, and
// reports whether that happened before the drain timeout.
func (r *runner) drain(ctx context.Context) bool {
	r.logf("every fault injected; waiting for the sagas to end and the outboxes to drain")
	deadline := time.Now().Add(r.c.drainTimeout)
	lastLog := time.Now()
	for time.Now().Before(deadline) {
		if err := r.superviseExits(ctx); err != nil {
			r.logf("%v", err)
			return false
		}
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		var placed, terminal, backlog int64
		err := r.pool.QueryRow(qctx, `SELECT
			(SELECT count(*) FROM orders.sagabox_saga),
			(SELECT count(*) FROM orders.sagabox_saga WHERE status IN ('completed', 'compensated', 'failed')),
			`+backlogSQL()).Scan(&placed, &terminal, &backlog)
		cancel()
		if err == nil && placed == int64(r.c.sagas) && terminal == placed && backlog == 0 && !r.placer.running() {
			r.logf("all %d sagas ended, outboxes empty", placed)
			return true
		}
		if time.Since(lastLog) >= 10*time.Second {
			r.logf("%d/%d sagas ended, %d outbox rows unpublished", terminal, placed, backlog)
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(time.Second):
		}
	}
	return false
}

// backlogSQL sums the unpublished rows of every schema's outbox.
func backlogSQL() string {
	parts := make([]string, len(schemas))
	for i, s := range schemas {
		parts[i] = fmt.Sprintf("(SELECT count(*) FROM %s.sagabox_outbox WHERE published_at IS NULL)", s)
	}
	return strings.Join(parts, " + ")
}
