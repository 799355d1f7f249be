// Package dbtest gives tests a real PostgreSQL: a pool on the test database
// and a fresh, migrated schema per test that is dropped when the test ends.
// A missing database fails the test with the command that starts it; it
// never skips.
package dbtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/store/driver"
)

// DefaultURL is the test database used when TEST_DATABASE_URL is not set.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/sagabox_test"

// StartHint tells how to start the PostgreSQL server on a development machine.
const StartHint = "start it with: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"

// URL returns the test database URL.
func URL() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

var createOnce sync.Mutex

// ensureDatabase creates the test database if it is missing.
func ensureDatabase(ctx context.Context, url string) error {
	createOnce.Lock()
	defer createOnce.Unlock()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return fmt.Errorf("parse TEST_DATABASE_URL: %w", err)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err == nil {
		return conn.Close(ctx)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "3D000" { // invalid_catalog_name
		return fmt.Errorf("connect to PostgreSQL at %s:%d: %w; %s", cfg.Host, cfg.Port, err, StartHint)
	}
	admin := cfg.Copy()
	admin.Database = "postgres"
	conn, err = pgx.ConnectConfig(ctx, admin)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL at %s:%d: %w; %s", cfg.Host, cfg.Port, err, StartHint)
	}
	defer func() { _ = conn.Close(ctx) }()
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{cfg.Database}.Sanitize())
	exists := errors.As(err, &pgErr) && (pgErr.Code == "42P04" || pgErr.Code == "23505") // created concurrently
	if err != nil && !exists {
		return fmt.Errorf("create test database %q: %w", cfg.Database, err)
	}
	return nil
}

// Pool returns a pool on the test database, closed when the test ends.
func Pool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	return PoolWith(tb, nil)
}

// PoolWith is Pool with modify applied to the pool's configuration (a
// tracer, a pool size) before the pool is created.
func PoolWith(tb testing.TB, modify func(*pgxpool.Config)) *pgxpool.Pool {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url := URL()
	if err := ensureDatabase(ctx, url); err != nil {
		tb.Fatalf("dbtest: %v", err)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		tb.Fatalf("dbtest: parse %s: %v", url, err)
	}
	cfg.MaxConns = 8
	if modify != nil {
		modify(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatalf("dbtest: open pool: %v", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		tb.Fatalf("dbtest: PostgreSQL at %s:%d is unreachable: %v; %s", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err, StartHint)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// SchemaName returns a schema name unique to this test run.
func SchemaName(tb testing.TB) string {
	tb.Helper()
	return "t_" + strings.ReplaceAll(uuid.NewString(), "-", "")[:16]
}

// DropSchemaOnCleanup drops schema with everything in it when the test ends.
func DropSchemaOnCleanup(tb testing.TB, pool *pgxpool.Pool, schema string) {
	tb.Helper()
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			tb.Errorf("dbtest: drop schema %s: %v", schema, err)
		}
	})
}

// DB is a migrated schema of the test database: its Store, the Store's
// executor (the engine's units of work, which tests call directly) and the
// pool it runs on.
type DB struct {
	driver.Executor
	Store *store.Store
	Pool  *pgxpool.Pool
}

// InTx runs fn in a transaction of the pool and commits it when fn returns
// nil, as a caller of sagabox's API does.
func (d *DB) InTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, d.Pool, fn)
}

// Store returns a fresh schema with the given migration lines applied (all
// lines when none is given), on a pool of its own. The schema is dropped when
// the test ends.
func Store(tb testing.TB, lines ...store.Line) *DB {
	tb.Helper()
	pool := Pool(tb)
	return StoreOnPool(tb, pool, lines...)
}

// StoreOnPool is Store on an existing pool.
func StoreOnPool(tb testing.TB, pool *pgxpool.Pool, lines ...store.Line) *DB {
	tb.Helper()
	schema := SchemaName(tb)
	s, err := store.New(pool, schema)
	if err != nil {
		tb.Fatalf("dbtest: %v", err)
	}
	DropSchemaOnCleanup(tb, pool, schema)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := s.MigrateUp(ctx, lines...); err != nil {
		tb.Fatalf("dbtest: migrate schema %s: %v", schema, err)
	}
	ex, err := store.NewExecutor(pool, schema)
	if err != nil {
		tb.Fatalf("dbtest: %v", err)
	}
	return &DB{Executor: ex, Store: s, Pool: pool}
}

// Commit commits t, an engine transaction, and returns what it wrote to the
// outbox; the test fails if the commit does.
func Commit(tb testing.TB, t driver.Tx) driver.Committed {
	tb.Helper()
	c, err := t.Commit(context.Background())
	if err != nil {
		tb.Fatalf("dbtest: commit: %v", err)
	}
	return c
}
