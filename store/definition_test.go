package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store/driver"
)

// The shapes of definitions: registered once, seen again, changed, read by
// name and version or at the highest version.
func TestDefinitionUpsertRegistersAndReportsChangedShapes(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t)
	ctx := context.Background()
	first := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	defs := []driver.DefinitionRecord{
		{Type: "checkout", Version: 2, Shape: []byte(`{"name":"checkout","version":2,"nodes":[{"kind":"step","name":"b"}]}`)},
		{Type: "checkout", Version: 1, Shape: []byte(`{"name":"checkout","version":1,"nodes":[{"kind":"step","name":"a"}]}`)},
		{Type: "refund", Version: 1, Shape: []byte(`{"name":"refund","version":1,"nodes":[]}`)},
	}
	changed, err := s.DefinitionUpsert(ctx, defs, first)
	require.NoError(t, err)
	require.Empty(t, changed, "new definitions changed nothing")

	// The same shapes later: only seen_at moves. A JSON with other spacing
	// is the same shape.
	later := first.Add(time.Hour)
	defs[2].Shape = []byte(`{ "name": "refund", "version": 1, "nodes": [] }`)
	changed, err = s.DefinitionUpsert(ctx, defs, later)
	require.NoError(t, err)
	require.Empty(t, changed)

	// checkout v1 changed without a new version: reported, and recorded.
	defs[1].Shape = []byte(`{"name":"checkout","version":1,"nodes":[{"kind":"local","name":"a"}]}`)
	changed, err = s.DefinitionUpsert(ctx, defs[1:2], later)
	require.NoError(t, err)
	require.Equal(t, []driver.SagaKey{{Type: "checkout", Version: 1}}, changed)

	list, err := s.DefinitionList(ctx)
	require.NoError(t, err)
	require.Len(t, list, 3)
	require.Equal(t, []driver.SagaKey{{Type: "checkout", Version: 1}, {Type: "checkout", Version: 2}, {Type: "refund", Version: 1}},
		[]driver.SagaKey{{Type: list[0].Type, Version: list[0].Version}, {Type: list[1].Type, Version: list[1].Version}, {Type: list[2].Type, Version: list[2].Version}})
	for _, d := range list {
		require.True(t, d.RegisteredAt.Equal(first), "registered when first seen")
		require.True(t, d.SeenAt.Equal(later), "seen at the last upsert")
	}
	require.JSONEq(t, string(defs[1].Shape), string(list[0].Shape))

	// An orchestrator with a late clock does not move seen_at back.
	_, err = s.DefinitionUpsert(ctx, defs[2:], first)
	require.NoError(t, err)
	got, err := s.DefinitionGet(ctx, "refund", 1)
	require.NoError(t, err)
	require.True(t, got.SeenAt.Equal(later))

	got, err = s.DefinitionGet(ctx, "checkout", 0)
	require.NoError(t, err)
	require.Equal(t, 2, got.Version, "version 0 is the highest")
	got, err = s.DefinitionGet(ctx, "checkout", 1)
	require.NoError(t, err)
	require.Equal(t, 1, got.Version)

	_, err = s.DefinitionGet(ctx, "checkout", 3)
	require.ErrorIs(t, err, message.ErrNotFound)
	require.ErrorContains(t, err, `saga definition "checkout" version 3`)
	_, err = s.DefinitionGet(ctx, "nope", 0)
	require.ErrorIs(t, err, message.ErrNotFound)

	changed, err = s.DefinitionUpsert(ctx, nil, later)
	require.NoError(t, err)
	require.Empty(t, changed)
}
