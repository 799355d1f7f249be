package orders_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/examples/checkout/contract"
	"github.com/sagabox/sagabox/examples/checkout/orders"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store"
)

// The payment webhook sends the provider's confirmation to the order's saga
// and records it on the order in one transaction: a confirmation that
// arrives before the saga waits for it is kept, a redelivery (same event
// id) records nothing, and calls it can never accept are refused.
func TestWebhookRecordsEachConfirmationOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	schema := dbtest.SchemaName(t)
	dbtest.DropSchemaOnCleanup(t, pool, schema)
	st, err := store.New(pool, schema)
	require.NoError(t, err)
	_, err = st.MigrateUp(ctx, store.AllLines...)
	require.NoError(t, err)
	svc := orders.New(orders.Config{Schema: schema})
	require.NoError(t, svc.Setup(ctx, pool))
	// No orchestrator runs: the saga stays at its first step, before the
	// step that waits for the confirmation.
	c, err := orchestrator.NewClient(orchestrator.Config{
		Pool: pool, Schema: schema, Service: contract.ServiceOrders, Definitions: []saga.Runner{svc.Saga},
	})
	require.NoError(t, err)
	started, err := svc.Place(ctx, pool, c, orders.Order{ID: "o-1", Customer: "alice", SKU: "widget", Qty: 1, AmountCents: 1200, Address: "1 Saga Street"})
	require.NoError(t, err)

	hook := httptest.NewServer(svc.Webhook(pool, c, nil))
	defer hook.Close()
	post := func(body any) (int, string) {
		t.Helper()
		b, err := json.Marshal(body)
		require.NoError(t, err)
		resp, err := http.Post(hook.URL, "application/json", bytes.NewReader(b))
		require.NoError(t, err)
		defer func() { _ = resp.Body.Close() }()
		var out struct {
			Outcome string `json:"outcome"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out.Outcome
	}
	confirmed := contract.ProviderWebhook{ID: "evt-1", Type: contract.WebhookChargeConfirmed, ChargeID: "ch-1", Reference: "o-1",
		ConfirmedAt: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}

	code, outcome := post(confirmed)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, string(orchestrator.EventKept), outcome, "the saga does not wait for it yet")
	code, outcome = post(confirmed)
	require.Equal(t, http.StatusOK, code, "a redelivery is answered as the first call was")
	require.Equal(t, string(orchestrator.EventDuplicate), outcome)

	var n int
	var eventID, recorded string
	require.NoError(t, pool.QueryRow(ctx, svc.SQL(`SELECT payment_confirmations, payment_event_id, payment_event_outcome FROM orders.orders WHERE id = 'o-1'`)).
		Scan(&n, &eventID, &recorded))
	require.Equal(t, 1, n, "recorded once")
	require.Equal(t, "evt-1", eventID)
	require.Equal(t, string(orchestrator.EventKept), recorded)
	var events int
	require.NoError(t, pool.QueryRow(ctx, svc.SQL(`SELECT count(*) FROM orders.sagabox_saga_event WHERE saga_id = $1`), started.ID).Scan(&events))
	require.Equal(t, 1, events, "the saga keeps one event")
	require.Equal(t, svc.WebhookStats(), orders.WebhookStats{Received: 2, Duplicates: 1})

	unknown := confirmed
	unknown.ID, unknown.Reference = "evt-2", "o-404"
	code, _ = post(unknown)
	require.Equal(t, http.StatusNotFound, code, "no checkout for the order")
	wrongType := confirmed
	wrongType.Type = "charge.refunded"
	code, _ = post(wrongType)
	require.Equal(t, http.StatusBadRequest, code)
	code, _ = post(map[string]string{"id": "evt-3", "surprise": "field"})
	require.Equal(t, http.StatusBadRequest, code)
}
