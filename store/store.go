// Package store is everything sagabox keeps in PostgreSQL: the embedded,
// versioned migrations, the outbox, the inbox and the compensation barrier,
// saga instances and their history, operator requests, inspection queries
// and retention. It is the only package that touches pgx internals; the SQL
// lives in queries/ and is compiled by sqlc into store/internal/dbsqlc.
//
// Its exported API is for users and is small and stable: the migrations
// (MigrateUp, MigrateDown, MigrationStates, MigrationSQL for teams that apply
// SQL with their own tool, CheckSchema, ListSchemas) and the classification
// of PostgreSQL errors. The rest is the engine's persistence, the way
// River's driver is River's: Executor returns it as the internal contract
// the engine speaks (internal/driver), one method per unit of work (start a
// saga, begin and finish a delivery, receive replies, write transitions,
// claim and settle an outbox batch, prune), each sent as one pipelined round
// trip where SQL allows, in the types of package message. Inspecting sagas
// from Go is the orchestrator's job (Client.Get, List, History), and from
// SQL the inspection views' (sagabox_saga_v and the others), which are a
// supported query API.
//
// Every table is prefixed sagabox_ and lives in a schema chosen per service.
// The schema is written into each statement (never set via search_path), so a
// Store can run statements in a caller's transaction without changing the
// caller's session.
package store

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sagabox/sagabox/store/driver"
	"github.com/sagabox/sagabox/store/internal/dbsqlc"
)

// DefaultSchema is the schema used when none is configured.
const DefaultSchema = "sagabox"

// schemaMarker is the placeholder in queries/ and migrations that names the
// schema of a table.
const schemaMarker = "/* TEMPLATE: schema */"

var schemaPattern = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ValidateSchema reports whether name can be used as a sagabox schema: a
// lowercase Postgres identifier of at most 63 characters.
func ValidateSchema(name string) error {
	if !schemaPattern.MatchString(name) {
		return fmt.Errorf("schema %q is not valid: use lowercase letters, digits and underscores, starting with a letter or underscore, at most 63 characters", name)
	}
	return nil
}

// Store runs sagabox's queries against one schema.
type Store struct {
	pool    *pgxpool.Pool
	schema  string
	prefix  string
	queries *dbsqlc.Queries
	cache   sync.Map // original SQL -> SQL with the schema written in
}

// New returns a Store for schema on pool; pool may be nil for a Store that
// only renders migration SQL. An empty schema means DefaultSchema.
func New(pool *pgxpool.Pool, schema string) (*Store, error) {
	if schema == "" {
		schema = DefaultSchema
	}
	if err := ValidateSchema(schema); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	return &Store{
		pool:    pool,
		schema:  schema,
		prefix:  pgx.Identifier{schema}.Sanitize() + ".",
		queries: dbsqlc.New(),
	}, nil
}

// Schema returns the schema the store works in.
func (s *Store) Schema() string { return s.schema }

// NewExecutor returns the persistence of schema on pool as the engine's
// contract (driver.Executor): one method per unit of work of the engine.
// sagabox's clients build their engine on it. Applications use the
// clients, and operators the clients' and the Store's operations; no other
// package of sagabox calls it (the architecture test keeps it so). An empty
// schema means DefaultSchema.
func NewExecutor(pool *pgxpool.Pool, schema string) (driver.Executor, error) {
	if pool == nil {
		return nil, errors.New("store: a connection pool is required")
	}
	s, err := New(pool, schema)
	if err != nil {
		return nil, err
	}
	return &executor{s}, nil
}

// executor implements driver.Executor on a Store.
type executor struct{ *Store }

// SchemaCheck implements driver.Executor: the privileges first, so that a
// role that may not read the migration table learns which GRANTs it lacks,
// not only that it was refused.
func (s *executor) SchemaCheck(ctx context.Context, needs driver.SchemaNeeds) error {
	if err := s.CheckPrivileges(ctx, &PrivilegeOpts{LogRelay: needs.LogRelay}); err != nil {
		return err
	}
	if needs.Sagas {
		return s.CheckSchema(ctx, LineMessaging, LineSaga)
	}
	return s.CheckSchema(ctx, LineMessaging)
}

var _ driver.Executor = (*executor)(nil)

// MaxConns implements driver.Executor.
func (s *executor) MaxConns() int {
	if s.pool == nil {
		return 0
	}
	return int(s.pool.Config().MaxConns)
}

// render writes the schema into sql.
func (s *Store) render(sql string) string {
	if v, ok := s.cache.Load(sql); ok {
		return v.(string)
	}
	out := strings.ReplaceAll(sql, schemaMarker, s.prefix)
	s.cache.Store(sql, out)
	return out
}

// db returns an executor that writes the schema into every statement and
// runs it on x: a caller's transaction, or the pool.
func (s *Store) db(x dbsqlc.DBTX) dbsqlc.DBTX { return schemaDB{s: s, inner: x} }

// pooled returns the executor of statements run on their own, on the pool.
func (s *Store) pooled() (dbsqlc.DBTX, error) {
	if s.pool == nil {
		return nil, fmt.Errorf("store for schema %q has no connection pool", s.schema)
	}
	return s.db(s.pool), nil
}
