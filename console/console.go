// Package console is sagabox's web console: an http.Handler that shows the
// sagas of an orchestrator's schema (a filtered, paged list and each saga's
// timeline: steps, attempts, barrier decisions, history, operator actions,
// trace id, and two pictures: its definition's graph with its current step
// highlighted, and its run as a Gantt-like timeline), the outbox backlog and
// dead letters of every schema it is given, and the pending operator
// requests. Pages, pictures included, are server-rendered from embedded
// templates: there is nothing to build and no JavaScript.
//
// The console is read-only unless Config.AllowActions is set. Then it
// offers retry, cancel, terminate and restart of a saga (recorded as
// operator requests, which a running orchestrator of the schema applies,
// like the CLI's) and replay of a dead outbox row, each with a required reason and recorded with the
// actor. Every POST is protected against cross-site request forgery: a
// same-origin check (http.CrossOriginProtection) and a token in the form
// that is an HMAC of a SameSite=Strict cookie under a per-process secret. A
// read-only console answers every POST with 403.
//
// Config.Auth makes the console know who is acting: a trusted reverse
// proxy's identity header (oauth2-proxy, an OIDC front end), believed only
// from the proxy's addresses, and/or basic auth against a file of bcrypt
// hashes. Each user is a viewer (reads everything, no action) or an
// operator (may act); every request must authenticate (401 otherwise), and
// the actor recorded with each action is the authenticated user. Without
// Config.Auth the console authenticates nobody and says so in its header:
// mount it in a service, behind the service's own authentication,
//
//	h, err := console.New(console.Config{Pool: pool, Schema: "orders", BasePath: "/console"})
//	mux.Handle("/console/", h)
//
// or run it with `sagabox ui` on localhost. Every response carries a
// Content-Security-Policy without scripts and framing, X-Content-Type-Options
// nosniff and a same-origin Referrer-Policy.
package console

import (
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"time"

	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/store"
)

//go:embed templates static
var assets embed.FS

// schemaStore is one schema the console reads.
type schemaStore struct {
	name  string
	store *store.Store
}

// console serves the pages.
type console struct {
	cfg     Config
	orch    *orchestrator.Client
	schemas []schemaStore // Config.Schema, then Config.MessagingSchemas
	pages   map[string]*template.Template
	csrf    *csrf
	auth    *authenticator
	log     *slog.Logger
	static  http.Handler
	started time.Time
}

// New returns the console's handler for cfg.
func New(cfg Config) (http.Handler, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("console: invalid config: %w", err)
	}
	orch, err := orchestrator.NewClient(orchestrator.Config{Pool: cfg.Pool, Schema: cfg.Schema, Service: "sagabox-console", Logger: cfg.Logger})
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	c := &console{cfg: cfg, orch: orch, log: cfg.Logger.With("component", "console"), started: time.Now()}
	if c.auth, err = newAuthenticator(cfg.Auth, c.log); err != nil {
		return nil, fmt.Errorf("console: invalid config: %w", err)
	}
	seen := map[string]bool{}
	for _, name := range append([]string{cfg.Schema}, cfg.MessagingSchemas...) {
		if seen[name] {
			continue
		}
		seen[name] = true
		st, err := store.New(cfg.Pool, name)
		if err != nil {
			return nil, fmt.Errorf("console: schema %q: %w", name, err)
		}
		c.schemas = append(c.schemas, schemaStore{name: name, store: st})
	}
	secret := cfg.Secret
	if secret == nil {
		secret = make([]byte, 32)
		if _, err := rand.Read(secret); err != nil {
			return nil, fmt.Errorf("console: generate CSRF secret: %w", err)
		}
	}
	c.csrf = &csrf{secret: secret, path: cfg.BasePath + "/"}
	if c.pages, err = parsePages(c.funcs()); err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	static, err := fs.Sub(assets, "static")
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	c.static = http.StripPrefix("/static/", http.FileServerFS(static))
	return c.routes(), nil
}

// routes returns the handler: the pages under BasePath, every request
// behind the authentication and with the security headers, every POST
// behind the read-only switch, the CSRF checks and the role.
func (c *console) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, c.cfg.BasePath+"/sagas", http.StatusSeeOther)
	})
	mux.Handle("GET /static/", c.static)
	mux.HandleFunc("GET /sagas", c.sagaList)
	mux.HandleFunc("GET /sagas/{id}", c.sagaShow)
	mux.HandleFunc("GET /outbox", c.outbox)
	mux.HandleFunc("GET /requests", c.requests)
	mux.HandleFunc("POST /sagas/{id}/{action}", c.sagaAction)
	mux.HandleFunc("POST /outbox/{schema}/dead/{row}/replay", c.replay)
	var h http.Handler = mux
	h = c.guardPost(h)
	h = c.authenticate(h)
	h = securityHeaders(h)
	if c.cfg.BasePath != "" {
		h = http.StripPrefix(c.cfg.BasePath, h)
	}
	return h
}

// contentSecurityPolicy allows the console's own styles and images, no
// script, no plugin, no framing, and forms only to itself.
const contentSecurityPolicy = "default-src 'self'; style-src 'self'; script-src 'none'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// securityHeaders sets the security headers on every response: pages,
// static files, redirects and errors (authentication's included).
func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "same-origin")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		h.Set("Cross-Origin-Resource-Policy", "same-origin")
		next.ServeHTTP(w, r)
	})
}

// guardPost refuses every POST of a read-only console, every POST that
// comes from another origin or without a valid CSRF token, and every POST
// of a user who is not an operator.
func (c *console) guardPost(next http.Handler) http.Handler {
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.fail(w, r, http.StatusForbidden, errors.New("cross-origin request refused"))
	}))
	checked := cop.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := c.csrf.check(r); err != nil {
			c.fail(w, r, http.StatusForbidden, err)
			return
		}
		if who := whoOf(r); !who.MayAct() {
			c.fail(w, r, http.StatusForbidden, fmt.Errorf("%s is a %s: only an operator may retry, abort, terminate, restart or replay", who.Name, who.Role))
			return
		}
		next.ServeHTTP(w, r)
	}))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet, http.MethodHead:
			next.ServeHTTP(w, r)
		case http.MethodPost:
			if !c.cfg.AllowActions {
				c.fail(w, r, http.StatusForbidden, errors.New("this console is read-only: start it with --allow-actions (Config.AllowActions) to retry, abort or replay"))
				return
			}
			checked.ServeHTTP(w, r)
		default:
			w.Header().Set("Allow", "GET, HEAD, POST")
			c.fail(w, r, http.StatusMethodNotAllowed, fmt.Errorf("method %s not allowed", r.Method))
		}
	})
}
