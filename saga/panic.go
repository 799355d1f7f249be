package saga

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// PanicError is the error Start and Apply return when a function of the
// definition panicked: a request builder, a reply's apply function, a
// predicate, a local step. The core turns the panic into this error, so
// that one saga whose code is broken is handled like one whose code
// returned an error (the orchestrator records it on the saga, or retries
// the reply and then dead-letters it) instead of crashing the process that
// runs every saga.
type PanicError struct {
	// Value is what the function panicked with.
	Value any
	// At is the function, file and line that panicked, when known.
	At string
	// Stack is the goroutine's stack at the panic.
	Stack []byte
}

// Error reports the panic's value and where it happened.
func (e *PanicError) Error() string {
	if e.At == "" {
		return fmt.Sprintf("%v: %v", ErrPanicked, e.Value)
	}
	return fmt.Sprintf("%v: %v (at %s)", ErrPanicked, e.Value, e.At)
}

// Unwrap returns ErrPanicked.
func (e *PanicError) Unwrap() error { return ErrPanicked }

// recovered turns the panic value r, taken by recover in a deferred
// function, into a *PanicError. It must be called by that deferred
// function, while the panicking frames are still on the stack.
func recovered(r any) *PanicError {
	return &PanicError{Value: r, At: panicSite(), Stack: debug.Stack()}
}

// panicSite returns the first frame below runtime.gopanic outside the
// runtime: the function that panicked (or called panic).
func panicSite() string {
	pcs := make([]uintptr, 64)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(3, pcs)])
	panicking := false
	for {
		f, more := frames.Next()
		switch {
		case f.Function == "runtime.gopanic":
			panicking = true
		case panicking && !strings.HasPrefix(f.Function, "runtime."):
			return fmt.Sprintf("%s (%s:%d)", f.Function, f.File, f.Line)
		}
		if !more {
			return ""
		}
	}
}
