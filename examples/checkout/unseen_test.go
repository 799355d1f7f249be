package main

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
)

// The checkout without its loyalty service (issue 25's scenario, with a
// few orders): the orchestrator reports at start that no queue takes
// loyalty.award and loyalty.revoke, naming the saga type, the step and
// the routing key, and the sagas wait at the "fulfil" group instead of
// ending: their award is retried as unroutable and its deadline never
// starts. docs/operations.md says what an operator sees and does.
func TestCheckoutWithoutLoyaltyIsReportedAtStart(t *testing.T) {
	t.Parallel()
	webhook := freeAddr(t)
	common := append(isolated(t), "-run-id", "nl"+dbtest.SchemaName(t)[2:8], "-orders", "3", "-fail-rate", "0", "-timeout", "10s",
		"-webhook-addr", webhook, "-webhook-url", "http://"+webhook+"/webhooks/payment")
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	for _, svc := range []string{"inventory", "payment", "shipping"} { // no loyalty
		var out testkit.Buffer
		wg.Go(func() { run(ctx, append(append([]string{}, common...), "-service", svc), &out, &out) })
		require.Eventually(t, func() bool { return strings.Contains(out.String(), "service running") },
			60*time.Second, 20*time.Millisecond, "%s did not start:\n%s", svc, out.String())
	}

	var out, errOut testkit.Buffer
	code := run(context.Background(), append(append([]string{}, common...), "-service", "orders"), &out, &errOut)
	require.Equal(t, 1, code, "the sagas cannot end:\n%s\n%s", out.String(), errOut.String())
	require.Equal(t, summary{sagas: 3, running: 3}, parseSummary(t, out.String()), out.String())
	logs := errOut.String()
	for _, want := range []string{
		`msg="no queue takes a command of a saga definition`,
		`saga_type=checkout version=1 step=award-points phase=action routing_key=loyalty.award`,
		`saga_type=checkout version=1 step=award-points phase=compensation routing_key=loyalty.revoke`,
		`sagabox doctor`,
	} {
		require.Contains(t, logs, want)
	}
	for _, routable := range []string{"inventory.reserve", "payment.charge", "shipping.ship"} {
		require.NotContains(t, logs, "routing_key="+routable, "a queue takes %s", routable)
	}
	require.Contains(t, errOut.String(), "3 sagas still running after 10s")
}
