package dbtest

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Role creates a login role unique to this test (no password: the test
// server trusts local connections) and drops it when the test ends, with
// every privilege it was granted and every default privilege naming it.
// Roles belong to the whole server, not to a database: the name is unique
// so that tests running at once never share one.
func Role(tb testing.TB, pool *pgxpool.Pool) string {
	tb.Helper()
	role := "t_role_" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := pool.Exec(ctx, "CREATE ROLE "+pgx.Identifier{role}.Sanitize()+" LOGIN"); err != nil {
		tb.Fatalf("dbtest: create role %s: %v", role, err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		id := pgx.Identifier{role}.Sanitize()
		// Sessions of the role that are still open (a pool closing) would
		// hold DROP ROLE back.
		_, _ = pool.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role)
		if _, err := pool.Exec(ctx, "DROP OWNED BY "+id+"; DROP ROLE "+id); err != nil {
			tb.Errorf("dbtest: drop role %s: %v", role, err)
		}
	})
	return role
}

// URLAs returns the test database's URL with role as its user.
func URLAs(tb testing.TB, role string) string {
	tb.Helper()
	u, err := url.Parse(URL())
	if err != nil {
		tb.Fatalf("dbtest: parse %s: %v", URL(), err)
	}
	u.User = url.User(role)
	return u.String()
}

// PoolAs returns a pool on the test database that connects as role,
// closed when the test ends.
func PoolAs(tb testing.TB, role string) *pgxpool.Pool {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, URLAs(tb, role))
	if err != nil {
		tb.Fatalf("dbtest: open a pool as %s: %v", role, err)
	}
	tb.Cleanup(pool.Close)
	return pool
}
