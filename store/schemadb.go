package store

import (
	"context"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/sagabox/sagabox/store/internal/dbsqlc"
)

// schemaDB rewrites the schema marker of each statement before running it.
type schemaDB struct {
	s     *Store
	inner dbsqlc.DBTX
}

func (d schemaDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return d.inner.Exec(ctx, d.s.render(sql), pgArgs(args)...)
}

func (d schemaDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return d.inner.Query(ctx, d.s.render(sql), pgArgs(args)...)
}

func (d schemaDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return d.inner.QueryRow(ctx, d.s.render(sql), pgArgs(args)...)
}

// pgArgs returns args with the uuid.UUID values (the generated code's type
// for uuid) as pgtype.UUID, which pgx encodes in binary directly: uuid.UUID
// is a driver.Valuer, which pgx encodes through its text form, a cost that
// showed as a tenth of the engine's CPU. args is changed in place.
func pgArgs(args []any) []any {
	for i, a := range args {
		switch v := a.(type) {
		case uuid.UUID:
			args[i] = pgtype.UUID{Bytes: v, Valid: true}
		case uuid.NullUUID:
			args[i] = pgtype.UUID{Bytes: v.UUID, Valid: v.Valid}
		case []uuid.UUID:
			us := make([]pgtype.UUID, len(v))
			for j, u := range v {
				us[j] = pgtype.UUID{Bytes: u, Valid: true}
			}
			args[i] = us
		}
	}
	return args
}
