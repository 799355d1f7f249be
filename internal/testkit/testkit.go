// Package testkit holds what the tests of every sagabox package share: a
// TestMain that checks that no goroutine outlives the tests, a way to run a
// blocking loop (a client's Run, a Subscribe) for the length of a test, a
// wait for a condition, and a log buffer that goroutines may write to while
// the test reads it. Its subpackages serve one server or concern each:
// dbtest (PostgreSQL), amqptest (RabbitMQ), servers (private servers to stop
// and kill), secrettest and telemetrytest.
package testkit

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// ignoredGoroutines are the goroutines the leak check of WrapTestMain
// passes over: a pgxpool's health check, which Pool.Close signals to stop
// without waiting for it to return.
var ignoredGoroutines = []goleak.Option{
	goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
}

// WrapTestMain runs the tests of m, then each of after (to stop what the
// package's tests shared, such as a private server: they run whether the
// tests passed or not), and then, if the tests passed, checks that no
// goroutine outlives them (goleak), which fails the run. It ends the process
// with the tests' exit code. Call it from TestMain, after anything that makes
// the test binary act as another program:
//
//	func TestMain(m *testing.M) { testkit.WrapTestMain(m) }
func WrapTestMain(m *testing.M, after ...func()) {
	code := m.Run()
	for _, f := range after {
		f()
	}
	if code == 0 {
		if err := goleak.Find(ignoredGoroutines...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak: goroutines outlive the tests:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// StopWait bounds how long Run waits for its function to return once its
// context is cancelled: longer than the clients' default stop timeout
// (30s), within which their Run drains the work in flight.
const StopWait = time.Minute

// Run runs fn in a goroutine of its own, with a context that is cancelled
// when stop is called or the test ends, whichever comes first; then it waits
// for fn to return (the test fails if that takes longer than StopWait). stop
// returns fn's error and may be called more than once. If the test never
// calls stop, fn must return nil: the test fails otherwise. Use it for a
// loop that blocks until its context ends, such as a client's Run or a
// Subscribe:
//
//	testkit.Run(t, client.Run)
func Run(t testing.TB, fn func(ctx context.Context) error) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	var (
		once     sync.Once
		returned error // fn's
		taken    atomic.Bool
	)
	end := func() error {
		once.Do(func() {
			cancel()
			select {
			case returned = <-done:
			case <-time.After(StopWait):
				t.Errorf("testkit.Run: the function did not return within %s of its context's end", StopWait)
			}
		})
		return returned
	}
	t.Cleanup(func() {
		if err := end(); err != nil && !taken.Load() {
			t.Errorf("testkit.Run: the function run until the test ended returned %v", err)
		}
	})
	return func() error {
		taken.Store(true)
		return end()
	}
}

// PollEvery is how often WaitFor checks its condition.
const PollEvery = 20 * time.Millisecond

// WaitFor checks cond, in the calling goroutine (so cond may use require),
// at once and then every PollEvery until it holds, and fails the test
// (Fatalf, naming what it waited for) if it does not hold within timeout.
// It is how a test waits for something to happen, never by sleeping.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(PollEvery)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		<-tick.C
	}
}

// Buffer is a bytes.Buffer that goroutines may write to (a logger's output)
// while the test reads it. The zero value is empty and ready to use.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p to the buffer.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
