package saga_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/saga"
)

type Paid struct {
	Reference string `json:"reference"`
}

var paid = saga.NewEventType[Paid]("payment.confirmed")

// everyKind has a step of every kind: commands with and without a
// compensation, a parallel group, a wait, a local step and a conditional
// step.
func everyKind() *saga.Definition[Order] {
	return saga.MustNew("every-kind", 3,
		reserveStep(saga.WithCompensationTimeout[Order](time.Minute)),
		saga.Parallel("pay-and-tell", chargeStep(), notifyStep()),
		saga.WaitEvent("await-payment", paid, nil, saga.WithTimeout[Order](time.Hour)),
		saga.LocalStep("mark-paid", note("paid"), saga.When(func(d *Order) bool { return !d.Gift })),
		shipStep(),
	)
}

func TestShapeDescribesEveryKindOfStep(t *testing.T) {
	t.Parallel()
	sh := everyKind().Shape()
	require.Equal(t, saga.ShapeFormat, sh.Format)
	require.Equal(t, "every-kind", sh.Name)
	require.Equal(t, 3, sh.Version)
	retry := saga.RetryPolicy{MaxAttempts: 3, InitialInterval: time.Second}.WithDefaults()
	once := saga.RetryPolicy{}.WithDefaults()
	require.Equal(t, []saga.ShapeNode{
		{Kind: saga.NodeStep, Name: "reserve-stock", Index: 0, Action: "inventory.reserve", Compensation: "inventory.release",
			Timeout: reserveTimeout, CompensationTimeout: time.Minute, Retry: &retry},
		{Kind: saga.NodeParallel, Name: "pay-and-tell", Index: 1, Branches: []saga.ShapeNode{
			{Kind: saga.NodeStep, Name: "charge-card", Index: 1, Action: "payment.charge", Compensation: "payment.refund",
				Timeout: chargeTimeout, Retry: &once},
			{Kind: saga.NodeStep, Name: "notify-customer", Index: 2, Action: "mail.notify", Retry: &once},
		}},
		{Kind: saga.NodeWait, Name: "await-payment", Index: 3, Event: "payment.confirmed", Timeout: time.Hour},
		{Kind: saga.NodeLocal, Name: "mark-paid", Index: 4, Conditional: true},
		{Kind: saga.NodeStep, Name: "ship", Index: 5, Action: "shipping.ship", Compensation: "shipping.cancel", Retry: &once},
	}, sh.Nodes)

	var names []string
	for i, s := range sh.Steps() {
		require.Equal(t, i, s.Index, "Steps()[i] is step i")
		names = append(names, s.Name)
	}
	require.Equal(t, []string{"reserve-stock", "charge-card", "notify-customer", "await-payment", "mark-paid", "ship"}, names)
	for _, n := range sh.Nodes {
		require.True(t, n.Kind.Known(), n.Kind)
	}
	require.False(t, saga.NodeKind("timer").Known(), "a kind of a later version")
}

// The JSON is what the orchestrator records and tools read: it goes back
// to the same Shape, and its keys are snake_case.
func TestShapeRoundTripsThroughJSON(t *testing.T) {
	t.Parallel()
	sh := everyKind().Shape()
	b, err := json.Marshal(sh)
	require.NoError(t, err)
	var back saga.Shape
	require.NoError(t, json.Unmarshal(b, &back))
	require.Equal(t, sh, back)
	require.Contains(t, string(b), `"compensation_timeout_seconds":60`)
	require.Contains(t, string(b), `"retry":{"max_attempts":3,"initial_interval_seconds":1,"backoff_coefficient":2,"maximum_interval_seconds":100}`)
	require.Contains(t, string(b), `"kind":"parallel"`)
	require.NotContains(t, string(b), `"branches":null`)

	// A reader of this version takes a shape of a later one: unknown kinds
	// and fields are kept or ignored, not refused.
	later := `{"format":1,"name":"x","version":1,"nodes":[{"kind":"timer","name":"cool-off","index":0,"sleep_seconds":5,"timeout_seconds":0.25}]}`
	require.NoError(t, json.Unmarshal([]byte(later), &back))
	require.Equal(t, saga.NodeKind("timer"), back.Nodes[0].Kind)
	require.Equal(t, 250*time.Millisecond, back.Nodes[0].Timeout)
}

// ShapeOf works from any Runner's Steps; a definition of consecutive
// groups keeps them apart.
func TestShapeOfKeepsConsecutiveGroupsApart(t *testing.T) {
	t.Parallel()
	def := saga.MustNew("two-groups", 1,
		saga.Parallel("first", reserveStep(), chargeStep()),
		saga.Parallel("second", notifyStep(), shipStep()),
	)
	sh := saga.ShapeOf(def)
	require.Len(t, sh.Nodes, 2)
	require.Equal(t, "first", sh.Nodes[0].Name)
	require.Equal(t, 0, sh.Nodes[0].Index)
	require.Equal(t, "second", sh.Nodes[1].Name)
	require.Equal(t, 2, sh.Nodes[1].Index)
	require.Len(t, sh.Nodes[1].Branches, 2)
	require.Equal(t, sh, def.Shape())
}
