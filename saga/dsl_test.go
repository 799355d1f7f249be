package saga_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/saga"
)

func reserveReq(d *Order) ReserveReq     { return ReserveReq{OrderID: d.ID} }
func releaseReq(d *Order) ReleaseReq     { return ReleaseReq{ReservationID: d.ReservationID} }
func noop(context.Context, *Order) error { return nil }

func TestDefinitionValidation(t *testing.T) {
	t.Parallel()
	invoke := saga.Invoke(reserve, reserveReq, nil)
	tests := []struct {
		name    string
		def     string
		version int
		steps   []*saga.StepSpec[Order]
		want    []string
	}{
		{name: "empty name", def: " ", version: 1, steps: []*saga.StepSpec[Order]{saga.Step("a", invoke)},
			want: []string{`saga " " v1: name is empty`}},
		{name: "version", def: "s", version: 0, steps: []*saga.StepSpec[Order]{saga.Step("a", invoke)},
			want: []string{`saga "s" v0: version 0 is less than 1`}},
		{name: "no steps", def: "s", version: 1,
			want: []string{`saga "s" v1: no steps`}},
		{name: "nil step", def: "s", version: 1, steps: []*saga.StepSpec[Order]{nil},
			want: []string{`saga "s" v1: step 0 is nil`}},
		{name: "empty step name", def: "s", version: 1, steps: []*saga.StepSpec[Order]{saga.Step("a", invoke), saga.Step("", invoke)},
			want: []string{`saga "s" v1: step 1 has an empty name`}},
		{name: "duplicate step name", def: "s", version: 1, steps: []*saga.StepSpec[Order]{saga.Step("a", invoke), saga.LocalStep("b", noop), saga.Step("a", invoke)},
			want: []string{`saga "s" v1: step "a" (index 2) has the same name as step 0`}},
		{name: "no action", def: "s", version: 1, steps: []*saga.StepSpec[Order]{saga.Step("a", saga.Compensate(release, releaseReq))},
			want: []string{`saga "s" v1: step "a" (index 0): no action: use Invoke, or LocalStep for a local function`}},
		{name: "two actions", def: "s", version: 1, steps: []*saga.StepSpec[Order]{saga.Step("a", invoke, invoke)},
			want: []string{`saga "s" v1: step "a" (index 0): 2 actions (Invoke), want one`}},
		{name: "two compensations", def: "s", version: 1, steps: []*saga.StepSpec[Order]{saga.Step("a", invoke, saga.Compensate(release, releaseReq), saga.Compensate(release, releaseReq))},
			want: []string{`saga "s" v1: step "a" (index 0): 2 compensations (Compensate), want at most one`}},
		{name: "missing action request builder", def: "s", version: 1, steps: []*saga.StepSpec[Order]{saga.Step("a", saga.Invoke[Order](reserve, nil, nil))},
			want: []string{`saga "s" v1: step "a" (index 0): action "inventory.reserve" has no request builder`}},
		{name: "missing compensation request builder", def: "s", version: 1, steps: []*saga.StepSpec[Order]{saga.Step("a", invoke, saga.Compensate[Order](release, nil))},
			want: []string{`saga "s" v1: step "a" (index 0): compensation "inventory.release" has no request builder`}},
		{name: "empty command names", def: "s", version: 1, steps: []*saga.StepSpec[Order]{saga.Step("a",
			saga.Invoke(saga.NewCommand[ReserveReq, saga.None](""), reserveReq, nil),
			saga.Compensate(saga.NewCommand[ReleaseReq, saga.None](""), releaseReq))},
			want: []string{
				`saga "s" v1: step "a" (index 0): action command has an empty name`,
				`saga "s" v1: step "a" (index 0): compensation command has an empty name`,
			}},
		{name: "same command for action and compensation", def: "s", version: 1, steps: []*saga.StepSpec[Order]{saga.Step("a",
			invoke, saga.Compensate(saga.NewCommand[ReleaseReq, saga.None]("inventory.reserve"), releaseReq))},
			want: []string{`saga "s" v1: step "a" (index 0): action and compensation both use command "inventory.reserve", so their replies could not be told apart`}},
		{name: "retry without timeout", def: "s", version: 1, steps: []*saga.StepSpec[Order]{saga.Step("a", invoke, saga.WithRetry[Order](saga.RetryPolicy{MaxAttempts: 3}))},
			want: []string{`saga "s" v1: step "a" (index 0): retry policy allows 3 attempts but the step has no timeout, so nothing would ever trigger a retry`}},
		{name: "negative timeout", def: "s", version: 1, steps: []*saga.StepSpec[Order]{saga.Step("a", invoke, saga.WithTimeout[Order](-time.Second))},
			want: []string{`saga "s" v1: step "a" (index 0): timeout -1s is negative`}},
		{name: "zero timeout", def: "s", version: 1, steps: []*saga.StepSpec[Order]{saga.Step("a", invoke, saga.WithTimeout[Order](0))},
			want: []string{`saga "s" v1: step "a" (index 0): timeout is zero; omit WithTimeout for no timeout`}},
		{name: "bad retry policy", def: "s", version: 1, steps: []*saga.StepSpec[Order]{saga.Step("a", invoke, saga.WithTimeout[Order](time.Second),
			saga.WithRetry[Order](saga.RetryPolicy{InitialInterval: -1, BackoffCoefficient: 0.5, MaximumInterval: -1, MaxAttempts: -1}))},
			want: []string{
				`saga "s" v1: step "a" (index 0): retry policy InitialInterval -1ns is negative`,
				`saga "s" v1: step "a" (index 0): retry policy BackoffCoefficient 0.5 is less than 1 or not finite`,
				`saga "s" v1: step "a" (index 0): retry policy MaximumInterval -1ns is negative`,
				`saga "s" v1: step "a" (index 0): retry policy MaxAttempts -1 is negative`,
			}},
		{name: "maximum below initial interval", def: "s", version: 1, steps: []*saga.StepSpec[Order]{saga.Step("a", invoke, saga.WithTimeout[Order](time.Second),
			saga.WithRetry[Order](saga.RetryPolicy{InitialInterval: time.Minute, MaximumInterval: time.Second}))},
			want: []string{`saga "s" v1: step "a" (index 0): retry policy MaximumInterval 1s is less than InitialInterval 1m0s`}},
		{name: "nil predicate", def: "s", version: 1, steps: []*saga.StepSpec[Order]{saga.Step("a", invoke, saga.When[Order](nil))},
			want: []string{`saga "s" v1: step "a" (index 0): When predicate is nil`}},
		{name: "nil local function", def: "s", version: 1, steps: []*saga.StepSpec[Order]{saga.LocalStep[Order]("a", nil)},
			want: []string{`saga "s" v1: step "a" (index 0): local step function is nil`}},
		{name: "local step with action, timeout and retry", def: "s", version: 1, steps: []*saga.StepSpec[Order]{saga.LocalStep("a", noop,
			invoke, saga.WithTimeout[Order](time.Second), saga.WithRetry[Order](saga.RetryPolicy{}))},
			want: []string{
				`saga "s" v1: step "a" (index 0): a local step cannot also have an action (Invoke)`,
				`saga "s" v1: step "a" (index 0): a local step cannot have a timeout (WithTimeout)`,
				`saga "s" v1: step "a" (index 0): a local step cannot have a retry policy (WithRetry); return a plain error to have the orchestrator retry its transaction`,
			}},
		{name: "compensation timeout", def: "s", version: 1, steps: []*saga.StepSpec[Order]{
			saga.Step("a", invoke, saga.WithCompensationTimeout[Order](time.Second)),
			saga.Step("b", invoke, saga.Compensate(release, releaseReq), saga.WithCompensationTimeout[Order](-time.Second)),
		},
			want: []string{
				`saga "s" v1: step "a" (index 0): compensation timeout without a compensation (Compensate)`,
				`saga "s" v1: step "b" (index 1): compensation timeout -1s is not positive`,
			}},
		{name: "all at once", def: "", version: -2, steps: []*saga.StepSpec[Order]{saga.Step[Order]("a"), saga.Step("a", invoke)},
			want: []string{
				`saga "" v-2: name is empty`,
				`saga "" v-2: version -2 is less than 1`,
				`saga "" v-2: step "a" (index 0): no action: use Invoke, or LocalStep for a local function`,
				`saga "" v-2: step "a" (index 1) has the same name as step 0`,
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			def, err := saga.New(tt.def, tt.version, tt.steps...)
			require.Nil(t, def)
			require.ErrorIs(t, err, saga.ErrInvalidDefinition)
			want := make([]string, len(tt.want))
			for i, w := range tt.want {
				want[i] = "invalid saga definition: " + w
			}
			require.Equal(t, want, strings.Split(err.Error(), "\n"))
		})
	}
}

func TestDefinitionValidationDataType(t *testing.T) {
	t.Parallel()
	type bad struct{ C chan int }
	_, err := saga.New("s", 1, saga.LocalStep("a", func(context.Context, *bad) error { return nil }))
	require.ErrorIs(t, err, saga.ErrInvalidDefinition)
	require.EqualError(t, err, `invalid saga definition: saga "s" v1: data type saga_test.bad is not JSON-serialisable: json: unsupported type: chan int`)
}

func TestLocalStepWithCompensationIsValid(t *testing.T) {
	t.Parallel()
	_, err := saga.New("s", 1, saga.LocalStep("a", noop, saga.Compensate(release, releaseReq)))
	require.NoError(t, err)
}

func TestMustNewPanics(t *testing.T) {
	t.Parallel()
	require.PanicsWithError(t, `invalid saga definition: saga "s" v1: no steps`, func() {
		saga.MustNew[Order]("s", 1)
	})
}

func TestDefinitionSteps(t *testing.T) {
	t.Parallel()
	require.Equal(t, "checkout", checkout.Name())
	require.Equal(t, 1, checkout.Version())
	require.Equal(t, "checkout v1", checkout.String())
	def := saga.MustNew("info", 3,
		reserveStep(saga.WithCompensationTimeout[Order](time.Minute), saga.When(func(*Order) bool { return true })),
		saga.LocalStep("local", noop),
	)
	require.Equal(t, []saga.StepInfo{
		{
			Name: "reserve-stock", Action: "inventory.reserve", Compensation: "inventory.release",
			Timeout: reserveTimeout, CompensationTimeout: time.Minute, Conditional: true,
			Retry: saga.RetryPolicy{InitialInterval: time.Second, BackoffCoefficient: 2, MaximumInterval: 100 * time.Second, MaxAttempts: 3},
		},
		{Name: "local", Local: true, Retry: saga.RetryPolicy{}.WithDefaults()},
	}, def.Steps())
}

func TestDefinitionIsIsolatedFromItsSpecs(t *testing.T) {
	t.Parallel()
	spec := saga.Step("a", saga.Invoke(reserve, reserveReq, nil))
	def := saga.MustNew("iso", 1, spec)
	// Reusing the spec in another definition changes neither.
	def2 := saga.MustNew("iso", 2, spec)
	require.Equal(t, def.Steps(), def2.Steps())
}

func TestDataEncoding(t *testing.T) {
	t.Parallel()
	raw, err := checkout.EncodeData(Order{ID: "o", Amount: 2})
	require.NoError(t, err)
	require.JSONEq(t, `{"id":"o","amount":2}`, string(raw))
	d, err := checkout.DecodeData([]byte(`{"id":"o","amount":2,"removed_field":true}`))
	require.NoError(t, err)
	require.Equal(t, Order{ID: "o", Amount: 2}, d)
	_, err = checkout.DecodeData([]byte(`{"id":3}`))
	require.ErrorIs(t, err, saga.ErrInvalidPayload)
}
