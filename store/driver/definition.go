package driver

import "time"

// DefinitionRecord is the recorded shape of a saga definition an
// orchestrator runs (sagabox_saga_definition).
type DefinitionRecord struct {
	// Type and Version name the definition.
	Type    string
	Version int
	// Shape is its saga.Shape as JSON.
	Shape []byte
	// RegisteredAt is when an orchestrator first recorded it; SeenAt when
	// one last did.
	RegisteredAt time.Time
	SeenAt       time.Time
}
