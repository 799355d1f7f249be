package payment

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Provider is the example's outside payment provider: an HTTP server the
// example starts in-process, standing for a card processor's API. It holds
// the customers' funds (the account table) and applies each idempotency key
// once: a call with a key it saw answers as the first one did. It counts the
// calls it gets, so that the example can show that a crash or a redelivery
// made no second charge. Its tables are its own; it writes them outside the
// payment service's transactions.
type Provider struct {
	s    *Service
	pool *pgxpool.Pool
	srv  *http.Server
	url  string
	done chan struct{}

	mu    sync.Mutex
	calls map[string]int
}

// ProviderStats counts a provider's calls.
type ProviderStats struct {
	// Calls is every call received; Keys the distinct idempotency keys.
	Calls, Keys int
}

// StartProvider starts the provider of s on a local port, keeping its
// state in s's schema (its tables are created by Service.Setup). Close
// stops it.
func StartProvider(ctx context.Context, pool *pgxpool.Pool, s *Service) (*Provider, error) {
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("payment provider: listen: %w", err)
	}
	p := &Provider{s: s, pool: pool, url: "http://" + ln.Addr().String(), done: make(chan struct{}), calls: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charge", p.charge)
	mux.HandleFunc("POST /refund", p.refund)
	p.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		defer close(p.done)
		_ = p.srv.Serve(ln)
	}()
	return p, nil
}

// URL is the provider's base URL.
func (p *Provider) URL() string { return p.url }

// Stats returns the calls received so far.
func (p *Provider) Stats() ProviderStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := ProviderStats{Keys: len(p.calls)}
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
		tag, err := tx.Exec(r.Context(), p.s.sql(`UPDATE payment.account SET balance_cents = balance_cents - $2
			WHERE customer = $1 AND balance_cents >= $2`), req.Customer, req.AmountCents)
		if err != nil {
			return "", err
		}
		status := "charged"
		if tag.RowsAffected() == 0 {
			status = "declined"
		}
		return status, p.record(r.Context(), tx, `INSERT INTO payment.provider_op (key, status, customer, amount_cents) VALUES ($1, $2, $3, $4)
			ON CONFLICT (key) DO NOTHING`, key, status, req.Customer, req.AmountCents)
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
