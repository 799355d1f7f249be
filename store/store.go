// Package store is everything sagabox keeps in PostgreSQL: the embedded,
// versioned migrations, the outbox, the inbox and barrier, saga instances and
// their history, inspection queries and retention. It is the only package that
// touches pgx internals; the SQL lives in queries/ and is compiled by sqlc into
// store/internal/dbsqlc.
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
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

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

// New returns a Store for schema on pool. An empty schema means DefaultSchema.
func New(pool *pgxpool.Pool, schema string) (*Store, error) {
	if pool == nil {
		return nil, errors.New("store: pool is nil")
	}
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

// Pool returns the connection pool the store was created with.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// render writes the schema into sql.
func (s *Store) render(sql string) string {
	if v, ok := s.cache.Load(sql); ok {
		return v.(string)
	}
	out := strings.ReplaceAll(sql, schemaMarker, s.prefix)
	s.cache.Store(sql, out)
	return out
}

// db returns the executor for q: tx when it is not nil, else the pool, with
// the schema written into every statement.
func (s *Store) db(tx pgx.Tx) dbsqlc.DBTX {
	if tx != nil {
		return schemaDB{s: s, inner: tx}
	}
	return schemaDB{s: s, inner: s.pool}
}

// schemaDB rewrites the schema marker of each statement before running it.
type schemaDB struct {
	s     *Store
	inner dbsqlc.DBTX
}

func (d schemaDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return d.inner.Exec(ctx, d.s.render(sql), args...)
}

func (d schemaDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return d.inner.Query(ctx, d.s.render(sql), args...)
}

func (d schemaDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return d.inner.QueryRow(ctx, d.s.render(sql), args...)
}

// InTx runs fn in a new READ COMMITTED transaction from the pool and commits
// it when fn returns nil. It rolls back otherwise and returns fn's error.
func (s *Store) InTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit transaction: %w", err)
	}
	return nil
}

// DefaultConflictRetries is how many times InTxRetrying runs a transaction
// again after a serialization failure or a deadlock.
const DefaultConflictRetries = 5

// InTxRetrying is InTx, run again at once, up to retries more times, while it
// fails with a serialization failure or a deadlock (IsRetryable) and ctx is
// not done. fn must be safe to run again: its transaction was rolled back.
func (s *Store) InTxRetrying(ctx context.Context, retries int, fn func(tx pgx.Tx) error) error {
	for try := 0; ; try++ {
		err := s.InTx(ctx, fn)
		if err == nil || !IsRetryable(err) || try >= retries || ctx.Err() != nil {
			return err
		}
	}
}

// IsRetryable reports whether err is a Postgres error that a retry of the
// whole transaction may cure: a serialization failure (40001) or a deadlock
// (40P01). Classification is by SQLSTATE, never by message text.
func IsRetryable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "40001", "40P01":
			return true
		}
	}
	return false
}

// IsConnectionError reports whether err says the database could not be
// reached or the connection was lost (a restart, a network fault), as
// opposed to an error of the statement itself. Receivers retry such errors
// without counting them against a message's attempts. Only pgx's own errors
// count (a handler's network errors do not), classified by type and
// SQLSTATE, never by message text.
func IsConnectionError(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// Class 08: connection exception; 57P01-57P03: admin shutdown, crash
		// shutdown, cannot connect now.
		return strings.HasPrefix(pgErr.Code, "08") || pgErr.Code == "57P01" || pgErr.Code == "57P02" || pgErr.Code == "57P03"
	}
	// A failed connect, or a statement on a connection pgx had closed (a dead
	// pooled connection). Not pgconn.SafeToRetry: pgx also calls "safe to
	// retry" a statement on a connection still busy with an unclosed result
	// and one on a context that was already done, both failures of the
	// caller that a retry repeats for ever.
	var connectErr *pgconn.ConnectError
	return errors.As(err, &connectErr) || errors.Is(err, pgconn.ErrConnClosed)
}

// IsDataError reports whether err is Postgres refusing the data of a
// statement: a data exception (class 22, e.g. a NUL byte or invalid UTF-8 in
// text) or a program limit exceeded (class 54, e.g. a key too long for its
// index). Running the statement again with the same data fails the same way.
func IsDataError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, "22") || strings.HasPrefix(pgErr.Code, "54"))
}

// IsUndefinedTable reports whether err says a table does not exist (42P01),
// which for sagabox means migrations have not been applied.
func IsUndefinedTable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000")
}

// NewOffline returns a Store that is not connected to a database, for
// rendering migration SQL. Calls that need the database fail.
func NewOffline(schema string) (*Store, error) {
	if schema == "" {
		schema = DefaultSchema
	}
	if err := ValidateSchema(schema); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	return &Store{schema: schema, prefix: pgx.Identifier{schema}.Sanitize() + ".", queries: dbsqlc.New()}, nil
}
