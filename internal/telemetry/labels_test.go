package telemetry

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Every typed outcome, reason and cause has a label of its own (the
// metric attribute values docs/operations.md and the alert rules name), and
// the zero value has none.
func TestLabels(t *testing.T) {
	t.Parallel()
	check := func(want []string, got func(i int) string) {
		t.Helper()
		for i, w := range want {
			require.Equal(t, w, got(i+1))
		}
		require.Empty(t, got(0), "the zero value has no label")
		require.Empty(t, got(len(want)+1), "past the last value")
	}
	check([]string{"applied", "rejected", "duplicate", "retry", "dead_letter", "ignored", "unknown_saga"},
		func(i int) string { return Outcome(i).String() })
	check([]string{"unknown_type", "invalid_payload", "payload_too_large", "unexpected_kind",
		"retries_exhausted", "unknown_definition", "invalid_instance", "unroutable"},
		func(i int) string { return Reason(i).String() })
	check([]string{"handler", "database", "timeout", "operator", "shutdown"}, func(i int) string { return Cause(i).String() })
	check([]string{"new", "duplicate"}, func(i int) string { return InboxOutcome(i).String() })
	require.Equal(t, OutcomeUnknownSaga.String(), "unknown_saga")
	require.Equal(t, ReasonUnroutable.String(), "unroutable")
}
