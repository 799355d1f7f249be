package testkit_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit"
)

// leakEnv, when set, makes this test binary leak a goroutine in
// TestLeakAGoroutine, for TestWrapTestMainFailsOnALeak.
const leakEnv = "TESTKIT_TEST_LEAK"

func TestMain(m *testing.M) {
	testkit.WrapTestMain(m, func() {
		if os.Getenv(leakEnv) != "" {
			fmt.Println("after the tests")
		}
	})
}

// TestLeakAGoroutine leaks a goroutine when run by
// TestWrapTestMainFailsOnALeak; otherwise it does nothing.
func TestLeakAGoroutine(t *testing.T) {
	if os.Getenv(leakEnv) == "" {
		return
	}
	block := make(chan struct{})
	go func() { <-block }()
}

// A goroutine that outlives passing tests fails the run, after the
// functions that stop what the tests shared.
func TestWrapTestMainFailsOnALeak(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run", "^TestLeakAGoroutine$")
	cmd.Env = append(os.Environ(), leakEnv+"=1")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "the run fails:\n%s", out)
	require.Equal(t, 1, exit.ExitCode(), string(out))
	require.Contains(t, string(out), "after the tests")
	require.Contains(t, string(out), "goleak: goroutines outlive the tests")
	require.Contains(t, string(out), "TestLeakAGoroutine", "the leaked goroutine is named")
}

// fakeT records what a helper reports to its test; Fatalf ends the
// goroutine, as testing.T's does.
type fakeT struct {
	testing.TB
	mu       sync.Mutex
	errors   []string
	cleanups []func()
}

func (f *fakeT) Helper() {}

func (f *fakeT) Errorf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errors = append(f.errors, fmt.Sprintf(format, args...))
}

func (f *fakeT) Fatalf(format string, args ...any) {
	f.Errorf(format, args...)
	runtime.Goexit()
}

func (f *fakeT) Cleanup(fn func()) { f.cleanups = append(f.cleanups, fn) }

// end runs the cleanups, as the end of a test does, and returns what was
// reported.
func (f *fakeT) end() []string {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.errors
}

// blockUntilDone returns err once its context ends.
func blockUntilDone(err error) func(context.Context) error {
	return func(ctx context.Context) error {
		<-ctx.Done()
		return err
	}
}

func TestRunEndsTheFunctionWhenTheTestEnds(t *testing.T) {
	t.Parallel()
	ft := &fakeT{}
	ended := make(chan struct{})
	testkit.Run(ft, func(ctx context.Context) error {
		defer close(ended)
		<-ctx.Done()
		return nil
	})
	select {
	case <-ended:
		t.Fatal("the function ended before the test")
	default:
	}
	require.Empty(t, ft.end())
	<-ended
}

func TestRunFailsTheTestOnAnErrorNobodyTook(t *testing.T) {
	t.Parallel()
	ft := &fakeT{}
	testkit.Run(ft, blockUntilDone(errors.New("drain failed")))
	errs := ft.end()
	require.Len(t, errs, 1)
	require.Contains(t, errs[0], "drain failed")
}

func TestRunStopHandsTheErrorToTheTest(t *testing.T) {
	t.Parallel()
	ft := &fakeT{}
	boom := errors.New("boom")
	stop := testkit.Run(ft, blockUntilDone(boom))
	require.ErrorIs(t, stop(), boom)
	require.ErrorIs(t, stop(), boom, "stop may be called again")
	require.Empty(t, ft.end(), "the test took the error")
}

func TestWaitForReturnsOnceTheConditionHolds(t *testing.T) {
	t.Parallel()
	n := 0
	testkit.WaitFor(t, time.Minute, "the third check", func() bool {
		n++
		return n == 3
	})
	require.Equal(t, 3, n)
}

func TestWaitForFailsAfterTheTimeout(t *testing.T) {
	t.Parallel()
	ft := &fakeT{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		testkit.WaitFor(ft, 50*time.Millisecond, "nothing", func() bool { return false })
	}()
	<-done
	require.Equal(t, []string{"timed out after 50ms waiting for nothing"}, ft.end())
}

func TestBufferTakesConcurrentWrites(t *testing.T) {
	t.Parallel()
	var b testkit.Buffer
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 100 {
				_, _ = b.Write([]byte("x"))
				_ = b.String()
			}
		})
	}
	wg.Wait()
	require.Len(t, b.String(), 400)
}
