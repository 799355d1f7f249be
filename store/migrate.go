package store

import (
	"context"
	"embed"
	"fmt"
	"hash/fnv"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sagabox/sagabox/store/driver"
	"github.com/sagabox/sagabox/store/internal/dbsqlc"
)

//go:embed migrations
var migrationFS embed.FS

// Line is an independent sequence of migrations. Every service needs
// LineMessaging; only an orchestrator's schema needs LineSaga.
type Line string

// The migration lines.
const (
	// LineMessaging holds the outbox, inbox and barrier tables.
	LineMessaging Line = "messaging"
	// LineSaga holds saga instances and their history.
	LineSaga Line = "saga"
)

// AllLines lists every migration line in the order they are applied.
var AllLines = []Line{LineMessaging, LineSaga}

// ParseLine returns the Line named s.
func ParseLine(s string) (Line, error) {
	for _, l := range AllLines {
		if string(l) == s {
			return l, nil
		}
	}
	return "", fmt.Errorf("unknown migration line %q (want messaging or saga)", s)
}

// Migration is one versioned schema change.
type Migration struct {
	Line    Line
	Version int
	Name    string
	// Up and Down are the SQL, with the schema marker not yet rendered.
	Up, Down string
}

// MigrationState is a migration and whether it is applied to a schema.
type MigrationState struct {
	Migration
	// AppliedAt is when the migration was applied; nil when it is not.
	AppliedAt *time.Time
}

var migrationFile = regexp.MustCompile(`^(\d+)_([a-z0-9_]+)\.(up|down)\.sql$`)

// Migrations returns the embedded migrations of line in version order.
func Migrations(line Line) ([]Migration, error) {
	dir := path.Join("migrations", string(line))
	entries, err := fs.ReadDir(migrationFS, dir)
	if err != nil {
		return nil, fmt.Errorf("read migrations of line %q: %w", line, err)
	}
	byVersion := map[int]*Migration{}
	for _, e := range entries {
		m := migrationFile.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("migration file %s/%s: name must be NNN_name.up.sql or NNN_name.down.sql", dir, e.Name())
		}
		version, _ := strconv.Atoi(m[1])
		sql, err := fs.ReadFile(migrationFS, path.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("read migration %s: %w", e.Name(), err)
		}
		mig := byVersion[version]
		if mig == nil {
			mig = &Migration{Line: line, Version: version, Name: m[2]}
			byVersion[version] = mig
		}
		if m[3] == "up" {
			mig.Up = string(sql)
		} else {
			mig.Down = string(sql)
		}
	}
	out := make([]Migration, 0, len(byVersion))
	for _, m := range byVersion {
		if m.Up == "" || m.Down == "" {
			return nil, fmt.Errorf("migration %s %d (%s) needs both an up and a down file", line, m.Version, m.Name)
		}
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i, m := range out {
		if m.Version != i+1 {
			return nil, fmt.Errorf("migrations of line %q are not numbered 1, 2, 3…: found %d at position %d", line, m.Version, i+1)
		}
	}
	return out, nil
}

// LatestVersion returns the highest embedded version of line.
func LatestVersion(line Line) int {
	migs, err := Migrations(line)
	if err != nil || len(migs) == 0 {
		return 0
	}
	return migs[len(migs)-1].Version
}

// MigrationSQL returns the SQL of one migration with the store's schema
// written in, for teams that apply migrations with their own tool.
func (s *Store) MigrationSQL(line Line, version int, down bool) (string, error) {
	migs, err := Migrations(line)
	if err != nil {
		return "", err
	}
	for _, m := range migs {
		if m.Version == version {
			sql := m.Up
			if down {
				sql = m.Down
			}
			return s.render(sql), nil
		}
	}
	return "", fmt.Errorf("migration %s %d does not exist", line, version)
}

// MigrationStates lists every embedded migration of lines and whether it is
// applied. Before any migration ran, none is.
func (s *Store) MigrationStates(ctx context.Context, lines ...Line) ([]MigrationState, error) {
	if len(lines) == 0 {
		lines = AllLines
	}
	applied, err := s.appliedMigrations(ctx, nil)
	if err != nil {
		return nil, err
	}
	var out []MigrationState
	for _, line := range lines {
		migs, err := Migrations(line)
		if err != nil {
			return nil, err
		}
		for _, m := range migs {
			st := MigrationState{Migration: m}
			if row, ok := applied[migrationKey{line, m.Version}]; ok {
				at := row.AppliedAt
				st.AppliedAt = &at
			}
			out = append(out, st)
		}
	}
	return out, nil
}

type migrationKey struct {
	line    Line
	version int
}

func (s *Store) appliedMigrations(ctx context.Context, tx pgx.Tx) (map[migrationKey]*dbsqlc.SagaboxMigration, error) {
	var db dbsqlc.DBTX
	if tx != nil {
		db = s.db(tx)
	} else {
		var err error
		if db, err = s.pooled(); err != nil {
			return nil, err
		}
	}
	rows, err := s.queries.MigrationList(ctx, db)
	if err != nil {
		if isUndefined(err) {
			return map[migrationKey]*dbsqlc.SagaboxMigration{}, nil
		}
		return nil, fmt.Errorf("list applied migrations in schema %q: %w", s.schema, err)
	}
	out := make(map[migrationKey]*dbsqlc.SagaboxMigration, len(rows))
	for _, r := range rows {
		out[migrationKey{Line(r.Line), int(r.Version)}] = r
	}
	return out, nil
}

// MigrateUp applies every pending migration of lines (all lines when none is
// given), each in its own transaction under an advisory lock held for the
// schema, so that several processes may run it at once. It returns the
// migrations it applied; applying an up-to-date schema is a no-op.
func (s *Store) MigrateUp(ctx context.Context, lines ...Line) ([]Migration, error) {
	if len(lines) == 0 {
		lines = AllLines
	}
	var done []Migration
	for _, line := range lines {
		migs, err := Migrations(line)
		if err != nil {
			return done, err
		}
		for _, m := range migs {
			applied, err := s.migrateOne(ctx, m, false)
			if err != nil {
				return done, err
			}
			if applied {
				done = append(done, m)
			}
		}
	}
	return done, nil
}

// MigrateDown reverts the newest steps applied migrations of line, newest
// first, each in its own transaction under the schema's advisory lock.
func (s *Store) MigrateDown(ctx context.Context, line Line, steps int) ([]Migration, error) {
	migs, err := Migrations(line)
	if err != nil {
		return nil, err
	}
	var done []Migration
	for i := len(migs) - 1; i >= 0 && len(done) < steps; i-- {
		reverted, err := s.migrateOne(ctx, migs[i], true)
		if err != nil {
			return done, err
		}
		if reverted {
			done = append(done, migs[i])
		}
	}
	return done, nil
}

// migrateOne applies (or reverts) m unless that is already done, in one
// transaction that first takes the schema's migration lock.
func (s *Store) migrateOne(ctx context.Context, m Migration, down bool) (bool, error) {
	changed := false
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		if err := s.queries.MigrationLock(ctx, s.db(tx), s.lockKey()); err != nil {
			return fmt.Errorf("take migration lock for schema %q: %w", s.schema, err)
		}
		if err := s.bootstrap(ctx, tx); err != nil {
			return err
		}
		applied, err := s.appliedMigrations(ctx, tx)
		if err != nil {
			return err
		}
		_, isApplied := applied[migrationKey{m.Line, m.Version}]
		if isApplied != down {
			return nil // someone else got there first, or nothing to do
		}
		if !down {
			for v := 1; v < m.Version; v++ {
				if _, ok := applied[migrationKey{m.Line, v}]; !ok {
					return fmt.Errorf("migration %s %d needs %s %d applied first", m.Line, m.Version, m.Line, v)
				}
			}
		}
		sql := m.Up
		if down {
			sql = m.Down
		}
		if _, err := tx.Exec(ctx, s.render(sql)); err != nil {
			return fmt.Errorf("migration %s %d (%s) %s in schema %q: %w", m.Line, m.Version, m.Name, direction(down), s.schema, err)
		}
		if down {
			err = s.queries.MigrationDelete(ctx, s.db(tx), &dbsqlc.MigrationDeleteParams{Line: string(m.Line), Version: int32(m.Version)})
		} else {
			err = s.queries.MigrationInsert(ctx, s.db(tx), &dbsqlc.MigrationInsertParams{Line: string(m.Line), Version: int32(m.Version), Name: m.Name})
		}
		if err != nil {
			return fmt.Errorf("record migration %s %d: %w", m.Line, m.Version, err)
		}
		changed = true
		return nil
	})
	return changed, err
}

// inTx runs fn in a transaction of its own and commits it when fn returns
// nil.
func (s *Store) inTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	if s.pool == nil {
		return fmt.Errorf("store for schema %q has no connection pool", s.schema)
	}
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

func direction(down bool) string {
	if down {
		return "down"
	}
	return "up"
}

// bootstrap creates the schema and the migration table if they are missing.
func (s *Store) bootstrap(ctx context.Context, tx pgx.Tx) error {
	sql, err := fs.ReadFile(migrationFS, "migrations/bootstrap.sql")
	if err != nil {
		return fmt.Errorf("read bootstrap.sql: %w", err)
	}
	ddl := "CREATE SCHEMA IF NOT EXISTS " + pgx.Identifier{s.schema}.Sanitize() + ";\n" + s.render(string(sql))
	if _, err := tx.Exec(ctx, ddl); err != nil {
		return fmt.Errorf("create schema %q and its migration table: %w", s.schema, err)
	}
	return nil
}

func (s *Store) lockKey() int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("sagabox.migrate." + s.schema))
	return int64(h.Sum64())
}

// ErrSchemaOutdated is returned by CheckSchema when migrations are missing.
var ErrSchemaOutdated = driver.ErrSchemaOutdated

// CheckSchema returns an error wrapping ErrSchemaOutdated, naming the command
// to run, unless every migration of lines is applied. Clients call it at
// start instead of creating tables lazily.
func (s *Store) CheckSchema(ctx context.Context, lines ...Line) error {
	applied, err := s.appliedMigrations(ctx, nil)
	if err != nil {
		return err
	}
	for _, line := range lines {
		latest := LatestVersion(line)
		have := 0
		for v := 1; v <= latest; v++ {
			if _, ok := applied[migrationKey{line, v}]; ok {
				have = v
			}
		}
		if have < latest {
			return fmt.Errorf("%w: schema %q has %s migrations up to version %d of %d; run `sagabox migrate up --schema %s --line %s` or call Store.MigrateUp",
				ErrSchemaOutdated, s.schema, line, have, latest, s.schema, line)
		}
	}
	return nil
}

// ListSchemas returns the schemas of the database behind pool that hold
// sagabox tables, so that tools can inspect every service at once.
func ListSchemas(ctx context.Context, pool *pgxpool.Pool) ([]string, error) {
	schemas, err := dbsqlc.New().SchemaList(ctx, pool)
	if err != nil {
		return nil, fmt.Errorf("list sagabox schemas: %w", err)
	}
	return schemas, nil
}
