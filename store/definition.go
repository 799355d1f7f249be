package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store/driver"
	"github.com/sagabox/sagabox/store/internal/dbsqlc"
)

// DefinitionUpsert records the shapes of defs, seen at now, in one
// statement, and returns those whose recorded shape was another. The rows
// are written in name and version order, so that orchestrators starting
// together lock them in one order.
func (s *executor) DefinitionUpsert(ctx context.Context, defs []driver.DefinitionRecord, now time.Time) ([]driver.SagaKey, error) {
	if len(defs) == 0 {
		return nil, nil
	}
	db, err := s.pooled()
	if err != nil {
		return nil, err
	}
	sorted := slices.Clone(defs)
	slices.SortFunc(sorted, func(a, b driver.DefinitionRecord) int {
		return cmp.Or(cmp.Compare(a.Type, b.Type), cmp.Compare(a.Version, b.Version))
	})
	p := &dbsqlc.SagaDefinitionUpsertParams{SeenAt: now}
	for _, d := range sorted {
		p.SagaTypes = append(p.SagaTypes, d.Type)
		p.Versions = append(p.Versions, int32(d.Version))
		p.Shapes = append(p.Shapes, d.Shape)
	}
	rows, err := s.queries.SagaDefinitionUpsert(ctx, db, p)
	if err != nil {
		return nil, fmt.Errorf("record the shapes of %d saga definitions: %w", len(defs), err)
	}
	changed := make([]driver.SagaKey, len(rows))
	for i, r := range rows {
		changed[i] = driver.SagaKey{Type: r.SagaType, Version: int(r.Version)}
	}
	return changed, nil
}

// DefinitionList returns every recorded definition, by name then version.
func (s *executor) DefinitionList(ctx context.Context) ([]driver.DefinitionRecord, error) {
	db, err := s.pooled()
	if err != nil {
		return nil, err
	}
	rows, err := s.queries.SagaDefinitionList(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("list saga definitions: %w", err)
	}
	out := make([]driver.DefinitionRecord, len(rows))
	for i, r := range rows {
		out[i] = definitionRecord(r)
	}
	return out, nil
}

// DefinitionGet returns the recorded definition sagaType at version (0:
// its highest), or an error wrapping message.ErrNotFound.
func (s *executor) DefinitionGet(ctx context.Context, sagaType string, version int) (driver.DefinitionRecord, error) {
	db, err := s.pooled()
	if err != nil {
		return driver.DefinitionRecord{}, err
	}
	r, err := s.queries.SagaDefinitionGet(ctx, db, &dbsqlc.SagaDefinitionGetParams{SagaType: sagaType, Version: int32(version)})
	what := fmt.Sprintf("saga definition %q version %d", sagaType, version)
	if version == 0 {
		what = fmt.Sprintf("saga definition %q", sagaType)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return driver.DefinitionRecord{}, fmt.Errorf("%s: %w", what, message.ErrNotFound)
	}
	if err != nil {
		return driver.DefinitionRecord{}, fmt.Errorf("get %s: %w", what, err)
	}
	return definitionRecord(r), nil
}

func definitionRecord(r *dbsqlc.SagaboxSagaDefinition) driver.DefinitionRecord {
	return driver.DefinitionRecord{
		Type: r.SagaType, Version: int(r.Version), Shape: r.Shape, RegisteredAt: r.RegisteredAt, SeenAt: r.SeenAt,
	}
}
