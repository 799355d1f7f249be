package engine

import (
	"context"
	"sync"
	"time"
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
