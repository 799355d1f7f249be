package store_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/store/driver"
)

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// grant runs GrantsSQL's statements for role on db's schema, as the owner.
func grant(t *testing.T, db *dbtest.DB, o store.GrantOpts) {
	t.Helper()
	o.Schema = db.Store.Schema()
	sql, err := store.GrantsSQL(o)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctxFor(t), sql)
	require.NoError(t, err, sql)
}

// A role with no grant fails the start-up check with every GRANT it
// misses, each quoted; once the role layout's grants are run it misses
// nothing; and a single privilege revoked later is named alone.
func TestCheckPrivilegesNamesTheMissingGrants(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := dbtest.Store(t)
	role := dbtest.Role(t, db.Pool)
	as, err := store.New(dbtest.PoolAs(t, role), db.Store.Schema())
	require.NoError(t, err)
	schema := `"` + db.Store.Schema() + `"`

	err = as.CheckPrivileges(ctx, nil)
	require.ErrorIs(t, err, store.ErrInsufficientPrivilege)
	for _, want := range []string{
		"GRANT USAGE ON SCHEMA " + schema + ` TO "` + role + `"`,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON " + schema + `."sagabox_outbox" TO "` + role + `"`,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON " + schema + `."sagabox_saga" TO "` + role + `"`,
		"GRANT SELECT ON " + schema + `."sagabox_migration" TO "` + role + `"`,
		"GRANT SELECT ON " + schema + `."sagabox_saga_v" TO "` + role + `"`,
		"sagabox roles print --schema " + db.Store.Schema() + " --role " + role,
	} {
		require.Contains(t, err.Error(), want)
	}
	// The schema version check, which reads the migration table, is what
	// the role would have failed on first.
	require.True(t, store.IsInsufficientPrivilege(as.CheckSchema(ctx, store.AllLines...)))

	grant(t, db, store.GrantOpts{Role: role})
	require.NoError(t, as.CheckPrivileges(ctx, nil))
	require.NoError(t, as.CheckSchema(ctx, store.AllLines...))

	_, err = db.Pool.Exec(ctx, fmt.Sprintf(`REVOKE INSERT ON %s."sagabox_inbox" FROM %q`, schema, role))
	require.NoError(t, err)
	err = as.CheckPrivileges(ctx, nil)
	require.ErrorIs(t, err, store.ErrInsufficientPrivilege)
	require.Contains(t, err.Error(), "GRANT INSERT ON "+schema+`."sagabox_inbox" TO "`+role+`";`)
	require.Equal(t, 1, strings.Count(err.Error(), "GRANT "), "only the revoked privilege is missing:\n%s", err)

	// The log relay needs REPLICATION, which a runtime role does not have
	// unless asked for.
	err = as.CheckPrivileges(ctx, &store.PrivilegeOpts{LogRelay: true})
	require.Contains(t, err.Error(), `ALTER ROLE "`+role+`" REPLICATION`)
}

// A read-only role reads every table and view of its schema and writes
// none: it passes the read-only check, fails the runtime one, and the
// server refuses its writes with insufficient_privilege.
func TestReadOnlyRole(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := dbtest.Store(t)
	role := dbtest.Role(t, db.Pool)
	grant(t, db, store.GrantOpts{Role: role, PrivilegeOpts: store.PrivilegeOpts{ReadOnly: true}})
	pool := dbtest.PoolAs(t, role)
	as, err := store.New(pool, db.Store.Schema())
	require.NoError(t, err)
	require.NoError(t, as.CheckPrivileges(ctx, &store.PrivilegeOpts{ReadOnly: true}))
	require.NoError(t, as.CheckSchema(ctx, store.AllLines...))
	err = as.CheckPrivileges(ctx, nil)
	require.ErrorIs(t, err, store.ErrInsufficientPrivilege)
	require.Contains(t, err.Error(), `GRANT INSERT, UPDATE, DELETE ON "`+db.Store.Schema()+`"."sagabox_outbox"`)

	var n int
	require.NoError(t, pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %q.sagabox_saga_v`, db.Store.Schema())).Scan(&n))
	_, err = pool.Exec(ctx, fmt.Sprintf(`DELETE FROM %q.sagabox_outbox`, db.Store.Schema()))
	require.True(t, store.IsInsufficientPrivilege(err), "%v", err)
}

// A runtime role creates nothing (no table in its schema, no schema) and
// reads no other service's schema: each is refused with
// insufficient_privilege (42501), which IsInsufficientPrivilege tells by
// SQLSTATE.
func TestRuntimeRoleCreatesNothingAndReadsNoOtherSchema(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	mine := dbtest.Store(t)
	other := dbtest.StoreOnPool(t, mine.Pool)
	role := dbtest.Role(t, mine.Pool)
	grant(t, mine, store.GrantOpts{Role: role})
	pool := dbtest.PoolAs(t, role)
	for _, sql := range []string{
		fmt.Sprintf(`CREATE TABLE %q.mine (n int)`, mine.Store.Schema()),
		fmt.Sprintf(`CREATE SCHEMA %q`, mine.Store.Schema()+"_x"),
		fmt.Sprintf(`SELECT count(*) FROM %q.sagabox_outbox`, other.Store.Schema()),
		fmt.Sprintf(`SELECT count(*) FROM %q.sagabox_saga_v`, other.Store.Schema()),
		fmt.Sprintf(`INSERT INTO %q.sagabox_migration (line, version, name) VALUES ('x', 99, 'x')`, mine.Store.Schema()),
	} {
		_, err := pool.Exec(ctx, sql)
		require.True(t, store.IsInsufficientPrivilege(err), "%s: %v", sql, err)
	}
	var n int
	require.NoError(t, pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %q.sagabox_outbox`, mine.Store.Schema())).Scan(&n))
}

// A role without the CONNECT privilege on the database is told apart from
// the other connect failures.
func TestClassifyConnectPermissionDenied(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	admin := dbtest.Pool(t)
	database := "t_db_" + strings.TrimPrefix(dbtest.SchemaName(t), "t_")
	_, err := admin.Exec(ctx, "CREATE DATABASE "+database)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP DATABASE "+database+" WITH (FORCE)") })
	_, err = admin.Exec(ctx, "REVOKE CONNECT ON DATABASE "+database+" FROM PUBLIC")
	require.NoError(t, err)
	role := dbtest.Role(t, admin)
	cfg, err := pgx.ParseConfig(dbtest.URLAs(t, role))
	require.NoError(t, err)
	cfg.Database = database
	_, err = pgx.ConnectConfig(ctx, cfg)
	require.Error(t, err)
	require.Equal(t, store.ConnectPermissionDenied, store.ClassifyConnect(err))
	require.True(t, store.IsInsufficientPrivilege(err))
}

// GrantsSQL quotes every identifier, whatever it holds, and refuses what
// it cannot grant.
func TestGrantsSQL(t *testing.T) {
	t.Parallel()
	sql, err := store.GrantsSQL(store.GrantOpts{Schema: "inventory", Role: `app "inv"; DROP`, Owner: "Owner", Database: "shop",
		PrivilegeOpts: store.PrivilegeOpts{LogRelay: true}})
	require.NoError(t, err)
	for _, want := range []string{
		`GRANT CONNECT ON DATABASE "shop" TO "app ""inv""; DROP";`,
		`GRANT USAGE ON SCHEMA "inventory" TO "app ""inv""; DROP";`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "inventory" TO "app ""inv""; DROP";`,
		`REVOKE INSERT, UPDATE, DELETE ON "inventory"."sagabox_migration" FROM "app ""inv""; DROP";`,
		`ALTER DEFAULT PRIVILEGES FOR ROLE "Owner" IN SCHEMA "inventory" GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO "app ""inv""; DROP";`,
		`ALTER ROLE "app ""inv""; DROP" REPLICATION;`,
	} {
		require.Contains(t, sql, want)
	}
	require.NotContains(t, sql, "CREATE ON")
	ro, err := store.GrantsSQL(store.GrantOpts{Schema: "inventory", Role: "dash", PrivilegeOpts: store.PrivilegeOpts{ReadOnly: true}})
	require.NoError(t, err)
	require.Contains(t, ro, `GRANT SELECT ON ALL TABLES IN SCHEMA "inventory" TO "dash";`)
	require.NotContains(t, ro, "INSERT")
	require.NotContains(t, ro, "REPLICATION")

	for name, o := range map[string]store.GrantOpts{
		"role is required":        {Schema: "inventory"},
		"schema":                  {Schema: "Inventory", Role: "r"},
		"longer than 63 bytes":    {Role: strings.Repeat("r", 64)},
		"a read-only role relays": {Role: "r", PrivilegeOpts: store.PrivilegeOpts{ReadOnly: true, LogRelay: true}},
	} {
		_, err := store.GrantsSQL(o)
		require.ErrorContains(t, err, name)
	}
}

// A statement of the engine's transactions that the server refuses for
// want of a privilege names the role and where to find the grants, and
// stays an insufficient_privilege error.
func TestRefusedStatementNamesTheRole(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := dbtest.Store(t, store.LineMessaging)
	role := dbtest.Role(t, db.Pool)
	grant(t, db, store.GrantOpts{Role: role})
	_, err := db.Pool.Exec(ctx, fmt.Sprintf(`REVOKE INSERT ON %q.sagabox_inbox FROM %q`, db.Store.Schema(), role))
	require.NoError(t, err)
	exec, err := store.NewExecutor(dbtest.PoolAs(t, role), db.Store.Schema())
	require.NoError(t, err)
	tx := exec.Begin(nil)
	defer tx.Rollback(ctx)
	_, err = exec.DeliveryBegin(ctx, tx, command(uuid.New(), message.KindCommand), []byte(`{"reason":"blocked"}`))
	require.Error(t, err)
	require.True(t, store.IsInsufficientPrivilege(err))
	require.ErrorIs(t, err, store.ErrInsufficientPrivilege)
	require.ErrorIs(t, err, driver.ErrPrivilege, "the driver marks it: the delivery is retried uncounted")
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr))
	require.Contains(t, err.Error(), `role "`+role+`" lacks a privilege`)
	require.Contains(t, err.Error(), "sagabox roles print --schema SCHEMA --role "+role)
}
