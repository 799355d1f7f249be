package payment

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sagabox/sagabox/examples/checkout/contract"
)

// Provider is the example's outside payment provider: an HTTP server the
// example starts in-process, standing for a card processor's API. It holds
// the customers' funds (the account table) and applies each idempotency key
// once: a call with a key it saw answers as the first one did. It counts the
// calls it gets, so that the example can show that a crash or a redelivery
// made no second charge. Its tables are its own; it writes them outside the
// payment service's transactions.
//
// Like a card processor, it confirms each charge later, asynchronously, by
// calling the merchant's webhook (ProviderConfig.WebhookURLs) with a
// contract.ProviderWebhook: the confirmation is written with the charge and
// delivered until the webhook answers 2xx, so it may arrive more than once
// (after a lost answer, a crash, or on purpose: some are sent twice), always
// with the same event id. Charges of an account on hold
// (Service.HoldConfirmations) are never confirmed.
type Provider struct {
	s      *Service
	pool   *pgxpool.Pool
	srv    *http.Server
	url    string
	done   chan struct{}
	hooks  []string
	client *http.Client
	wake   chan struct{}
	stop   context.CancelFunc
	log    *slog.Logger

	mu    sync.Mutex
	calls map[string]int
	sent  int
	twice int
	// confirmations counts the confirmations delivered: every fourth is
	// sent twice.
	confirmations int
}

// ProviderConfig configures a Provider.
type ProviderConfig struct {
	// WebhookURLs are the merchant's webhook endpoints, tried in turn until
	// one answers 2xx (several: instances of the orders service). None: the
	// confirmations are kept undelivered.
	WebhookURLs []string
	// Logger receives the webhook calls that keep failing. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

// ProviderStats counts a provider's calls.
type ProviderStats struct {
	// Calls is every call received; Keys the distinct idempotency keys.
	Calls, Keys int
	// WebhooksSent counts the webhook calls that were answered 2xx;
	// SentTwice the confirmations sent twice on purpose.
	WebhooksSent, SentTwice int
}

// StartProvider starts the provider of s on a local port, keeping its
// state in s's schema (its tables are created by Service.Setup), and its
// webhook deliveries. Close stops both.
func StartProvider(ctx context.Context, pool *pgxpool.Pool, s *Service, cfg ProviderConfig) (*Provider, error) {
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("payment provider: listen: %w", err)
	}
	p := &Provider{
		s: s, pool: pool, url: "http://" + ln.Addr().String(), done: make(chan struct{}), calls: map[string]int{},
		hooks: cfg.WebhookURLs, client: &http.Client{Timeout: 5 * time.Second}, wake: make(chan struct{}, 1),
		log: cfg.Logger,
	}
	if p.log == nil {
		p.log = slog.Default()
	}
	p.log = p.log.With("component", "payment-provider")
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charge", p.charge)
	mux.HandleFunc("POST /refund", p.refund)
	p.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	deliverCtx, stop := context.WithCancel(context.Background())
	p.stop = stop
	var wg sync.WaitGroup
	wg.Go(func() { _ = p.srv.Serve(ln) })
	wg.Go(func() { p.deliver(deliverCtx) })
	go func() {
		wg.Wait()
		close(p.done)
	}()
	return p, nil
}

// URL is the provider's base URL.
func (p *Provider) URL() string { return p.url }

// Stats returns the calls received so far.
func (p *Provider) Stats() ProviderStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := ProviderStats{Keys: len(p.calls), WebhooksSent: p.sent, SentTwice: p.twice}
	for _, n := range p.calls {
		st.Calls += n
	}
	return st
}

// Close stops the provider.
func (p *Provider) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := p.srv.Shutdown(ctx)
	p.stop()
	<-p.done
	return err
}

// errInProgress: another call with the same key is being applied.
var errInProgress = errors.New("a call with this key is in progress")

// providerRequest is the body of a call: a charge names the customer and
// the amount, a refund the charge's idempotency key.
type providerRequest struct {
	Customer    string `json:"customer,omitempty"`
	AmountCents int64  `json:"amount_cents,omitempty"`
	ChargeKey   string `json:"charge_key,omitempty"`
	// Reference is the merchant's name for what a charge pays for (the
	// order id), given back in the confirmation.
	Reference string `json:"reference,omitempty"`
}

// providerReply is the answer: the operation's status ("charged",
// "declined", "refunded", "nothing_to_refund") and its id (the key).
type providerReply struct {
	Status string `json:"status"`
	ID     string `json:"id"`
}

func (p *Provider) begin(w http.ResponseWriter, r *http.Request) (string, providerRequest, bool) {
	key := r.Header.Get("Idempotency-Key")
	var req providerRequest
	if key == "" {
		http.Error(w, "Idempotency-Key is required", http.StatusBadRequest)
		return "", req, false
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, "bad request: "+err.Error(), http.StatusBadRequest)
		return "", req, false
	}
	p.mu.Lock()
	p.calls[key]++
	p.mu.Unlock()
	return key, req, true
}

// apply runs fn in a transaction unless key was applied before, and
// answers with the key's status.
func (p *Provider) apply(w http.ResponseWriter, r *http.Request, key string, fn func(tx pgx.Tx) (string, error)) {
	var status string
	err := pgx.BeginFunc(r.Context(), p.pool, func(tx pgx.Tx) error {
		err := tx.QueryRow(r.Context(), p.s.sql(`SELECT status FROM payment.provider_op WHERE key = $1`), key).Scan(&status)
		if !errors.Is(err, pgx.ErrNoRows) {
			return err // seen before: the same answer, no second effect
		}
		status, err = fn(tx)
		return err
	})
	switch {
	case errors.Is(err, errInProgress):
		http.Error(w, "a call with this key is in progress", http.StatusConflict)
		return
	case err != nil:
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	code := http.StatusOK
	if status == "declined" {
		code = http.StatusPaymentRequired
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(providerReply{Status: status, ID: key})
}

func (p *Provider) charge(w http.ResponseWriter, r *http.Request) {
	key, req, ok := p.begin(w, r)
	if !ok {
		return
	}
	p.apply(w, r, key, func(tx pgx.Tx) (string, error) {
		var confirms bool
		err := tx.QueryRow(r.Context(), p.s.sql(`UPDATE payment.account SET balance_cents = balance_cents - $2
			WHERE customer = $1 AND balance_cents >= $2 RETURNING confirms`), req.Customer, req.AmountCents).Scan(&confirms)
		status := "charged"
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			status = "declined"
		case err != nil:
			return "", err
		}
		if err := p.record(r.Context(), tx, `INSERT INTO payment.provider_op (key, status, customer, amount_cents) VALUES ($1, $2, $3, $4)
			ON CONFLICT (key) DO NOTHING`, key, status, req.Customer, req.AmountCents); err != nil {
			return "", err
		}
		if status == "charged" && confirms {
			// The confirmation goes out later: at once for half of the
			// charges (it then often reaches the merchant before the
			// charge's reply has reached its saga), a moment later for the
			// others.
			var delay time.Duration
			if hash(key)%2 == 1 {
				delay = 250 * time.Millisecond
			}
			if _, err := tx.Exec(r.Context(), p.s.sql(`INSERT INTO payment.provider_webhook (event_id, charge_id, reference, confirmed_at, next_at)
				VALUES ($1, $2, $3, now(), now() + $4::float8 * interval '1 millisecond')`), "evt-"+key, key, req.Reference, delay.Milliseconds()); err != nil {
				return "", err
			}
			p.nudge()
		}
		return status, nil
	})
}

func (p *Provider) refund(w http.ResponseWriter, r *http.Request) {
	key, req, ok := p.begin(w, r)
	if !ok {
		return
	}
	p.apply(w, r, key, func(tx pgx.Tx) (string, error) {
		var customer string
		var amount int64
		err := tx.QueryRow(r.Context(), p.s.sql(`UPDATE payment.provider_op SET status = 'refunded'
			WHERE key = $1 AND status = 'charged' RETURNING customer, amount_cents`), req.ChargeKey).Scan(&customer, &amount)
		status := "refunded"
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			status = "nothing_to_refund"
		case err != nil:
			return "", err
		default:
			if _, err := tx.Exec(r.Context(), p.s.sql(`UPDATE payment.account SET balance_cents = balance_cents + $2 WHERE customer = $1`), customer, amount); err != nil {
				return "", err
			}
		}
		return status, p.record(r.Context(), tx, `INSERT INTO payment.provider_op (key, status, charge_key) VALUES ($1, $2, $3)
			ON CONFLICT (key) DO NOTHING`, key, status, req.ChargeKey)
	})
}

// record runs insert, which records a key's operation; a key that another
// call recorded meanwhile rolls this one back.
func (p *Provider) record(ctx context.Context, tx pgx.Tx, insert string, args ...any) error {
	tag, err := tx.Exec(ctx, p.s.sql(insert), args...)
	switch {
	case err != nil:
		return err
	case tag.RowsAffected() == 0:
		return errInProgress
	}
	return nil
}

// hash is a stable hash of s, for the provider's deterministic choices.
func hash(s string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(s))
	return h.Sum32()
}

func (p *Provider) nudge() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Webhook delivery: how many confirmations one pass claims, how long a
// claim lasts (a provider that dies mid-call leaves the rest to another
// after it), and the poll interval between passes.
const (
	webhookBatch = 32
	webhookLease = 5 * time.Second
	webhookPoll  = 100 * time.Millisecond
)

// deliver sends the due confirmations to the webhook until ctx ends.
func (p *Provider) deliver(ctx context.Context) {
	if len(p.hooks) == 0 {
		return
	}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		case <-t.C:
		}
		n, err := p.deliverDue(ctx)
		wait := webhookPoll
		switch {
		case err != nil:
			wait = time.Second // the database is away: try again later
		case n == webhookBatch:
			wait = 0
		}
		t.Reset(wait)
	}
}

// dueWebhook is a confirmation claimed for delivery.
type dueWebhook struct {
	hook     contract.ProviderWebhook
	attempts int
}

// deliverDue claims the due confirmations, calls the webhook with each and
// records the answer, and returns how many it claimed.
func (p *Provider) deliverDue(ctx context.Context) (int, error) {
	rows, err := p.pool.Query(ctx, p.s.sql(`
		UPDATE payment.provider_webhook w SET attempts = w.attempts + 1, next_at = now() + $1::float8 * interval '1 millisecond'
		FROM (SELECT event_id FROM payment.provider_webhook WHERE delivered_at IS NULL AND next_at <= now()
			ORDER BY next_at LIMIT $2 FOR UPDATE SKIP LOCKED) due
		WHERE w.event_id = due.event_id
		RETURNING w.event_id, w.charge_id, w.reference, w.confirmed_at, w.attempts`), webhookLease.Milliseconds(), webhookBatch)
	if err != nil {
		return 0, fmt.Errorf("payment provider: claim webhooks: %w", err)
	}
	due, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (dueWebhook, error) {
		d := dueWebhook{hook: contract.ProviderWebhook{Type: contract.WebhookChargeConfirmed}}
		return d, row.Scan(&d.hook.ID, &d.hook.ChargeID, &d.hook.Reference, &d.hook.ConfirmedAt, &d.attempts)
	})
	if err != nil {
		return 0, fmt.Errorf("payment provider: claim webhooks: %w", err)
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for _, d := range due {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			p.deliverOne(ctx, d)
		})
	}
	wg.Wait()
	return len(due), nil
}

// deliverOne calls the webhook with d (twice for every fourth
// confirmation, as providers that deliver at least once sometimes do) and
// marks it delivered, or due again after a backoff. A confirmation not
// marked (a crash, the database away) is sent again once its lease ends,
// and recognised by the merchant by its event id.
func (p *Provider) deliverOne(ctx context.Context, d dueWebhook) {
	times := 1
	p.mu.Lock()
	if p.confirmations%4 == 0 {
		times = 2
	}
	p.confirmations++
	p.mu.Unlock()
	sent := 0
	for range times {
		if err := p.post(ctx, d); err != nil {
			// A short outage (a restart of the orders service or the
			// database) is expected; a call that keeps failing is not.
			if d.attempts >= 5 && ctx.Err() == nil {
				p.log.Warn("payment webhook call failed; calling again later", "event_id", d.hook.ID, "attempt", d.attempts, "err", err)
			}
			break
		}
		sent++
	}
	p.mu.Lock()
	p.sent += sent
	if sent == 2 {
		p.twice++
	}
	p.mu.Unlock()
	if sent == 0 {
		backoff := min(50*time.Millisecond<<min(d.attempts-1, 5), time.Second)
		_, _ = p.pool.Exec(ctx, p.s.sql(`UPDATE payment.provider_webhook SET next_at = now() + $2::float8 * interval '1 millisecond' WHERE event_id = $1`),
			d.hook.ID, backoff.Milliseconds())
		return
	}
	_, _ = p.pool.Exec(ctx, p.s.sql(`UPDATE payment.provider_webhook SET delivered_at = now(), sends = sends + $2 WHERE event_id = $1`),
		d.hook.ID, sent)
}

// post calls the webhook URLs in turn, starting at one chosen by the
// attempt, until one answers 2xx.
func (p *Provider) post(ctx context.Context, d dueWebhook) error {
	body, err := json.Marshal(d.hook)
	if err != nil {
		return err
	}
	var last error
	for i := range p.hooks {
		url := p.hooks[(d.attempts+i)%len(p.hooks)]
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := p.client.Do(req)
		if err != nil {
			last = err
			continue
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<12))
		_ = resp.Body.Close()
		if resp.StatusCode/100 == 2 {
			return nil
		}
		last = fmt.Errorf("webhook %s: %s", url, resp.Status)
	}
	return last
}
