package saga

import "errors"

// Sentinel errors. Errors returned by this package wrap them with the name,
// version, step or field at fault; test for them with errors.Is.
var (
	// ErrInvalidDefinition is wrapped by every problem New reports about a
	// definition.
	ErrInvalidDefinition = errors.New("invalid saga definition")
	// ErrUnknownDefinition is returned by Registry lookups for a name and
	// version that were never registered.
	ErrUnknownDefinition = errors.New("unknown saga definition")
	// ErrInvalidInstance means an Instance does not belong to the definition
	// it was applied to or is internally inconsistent (a corrupt row).
	ErrInvalidInstance = errors.New("invalid saga instance")
	// ErrInvalidEvent means an Event is malformed: unknown kind, missing time.
	// Stale or duplicate replies are not errors: Apply ignores them.
	ErrInvalidEvent = errors.New("invalid saga event")
	// ErrInvalidTransition means an operator action is not allowed in the
	// saga's current status, e.g. retrying a completed saga.
	ErrInvalidTransition = errors.New("invalid saga transition")
	// ErrInvalidPayload means a JSON payload does not decode into the type a
	// command contract or definition expects.
	ErrInvalidPayload = errors.New("invalid payload")
	// ErrStartKeyConflict means a start key already names a saga of the
	// same definition, started with different data.
	ErrStartKeyConflict = errors.New("start key conflict")
	// ErrRejected marks a business rejection: a step said "no", and the saga
	// compensates instead of retrying. Create one with Reject.
	ErrRejected = errors.New("rejected")
	// ErrPanicked is wrapped by the error (a *PanicError) that Start and
	// Apply return when a function of the definition panicked.
	ErrPanicked = errors.New("saga definition code panicked")
)

// Reject marks err as a business rejection. When a local step returns it (or
// any error wrapping ErrRejected) the saga compensates; any other error from
// a local step is transient and is returned by Start or Apply so that the
// orchestrator retries its whole transaction. The returned error's message
// is err's message; errors.Is(Reject(err), ErrRejected) is true and
// errors.Is(Reject(err), err) still holds. Reject(nil) returns nil.
func Reject(err error) error {
	if err == nil {
		return nil
	}
	return &rejectedError{err: err}
}

type rejectedError struct{ err error }

// Error returns the wrapped error's message.
func (e *rejectedError) Error() string { return e.err.Error() }

// Unwrap returns ErrRejected and the wrapped error.
func (e *rejectedError) Unwrap() []error { return []error{ErrRejected, e.err} }
