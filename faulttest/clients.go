package faulttest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/participant"
	"github.com/sagabox/sagabox/transport"
)

// hardStop is the StopTimeout of every client of a run: a restart cancels
// the transactions in flight instead of draining them.
const hardStop = time.Millisecond

// defaultPoll is the relay poll interval of a client whose config has none.
const defaultPoll = 100 * time.Millisecond

// defaultSweep is the sweep interval of an orchestrator whose config has
// none.
const defaultSweep = 250 * time.Millisecond

// runner is a client's blocking Run.
type runner interface {
	Run(ctx context.Context) error
}

// node is one client of a run, which it can close hard and start again.
type node struct {
	name  string
	pool  *pgxpool.Pool
	build func(ctx context.Context) (runner, transport.Broker, error)

	// life is the run's context, which every client the node starts runs
	// under: one started again by a fault lives as long as the first one,
	// not as long as the fault schedule.
	life context.Context

	mu     sync.Mutex
	broker transport.Broker
	cancel context.CancelFunc
	done   chan struct{}
	err    error // Run's error, if it returned by itself
	killed bool
}

// start builds a new client and runs it until the run ends or the client
// is killed.
func (n *node) start() error {
	c, b, err := n.build(n.life)
	if err != nil {
		return fmt.Errorf("faulttest: start %s: %w", n.name, err)
	}
	cctx, cancel := context.WithCancel(n.life)
	done := make(chan struct{})
	n.mu.Lock()
	n.broker, n.cancel, n.done, n.err, n.killed = b, cancel, done, nil, false
	n.mu.Unlock()
	go func() {
		defer close(done)
		err := c.Run(cctx)
		n.mu.Lock()
		defer n.mu.Unlock()
		if !n.killed && n.life.Err() == nil {
			// A client stops only when the kit stops it (or the run ends):
			// one that returns on its own, even cleanly, leaves its queue
			// and its outbox unserved, and the run would end in a stall,
			// not this error.
			if err == nil {
				err = errors.New("returned without being stopped")
			}
			n.err = err
		}
	}()
	return nil
}

// kill closes the client's broker connection and cancels it, as a process
// that dies does, and waits for it to return.
func (n *node) kill() {
	if b, cancel, done, ok := n.take(); ok {
		_ = b.Close()
		cancel()
		<-done
	}
}

// stop cancels the client and waits for it, then closes its connection.
func (n *node) stop() {
	if b, cancel, done, ok := n.take(); ok {
		cancel()
		<-done
		_ = b.Close()
	}
}

// take marks the running client as stopped by the run and hands over what
// ends it: its broker, the cancel of its Run and the channel closed when Run
// returns. ok is false when no client runs.
func (n *node) take() (b transport.Broker, cancel context.CancelFunc, done <-chan struct{}, ok bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cancel == nil {
		return nil, nil, nil, false
	}
	n.killed = true
	b, cancel, done = n.broker, n.cancel, n.done
	n.cancel = nil
	return b, cancel, done, true
}

// restart kills the client and starts a new one, unless the run is over.
func (n *node) restart() error {
	n.kill()
	if n.life.Err() != nil {
		return nil
	}
	return n.start()
}

// failure returns the error of a client whose Run returned by itself.
func (n *node) failure() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.err != nil {
		return fmt.Errorf("faulttest: %s stopped: %w", n.name, n.err)
	}
	return nil
}

func (r *run[In]) clientFailure() error {
	var errs []error
	for _, n := range append([]*node{r.orch}, r.parts...) {
		if n != nil {
			errs = append(errs, n.failure())
		}
	}
	return errors.Join(errs...)
}

// clientPool opens a pool for the client name on Scenario.Pool's database,
// with an application name that the connection killer selects by.
func (r *run[In]) clientPool(ctx context.Context, name string, size int32) (*pgxpool.Pool, error) {
	cfg := r.s.Pool.Config()
	params := make(map[string]string, len(cfg.ConnConfig.RuntimeParams)+1)
	for k, v := range cfg.ConnConfig.RuntimeParams {
		params[k] = v
	}
	app := r.app + name
	if len(app) > 63 {
		app = app[:63]
	}
	params["application_name"] = app
	cfg.ConnConfig.RuntimeParams = params
	cfg.MaxConns = size
	cfg.MinConns = 0
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("faulttest: open a pool for %s: %w", name, err)
	}
	r.pools = append(r.pools, pool)
	return pool, nil
}

// dial connects a broker for a client and wraps it with the faults.
func (r *run[In]) dial(ctx context.Context, name string) (*faultyBroker, error) {
	b, err := r.s.Dial(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("connect the broker: %w", err)
	}
	return &faultyBroker{inner: b, inj: r.inj}, nil
}

// startClients starts the participants and the orchestrator, after
// declaring every queue, so that no command is sent to a queue that does
// not exist yet.
func (r *run[In]) startClients(ctx context.Context, declarer transport.Broker) error {
	for i := range r.s.Participants {
		p := r.s.Participants[i]
		pool, err := r.clientPool(ctx, p.Config.Service, int32(p.Config.ConnsNeeded()))
		if err != nil {
			return err
		}
		n := &node{name: "participant " + p.Config.Service, pool: pool, life: ctx}
		n.build = func(ctx context.Context) (runner, transport.Broker, error) {
			b, err := r.dial(ctx, p.Config.Service)
			if err != nil {
				return nil, nil, err
			}
			cfg := p.Config
			cfg.Pool, cfg.Broker, cfg.StopTimeout = pool, b, hardStop
			if cfg.Relay.PollInterval == 0 {
				cfg.Relay.PollInterval = defaultPoll
			}
			if cfg.Logger == nil {
				cfg.Logger = r.s.Logger
			}
			c, err := participant.NewClient(cfg)
			if err != nil {
				_ = b.Close()
				return nil, nil, err
			}
			p.Register(c)
			if err := declarer.Declare(ctx, c.QueueSpec()); err != nil {
				_ = b.Close()
				return nil, nil, fmt.Errorf("declare queue %s: %w", p.Config.Service, err)
			}
			return c, b, nil
		}
		r.parts = append(r.parts, n)
		if err := n.start(); err != nil {
			return err
		}
	}
	o := r.s.Orchestrator.Config
	pool, err := r.clientPool(ctx, "orchestrator", int32(o.ConnsNeeded()))
	if err != nil {
		return err
	}
	r.orch = &node{name: "orchestrator", pool: pool, life: ctx}
	r.orch.build = func(ctx context.Context) (runner, transport.Broker, error) {
		b, err := r.dial(ctx, "orchestrator")
		if err != nil {
			return nil, nil, err
		}
		b.gated = true
		cfg := o
		cfg.Pool, cfg.Broker, cfg.Clock, cfg.StopTimeout = pool, b, r.now, hardStop
		if cfg.SweepInterval == 0 {
			cfg.SweepInterval = defaultSweep
		}
		if cfg.Relay.PollInterval == 0 {
			cfg.Relay.PollInterval = defaultPoll
		}
		if cfg.Logger == nil {
			cfg.Logger = r.s.Logger
		}
		c, err := orchestrator.NewClient(cfg)
		if err != nil {
			_ = b.Close()
			return nil, nil, err
		}
		if err := declarer.Declare(ctx, transport.QueueSpec{Name: cfg.Service, Replies: true}); err != nil {
			_ = b.Close()
			return nil, nil, fmt.Errorf("declare queue %s: %w", cfg.Service, err)
		}
		r.orchCur.Store(c)
		return c, b, nil
	}
	return r.orch.start()
}

func (r *run[In]) stopClients() {
	if r.orch != nil {
		r.orch.stop()
	}
	for _, n := range r.parts {
		n.stop()
	}
	for _, p := range r.pools {
		p.Close()
	}
	r.pools = nil
}
