package saga

import "context"

// LocalScope runs one local step: it calls run with a context of its
// choice and returns run's error, or its own if it could not set the step
// up or close it. The orchestrator uses it to run each local step under a
// savepoint of its transaction, so that the writes of a step that fails or
// rejects are rolled back while those of the steps before it are kept.
type LocalScope func(ctx context.Context, run func(ctx context.Context) error) error

type localScopeKey struct{}

// WithLocalScope returns a copy of ctx in which Start and Apply run every
// local step through scope. Without one a local step is called with the
// context given to Start or Apply.
func WithLocalScope(ctx context.Context, scope LocalScope) context.Context {
	return context.WithValue(ctx, localScopeKey{}, scope)
}

// runScoped calls fn through ctx's LocalScope, if any.
func runScoped(ctx context.Context, fn func(ctx context.Context) error) error {
	if scope, _ := ctx.Value(localScopeKey{}).(LocalScope); scope != nil {
		return scope(ctx, fn)
	}
	return fn(ctx)
}
