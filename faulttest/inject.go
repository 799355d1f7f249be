package faulttest

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/transport"
)

// publishTimeout bounds the publish of a delayed duplicate.
const publishTimeout = 10 * time.Second

// injector draws the faults of a run from its seeded generator and counts
// the ones injected.
type injector struct {
	faults Faults

	// quiet ends the injection: once the sagas have ended, the outboxes
	// drain without faults.
	quiet atomic.Bool

	mu     sync.Mutex
	rng    *rand.Rand
	counts map[Fault]int

	// Delayed duplicates are published by a connection of the kit's own,
	// which outlives the clients' restarts.
	spare transport.Publisher
	done  <-chan struct{} // closed when the run ends
	// gate, while not nil, holds the orchestrator's deliveries until it is
	// closed.
	gate chan struct{}
	wg   sync.WaitGroup
}

func newInjector(done <-chan struct{}, rng *rand.Rand, f Faults, spare transport.Publisher) *injector {
	return &injector{faults: f, rng: rng, counts: make(map[Fault]int), spare: spare, done: done}
}

// roll reports true with probability p.
func (in *injector) roll(p float64) bool {
	if p <= 0 || in.quiet.Load() {
		return false
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.rng.Float64() < p
}

// duration draws a duration in [0, max).
func (in *injector) duration(max time.Duration) time.Duration {
	if max <= 0 {
		return 0
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	return time.Duration(in.rng.Int64N(int64(max)))
}

// intN draws an int in [0, n).
func (in *injector) intN(n int) int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.rng.IntN(n)
}

func (in *injector) count(f Fault) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.counts[f]++
}

// later publishes m again after a random delay.
func (in *injector) later(m message.Message) {
	d := in.duration(in.faults.MaxDelay)
	in.mu.Lock()
	if in.quiet.Load() {
		in.mu.Unlock()
		return
	}
	in.wg.Add(1) // before quietDown's Wait: both under mu
	in.mu.Unlock()
	go func() {
		defer in.wg.Done()
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-in.done:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
		defer cancel()
		if in.spare.Publish(ctx, m) == nil {
			in.count(FaultDelayedDuplicate)
		}
	}()
}

// snapshot returns the counts so far.
func (in *injector) snapshot() map[Fault]int {
	in.mu.Lock()
	defer in.mu.Unlock()
	out := make(map[Fault]int, len(in.counts))
	for k, v := range in.counts {
		out[k] = v
	}
	return out
}

// closeGate holds the orchestrator's deliveries until openGate.
func (in *injector) closeGate() {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.gate == nil {
		in.gate = make(chan struct{})
	}
}

func (in *injector) openGate() {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.gate != nil {
		close(in.gate)
		in.gate = nil
	}
}

// waitGate waits while the gate is closed.
func (in *injector) waitGate(ctx context.Context) {
	in.mu.Lock()
	g := in.gate
	in.mu.Unlock()
	if g == nil {
		return
	}
	select {
	case <-ctx.Done():
	case <-g:
	}
}

// quietDown ends the injection and waits for the delayed duplicates.
func (in *injector) quietDown() {
	in.mu.Lock()
	in.quiet.Store(true)
	in.mu.Unlock()
	in.wg.Wait()
}
