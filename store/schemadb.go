package store

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sagabox/sagabox/store/internal/dbsqlc"
)

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
