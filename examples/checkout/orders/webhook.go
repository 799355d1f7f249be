package orders

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/sagabox/sagabox/examples/checkout/contract"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/orchestrator"
)

// WebhookPath is where the orders service serves the payment provider's
// webhook.
const WebhookPath = "/webhooks/payment"

// WebhookStats counts the webhook calls the service accepted.
type WebhookStats struct {
	// Received is every call committed or recognised; Duplicates the calls
	// whose event the order's saga already had (a redelivery: nothing was
	// written).
	Received, Duplicates int64
}

// webhookCounts is the service's running WebhookStats.
type webhookCounts struct{ received, duplicates atomic.Int64 }

// WebhookStats returns the calls accepted so far by this process.
func (s *Service) WebhookStats() WebhookStats {
	return WebhookStats{Received: s.hooks.received.Load(), Duplicates: s.hooks.duplicates.Load()}
}

// Webhook returns the HTTP handler of the payment provider's webhook (a
// POST of a contract.ProviderWebhook). Each call is one transaction of the
// service's own: it sends the confirmation to the order's saga
// (orchestrator.SendEvent, addressed by the order id, the saga's start key,
// and deduplicated by the provider's event id) and records it on the
// order's row, so that both commit or neither does. A redelivered call
// (same event id) records nothing. A confirmation that arrives before the
// saga waits for it is kept by the engine until it does.
//
// It answers 200 once the confirmation is committed (or was already), 400
// or 404 for a call it can never accept, and 500 when the provider should
// call again. Each call is a span of tp (nil: none) in the trace of the
// order's saga, so that the saga's trace goes on through the webhook to the
// commands the event lets it send.
func (s *Service) Webhook(pool *pgxpool.Pool, c *orchestrator.Client, tp trace.TracerProvider) http.Handler {
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	tracer := tp.Tracer("github.com/sagabox/sagabox/examples/checkout/orders")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "POST only", http.StatusMethodNotAllowed)
			return
		}
		var hook contract.ProviderWebhook
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&hook); err != nil {
			http.Error(w, "bad webhook body: "+err.Error(), http.StatusBadRequest)
			return
		}
		if hook.Type != contract.WebhookChargeConfirmed || hook.ID == "" || hook.Reference == "" {
			http.Error(w, fmt.Sprintf("webhook %q of type %q: want a charge.confirmed event with an id and a reference", hook.ID, hook.Type), http.StatusBadRequest)
			return
		}
		ctx := r.Context()
		if sg, err := c.GetByKey(ctx, SagaName, hook.Reference); err == nil && sg.TraceParent != "" {
			ctx = propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": sg.TraceParent})
		}
		ctx, span := tracer.Start(ctx, "payment webhook", trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("checkout.order_id", hook.Reference), attribute.String("checkout.event_id", hook.ID)))
		defer span.End()
		outcome, err := s.confirm(ctx, pool, c, hook)
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		span.SetAttributes(attribute.String("checkout.outcome", string(outcome)))
		switch {
		case errors.Is(err, message.ErrNotFound):
			http.Error(w, fmt.Sprintf("no checkout for order %s", hook.Reference), http.StatusNotFound)
			return
		case err != nil:
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		s.hooks.received.Add(1)
		if outcome == orchestrator.EventDuplicate {
			s.hooks.duplicates.Add(1)
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{"outcome": string(outcome)})
	})
}

// confirm sends the confirmation hook to its order's saga and records it on
// the order, in one transaction.
func (s *Service) confirm(ctx context.Context, pool *pgxpool.Pool, c *orchestrator.Client, hook contract.ProviderWebhook) (orchestrator.EventOutcome, error) {
	var outcome orchestrator.EventOutcome
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		sent, err := orchestrator.SendEvent(ctx, c, tx, orchestrator.SagaRef{Type: SagaName, StartKey: hook.Reference},
			contract.Confirmed, hook.ID, contract.PaymentConfirmed{ChargeID: hook.ChargeID, ConfirmedAt: hook.ConfirmedAt})
		if err != nil {
			return err
		}
		outcome = sent.Outcome
		if outcome == orchestrator.EventDuplicate {
			return nil // recorded by the first delivery
		}
		_, err = tx.Exec(ctx, s.sql(`UPDATE orders.orders SET payment_confirmations = payment_confirmations + 1,
				payment_event_id = coalesce(payment_event_id, $2), payment_confirmed_at = coalesce(payment_confirmed_at, $3),
				payment_event_outcome = coalesce(payment_event_outcome, $4)
			WHERE id = $1`), hook.Reference, hook.ID, hook.ConfirmedAt, string(outcome))
		if err != nil {
			return fmt.Errorf("record the confirmation of order %s: %w", hook.Reference, err)
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("payment webhook %s for order %s: %w", hook.ID, hook.Reference, err)
	}
	c.Wake()
	return outcome, nil
}
