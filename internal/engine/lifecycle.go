package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/sagabox/sagabox/internal/relay"
	"github.com/sagabox/sagabox/store/driver"
	"github.com/sagabox/sagabox/transport"
)

// DrainContext returns a context for work that must be allowed to finish when
// parent is cancelled: it is cancelled stopTimeout after parent is done
// (calling onTimeout first), or when release is called, whichever comes
// first. Call release once the work is over; it is idempotent and waits for
// the goroutine that watches parent, so nothing outlives the caller.
func DrainContext(parent context.Context, stopTimeout time.Duration, onTimeout func()) (ctx context.Context, release func()) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(parent))
	stopped := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case <-stopped:
			return
		case <-parent.Done():
		}
		t := time.NewTimer(stopTimeout)
		defer t.Stop()
		select {
		case <-stopped:
		case <-t.C:
			if onTimeout != nil {
				onTimeout()
			}
			cancel()
		}
	})
	var once sync.Once
	return ctx, func() {
		once.Do(func() {
			close(stopped)
			wg.Wait()
			cancel()
		})
	}
}

// Pause waits d, or until ctx is done, and reports whether the whole wait
// elapsed. Consumers use it while a dependency is down: nothing can make
// progress, so holding the delivery (and the worker) for the delay beats
// cycling every queued message through a retry queue.
func Pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// AwaitReady runs step until it succeeds and returns nil. While step fails
// with an error for which transient is true (the database or the broker is
// not up yet, or restarting), it logs the failure with what was being done
// and waits, with a backoff capped at 10s, so that a client started before
// its servers, or while one restarts, waits for them instead of failing.
// Any other error, and ctx ending, are returned.
func AwaitReady(ctx context.Context, log *slog.Logger, what string, transient func(error) bool, step func(context.Context) error) error {
	for attempt := 1; ; attempt++ {
		err := step(ctx)
		switch {
		case err == nil:
			if attempt > 1 {
				log.Info(what+": done after waiting", "attempts", attempt)
			}
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case !transient(err):
			return err
		}
		wait := min(100*time.Millisecond<<min(attempt-1, 7), 10*time.Second)
		log.Warn(what+": not reachable yet; retrying", "err", err, "attempt", attempt, "retry_in", wait)
		if !Pause(ctx, wait) {
			return ctx.Err()
		}
	}
}

// BrokerTransient reports whether err, from the broker's Declare or
// Subscribe, may go away by waiting: every error but transport.ErrPermanent.
func BrokerTransient(err error) bool { return !errors.Is(err, transport.ErrPermanent) }

// RunGuard lets one Run of a client run at a time. Its lock also guards
// what a client may change only while it is not running (the participant's
// handlers): change and read it in With. What Run's goroutines read of it
// needs no lock: it cannot change while they run.
type RunGuard struct {
	mu      sync.Mutex
	running bool
}

// Enter marks the client running, unless it is already or ready refuses
// to start (no handler registered, say): ready runs under the guard's
// lock, so that what it reads cannot change before Run begins. Errors are
// prefixed with client. Call leave when Run returns.
func (g *RunGuard) Enter(client string, ready func() error) (leave func(), err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.running {
		return nil, fmt.Errorf("%s: Run called while the client is already running", client)
	}
	if ready != nil {
		if err := ready(); err != nil {
			return nil, fmt.Errorf("%s: %w", client, err)
		}
	}
	g.running = true
	return func() {
		g.mu.Lock()
		g.running = false
		g.mu.Unlock()
	}, nil
}

// With runs fn under the guard's lock, telling it whether Run is running.
func (g *RunGuard) With(fn func(running bool)) {
	g.mu.Lock()
	defer g.mu.Unlock()
	fn(g.running)
}

// AwaitSchema waits until the client's schema is reachable and checks that
// its role has the privileges it needs and that it is migrated (the saga
// tables too when the engine keeps sagas), logging and retrying while the
// database is down or restarting. It returns the check's error when a grant
// is missing or the schema is not migrated (it names what to run), and
// ctx's when ctx ends first.
func (e *Engine) AwaitSchema(ctx context.Context) error {
	needs := driver.SchemaNeeds{Sagas: e.cfg.KeepsSagas, LogRelay: e.cfg.Relay.Mode == relay.ModeLog}
	return AwaitReady(ctx, e.log, "check the schema", func(err error) bool { return errors.Is(err, driver.ErrConnection) },
		func(ctx context.Context) error { return e.cfg.DB.SchemaCheck(ctx, needs) })
}
