package saga_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/saga/sagatest"
)

// explode is the panicking function of the definitions below: an order
// without an id dereferences a nil pointer.
func explode(d *Order) string {
	var missing *Order
	if d.ID == "" {
		return missing.ID
	}
	return d.ID
}

// requirePanicError checks that err is the PanicError of a nil dereference
// in explode.
func requirePanicError(t *testing.T, err error) {
	t.Helper()
	require.ErrorIs(t, err, saga.ErrPanicked)
	var perr *saga.PanicError
	require.ErrorAs(t, err, &perr)
	require.Contains(t, err.Error(), "nil pointer dereference")
	require.Contains(t, perr.At, "saga_test.explode", "the error names the function that panicked")
	require.Contains(t, perr.At, "(panic_test.go:", "the file's base name and line")
	require.Contains(t, string(perr.Stack), "saga_test.explode")
}

// A panic in a definition's function is the error of Start or Apply, never
// a panic of the caller: one broken saga cannot take down the orchestrator
// that runs the others. The instance given to Apply is left as it was.
func TestDefinitionPanicsAreErrors(t *testing.T) {
	t.Parallel()
	encode := func(def *saga.Definition[Order], o Order) []byte {
		data, err := def.EncodeData(o)
		require.NoError(t, err)
		return data
	}
	t.Run("a request builder, at start", func(t *testing.T) {
		t.Parallel()
		def := saga.MustNew("builder", 1, saga.Step("reserve-stock",
			saga.Invoke(reserve, func(d *Order) ReserveReq { return ReserveReq{OrderID: explode(d)} }, nil)))
		_, err := def.Start(context.Background(), uuid.New(), encode(def, Order{}), sagatest.Epoch)
		requirePanicError(t, err)
	})
	t.Run("a reply's apply function", func(t *testing.T) {
		t.Parallel()
		def := saga.MustNew("apply", 1, saga.Step("reserve-stock",
			saga.Invoke(reserve, func(d *Order) ReserveReq { return ReserveReq{OrderID: d.ID} },
				func(d *Order, _ ReserveReply) { d.ID = ""; d.ReservationID = explode(d) })))
		started, err := def.Start(context.Background(), uuid.New(), encode(def, Order{ID: "o-1"}), sagatest.Epoch)
		require.NoError(t, err)
		inst := started.Instance
		before := inst.Steps[0]
		_, err = def.Apply(context.Background(), inst, saga.Event{
			Kind: saga.EventReplySuccess, Type: reserve.Name(), Step: "reserve-stock", StepIndex: 0, Attempt: 1,
			Payload: []byte(`{"reservation_id":"r-1"}`), At: sagatest.Epoch.Add(time.Second),
		})
		requirePanicError(t, err)
		require.Equal(t, before, inst.Steps[0], "the instance is untouched")
	})
	t.Run("a compensation's builder, when a deadline fires", func(t *testing.T) {
		t.Parallel()
		def := saga.MustNew("compensation", 1, saga.Step("reserve-stock",
			saga.Invoke(reserve, func(d *Order) ReserveReq { return ReserveReq{OrderID: d.ID} }, nil),
			saga.Compensate(release, func(d *Order) ReleaseReq { d.ID = ""; return ReleaseReq{ReservationID: explode(d)} }),
			saga.WithTimeout[Order](time.Second)))
		started, err := def.Start(context.Background(), uuid.New(), encode(def, Order{ID: "o-1"}), sagatest.Epoch)
		require.NoError(t, err)
		_, err = def.Apply(context.Background(), started.Instance, saga.Event{Kind: saga.EventTimer, At: sagatest.Epoch.Add(time.Minute)})
		requirePanicError(t, err)
	})
	t.Run("a predicate", func(t *testing.T) {
		t.Parallel()
		def := saga.MustNew("predicate", 1, reserveStep(saga.When(func(d *Order) bool { return explode(d) != "" })))
		_, err := def.Start(context.Background(), uuid.New(), encode(def, Order{}), sagatest.Epoch)
		requirePanicError(t, err)
	})
	t.Run("a huge panic value is cut", func(t *testing.T) {
		t.Parallel()
		value := strings.Repeat("é", 100<<10)
		def := saga.MustNew("huge", 1, saga.LocalStep("look", func(context.Context, *Order) error { panic(value) }))
		_, err := def.Start(context.Background(), uuid.New(), encode(def, Order{}), sagatest.Epoch)
		require.ErrorIs(t, err, saga.ErrPanicked)
		require.Less(t, len(err.Error()), 1<<10, "the error stays small enough for a row and a header")
		require.Contains(t, err.Error(), fmt.Sprintf("é… (%d bytes)", len(value)))
		require.True(t, utf8.ValidString(err.Error()))
		var perr *saga.PanicError
		require.ErrorAs(t, err, &perr)
		require.Equal(t, value, perr.Value, "the value itself is kept whole")
	})
	t.Run("a local step, which its scope sees fail", func(t *testing.T) {
		t.Parallel()
		def := saga.MustNew("local", 1, saga.LocalStep("look", func(_ context.Context, d *Order) error {
			_ = explode(d)
			return nil
		}))
		var scoped error
		ctx := saga.WithLocalScope(context.Background(), func(ctx context.Context, run func(context.Context) error) error {
			scoped = run(ctx)
			return scoped
		})
		_, err := def.Start(ctx, uuid.New(), encode(def, Order{}), sagatest.Epoch)
		requirePanicError(t, err)
		requirePanicError(t, scoped)
		require.False(t, errors.Is(scoped, saga.ErrRejected), "a panic is a failure, not a rejection")
	})
}
