package store_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/store"
)

func newUnmigrated(t *testing.T) *dbtest.DB {
	t.Helper()
	pool := dbtest.Pool(t)
	schema := dbtest.SchemaName(t)
	dbtest.DropSchemaOnCleanup(t, pool, schema)
	s, err := store.New(pool, schema)
	require.NoError(t, err)
	ex, err := store.NewExecutor(pool, schema)
	require.NoError(t, err)
	return &dbtest.DB{Executor: ex, Store: s, Pool: pool}
}

func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newUnmigrated(t)

	var wg sync.WaitGroup
	applied := make([][]store.Migration, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			applied[i], errs[i] = s.Store.MigrateUp(ctx)
		}()
	}
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	// Each migration applied exactly once between the two runners.
	total := len(applied[0]) + len(applied[1])
	require.Equal(t, store.LatestVersion(store.LineMessaging)+store.LatestVersion(store.LineSaga), total)
	require.NoError(t, s.Store.CheckSchema(ctx, store.AllLines...))
}

func TestMigrateTwiceIsNoOp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newUnmigrated(t)

	first, err := s.Store.MigrateUp(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, first)
	second, err := s.Store.MigrateUp(ctx)
	require.NoError(t, err)
	require.Empty(t, second)

	states, err := s.Store.MigrationStates(ctx)
	require.NoError(t, err)
	for _, st := range states {
		require.NotNil(t, st.AppliedAt, "%s %d", st.Line, st.Version)
	}
}

func TestMigrateDownThenUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newUnmigrated(t)

	_, err := s.Store.MigrateUp(ctx)
	require.NoError(t, err)
	down, err := s.Store.MigrateDown(ctx, store.LineSaga, 1)
	require.NoError(t, err)
	require.Len(t, down, 1)
	err = s.Store.CheckSchema(ctx, store.LineSaga)
	require.ErrorIs(t, err, store.ErrSchemaOutdated)
	require.Contains(t, err.Error(), "sagabox migrate up --schema "+s.Schema())
	require.NoError(t, s.Store.CheckSchema(ctx, store.LineMessaging))

	_, err = s.Store.MigrateDown(ctx, store.LineSaga, 10)
	require.NoError(t, err)
	_, err = s.Store.MigrateDown(ctx, store.LineMessaging, 10)
	require.NoError(t, err)
	var n int
	require.NoError(t, s.Pool.QueryRow(ctx,
		"SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename <> 'sagabox_migration'", s.Schema()).Scan(&n))
	require.Zero(t, n, "down must drop every table")

	up, err := s.Store.MigrateUp(ctx)
	require.NoError(t, err)
	require.Len(t, up, store.LatestVersion(store.LineMessaging)+store.LatestVersion(store.LineSaga))
	require.NoError(t, s.Store.CheckSchema(ctx, store.AllLines...))
}

func TestCheckSchemaOnEmptyDatabase(t *testing.T) {
	t.Parallel()
	s := newUnmigrated(t)
	err := s.Store.CheckSchema(context.Background(), store.LineMessaging)
	require.ErrorIs(t, err, store.ErrSchemaOutdated)
	require.Contains(t, err.Error(), fmt.Sprintf("version 0 of %d", store.LatestVersion(store.LineMessaging)))
	require.Contains(t, err.Error(), "--line messaging", "the hint names the line to apply")
}

func TestMigrationSQLNamesSchema(t *testing.T) {
	t.Parallel()
	s, err := store.New(dbtest.Pool(t), "billing")
	require.NoError(t, err)
	sql, err := s.MigrationSQL(store.LineMessaging, 1, false)
	require.NoError(t, err)
	require.Contains(t, sql, `CREATE TABLE "billing".sagabox_outbox`)
	require.NotContains(t, sql, "TEMPLATE")
	_, err = s.MigrationSQL(store.LineMessaging, 99, false)
	require.ErrorContains(t, err, "does not exist")
}

func TestValidateSchema(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"", "Upper", "1abc", "a-b", `x"; DROP TABLE y; --`, strings.Repeat("a", 64)} {
		require.Error(t, store.ValidateSchema(bad), bad)
	}
	for _, good := range []string{"sagabox", "orders_v2", "_x"} {
		require.NoError(t, store.ValidateSchema(good), good)
	}
}

// The saga line goes down past version 10 with a restart request recorded:
// version 9 knows no such request.
func TestMigrateDownPastRestartRequests(t *testing.T) {
	t.Parallel()
	db := dbtest.Store(t, store.LineMessaging, store.LineSaga)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `INSERT INTO `+pgx.Identifier{db.Store.Schema()}.Sanitize()+`.sagabox_saga_operation
		(saga_id, action, actor, reason, params, applied_at) VALUES ($1, 'restart', 'a', 'r', '{"from":"x"}', now())`, uuid.New())
	require.NoError(t, err)
	for range 2 {
		_, err = db.Store.MigrateDown(ctx, store.LineSaga, 1)
		require.NoError(t, err)
	}
}
