package saga

import (
	"fmt"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"unicode/utf8"
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
	// At is the function, file (base name) and line that panicked, when
	// known.
	At string
	// Stack is the goroutine's stack at the panic.
	Stack []byte
}

// maxPanicValue is the most bytes of the panic's value Error reports: the
// error travels into the saga's LastError, its history and a dead letter's
// headers, and a panic with a whole payload must not make them too big to
// store or send.
const maxPanicValue = 512

// Error reports the panic's value (its first maxPanicValue bytes) and where
// it happened.
func (e *PanicError) Error() string {
	v := fmt.Sprint(e.Value)
	if len(v) > maxPanicValue {
		cut := maxPanicValue
		for cut > 0 && !utf8.RuneStart(v[cut]) {
			cut--
		}
		v = fmt.Sprintf("%s… (%d bytes)", v[:cut], len(v))
	}
	if e.At == "" {
		return fmt.Sprintf("%v: %s", ErrPanicked, v)
	}
	return fmt.Sprintf("%v: %s (at %s)", ErrPanicked, v, e.At)
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
			return fmt.Sprintf("%s (%s:%d)", f.Function, filepath.Base(f.File), f.Line)
		}
		if !more {
			return ""
		}
	}
}
