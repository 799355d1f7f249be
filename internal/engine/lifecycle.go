package engine

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

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
