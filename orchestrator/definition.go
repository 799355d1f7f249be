package orchestrator

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store/driver"
)

// RecordedDefinition is a saga definition as an orchestrator recorded it
// in its schema when it started: its shape, for tools that draw or list it
// without its Go code (`sagabox saga graph`, the web console).
type RecordedDefinition struct {
	// Type and Version name the definition.
	Type    string
	Version int
	// Shape is its steps, groups, compensations, waits, local steps,
	// timeouts and retry policies, as the last orchestrator to start with it
	// recorded them.
	Shape saga.Shape
	// RegisteredAt is when an orchestrator first recorded it; SeenAt when
	// one last started with it.
	RegisteredAt time.Time
	SeenAt       time.Time
}

// Definitions returns the definitions recorded in the Client's schema, by
// name then version. Every orchestrator records the definitions it runs
// when Run starts, so the list holds those of every orchestrator of the
// schema, past and present.
func (c *Client) Definitions(ctx context.Context) ([]RecordedDefinition, error) {
	recs, err := c.db.DefinitionList(ctx)
	if err != nil {
		return nil, fmt.Errorf("orchestrator: %w", err)
	}
	out := make([]RecordedDefinition, len(recs))
	for i := range recs {
		if out[i], err = recordedDefinition(recs[i]); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Definition returns the definition name recorded in the Client's schema
// at version, or at its highest version when version is 0. It returns an
// error wrapping ErrNotFound if none is recorded.
func (c *Client) Definition(ctx context.Context, name string, version int) (*RecordedDefinition, error) {
	if version < 0 {
		return nil, fmt.Errorf("orchestrator: saga definition %q: version %d is negative", name, version)
	}
	rec, err := c.db.DefinitionGet(ctx, name, version)
	if err != nil {
		return nil, fmt.Errorf("orchestrator: %w", err)
	}
	d, err := recordedDefinition(rec)
	if err != nil {
		return nil, err
	}
	return &d, nil
}

func recordedDefinition(rec driver.DefinitionRecord) (RecordedDefinition, error) {
	d := RecordedDefinition{Type: rec.Type, Version: rec.Version, RegisteredAt: rec.RegisteredAt, SeenAt: rec.SeenAt}
	if err := json.Unmarshal(rec.Shape, &d.Shape); err != nil {
		return d, fmt.Errorf("orchestrator: saga definition %s v%d: decode its recorded shape: %w", rec.Type, rec.Version, err)
	}
	return d, nil
}

// recordDefinitions records the shape of every registered definition in
// the schema, and warns about those whose recorded shape was another: a
// definition changed without a new version, under its sagas in flight. A
// failure is logged: the shapes are for tools, sagas run without them.
func (c *Client) recordDefinitions(ctx context.Context) {
	runners := c.registry.Runners()
	defs := make([]driver.DefinitionRecord, len(runners))
	for i, r := range runners {
		shape, err := json.Marshal(saga.ShapeOf(r))
		if err != nil {
			c.log.Error("cannot record the shape of a saga definition", "saga_type", r.Name(), "version", r.Version(), "err", err)
			return
		}
		defs[i] = driver.DefinitionRecord{Type: r.Name(), Version: r.Version(), Shape: shape}
	}
	changed, err := c.db.DefinitionUpsert(ctx, defs, c.now())
	if err != nil {
		if ctx.Err() == nil {
			c.log.Error("cannot record the shapes of the saga definitions: sagabox saga graph and the console will not draw them", "err", err)
		}
		return
	}
	for _, k := range changed {
		c.log.Warn("saga definition changed without a new version: its sagas in flight continue on the new steps; give a changed definition a new version",
			"saga_type", k.Type, "version", k.Version)
	}
}
