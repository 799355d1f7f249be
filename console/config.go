package console

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sagabox/sagabox/store"
)

// Defaults of Config.
const (
	// DefaultPageSize is the number of rows on one page of a listing.
	DefaultPageSize = 50
	// DefaultActionWait is how long a retry or abort waits for an
	// orchestrator to apply it before the console shows it as pending.
	DefaultActionWait = 5 * time.Second
)

// Config configures the console. Pool is required; every other field has a
// default.
type Config struct {
	// Pool is the database of the schemas. Required.
	Pool *pgxpool.Pool
	// Schema is the orchestrator's schema: its sagas, history and operator
	// requests are shown (it has both migration lines). Defaults to
	// store.DefaultSchema.
	Schema string
	// MessagingSchemas are more schemas (participants') whose outbox,
	// dead letters and barrier marks are shown besides Schema's. Defaults
	// to none.
	MessagingSchemas []string
	// BasePath is the path the handler is mounted at (e.g. "/console"); the
	// handler strips it and its links start with it. Defaults to "" (the
	// root).
	BasePath string
	// AllowActions enables a saga's retry, cancel, terminate and restart,
	// and the replay of dead outbox rows. Defaults to false: a
	// read-only console, which answers every POST with 403.
	AllowActions bool
	// Auth is how the console authenticates who uses it: a trusted
	// proxy's identity header, a file of users for basic auth, or both,
	// and the roles (viewer, operator) they get. Defaults to none: the
	// console authenticates nobody, says so in its header, and relies on
	// being reachable only from where it should be (localhost, or mounted
	// behind the service's own authentication).
	Auth AuthConfig
	// Actor names who performs an action, from its request (e.g. the user
	// the service's authentication found); it is recorded with the action.
	// Only without Auth: with authentication on, the actor is the
	// authenticated user, and setting Actor is an error. Defaults to the
	// request's basic-auth user or, without one, "console@" and the
	// client's address.
	Actor func(*http.Request) string
	// PageSize is the number of rows on one page of a listing. Defaults to
	// DefaultPageSize (50).
	PageSize int
	// ActionWait is how long a retry or abort waits for an orchestrator to
	// apply its request. Defaults to DefaultActionWait (5s).
	ActionWait time.Duration
	// Secret keys the CSRF tokens. Defaults to 32 random bytes per process
	// (tokens then do not survive a restart, which only means a form must
	// be reloaded).
	Secret []byte
	// Logger logs the actions applied. Defaults to slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns c with every unset field set to its default.
func (c Config) WithDefaults() Config {
	if c.Schema == "" {
		c.Schema = store.DefaultSchema
	}
	c.BasePath = strings.TrimRight(c.BasePath, "/")
	c.Auth = c.Auth.withDefaults()
	if c.Actor == nil && !c.Auth.enabled() {
		c.Actor = defaultActor
	}
	if c.PageSize == 0 {
		c.PageSize = DefaultPageSize
	}
	if c.ActionWait == 0 {
		c.ActionWait = DefaultActionWait
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	if c.Pool == nil {
		errs = append(errs, errors.New("Pool is required"))
	}
	if c.BasePath != "" && !strings.HasPrefix(c.BasePath, "/") {
		errs = append(errs, fmt.Errorf("BasePath %q must start with /", c.BasePath))
	}
	if c.PageSize < 1 || c.PageSize > 1000 {
		errs = append(errs, fmt.Errorf("PageSize %d: want 1 to 1000", c.PageSize))
	}
	if c.ActionWait < 0 {
		errs = append(errs, fmt.Errorf("ActionWait %s is negative", c.ActionWait))
	}
	if c.Secret != nil && len(c.Secret) < 16 {
		errs = append(errs, fmt.Errorf("Secret has %d bytes: want 16 or more", len(c.Secret)))
	}
	errs = append(errs, c.Auth.validate()...)
	if c.Auth.enabled() && c.Actor != nil {
		errs = append(errs, errors.New("Actor must be unset when Auth authenticates: the actor of each action is the authenticated user"))
	}
	return errors.Join(errs...)
}

func defaultActor(r *http.Request) string {
	if user, _, ok := r.BasicAuth(); ok && user != "" {
		return user
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	return "console@" + host
}
