package saga_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/saga"
)

func TestRegistry(t *testing.T) {
	t.Parallel()
	v2 := saga.MustNew("checkout", 2, reserveStep())
	other := saga.MustNew("refund", 1, chargeStep())
	r := saga.NewRegistry(v2, checkout)
	require.NoError(t, r.Register(other))

	got, err := r.Lookup("checkout", 1)
	require.NoError(t, err)
	require.Same(t, checkout, got)
	got, err = r.Lookup("checkout", 2)
	require.NoError(t, err)
	require.Same(t, v2, got)

	_, err = r.Lookup("checkout", 3)
	require.ErrorIs(t, err, saga.ErrUnknownDefinition)
	require.EqualError(t, err, "unknown saga definition: checkout v3")

	got, err = r.Latest("checkout")
	require.NoError(t, err)
	require.Same(t, v2, got)
	_, err = r.Latest("nope")
	require.ErrorIs(t, err, saga.ErrUnknownDefinition)
	require.EqualError(t, err, "unknown saga definition: nope (no version)")

	var names []string
	for _, rn := range r.Runners() {
		names = append(names, rn.(interface{ String() string }).String())
	}
	require.Equal(t, []string{"checkout v1", "checkout v2", "refund v1"}, names)

	err = r.Register(saga.MustNew("new", 1, reserveStep()), saga.MustNew("checkout", 1, reserveStep()))
	require.EqualError(t, err, "register saga checkout v1: already registered")
	_, err = r.Lookup("new", 1)
	require.ErrorIs(t, err, saga.ErrUnknownDefinition, "a failed Register adds nothing")
	require.EqualError(t, new(saga.Registry).Register(other, other), "register saga refund v1: already registered")
	require.Panics(t, func() { saga.NewRegistry(other, other) })
}
