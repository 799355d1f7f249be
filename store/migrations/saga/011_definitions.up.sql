-- Saga line, version 11: the shapes of the definitions an orchestrator runs.
--
-- An orchestrator records, when it starts, the shape of every definition it
-- registers (saga.Shape as JSON: steps, parallel groups, compensations,
-- waits, local steps, timeouts, retry policies), so that tools without the
-- definitions' Go code (`sagabox saga graph`, the web console) can draw
-- them. registered_at is when an orchestrator first recorded the name and
-- version, seen_at when one last did.
CREATE TABLE IF NOT EXISTS /* TEMPLATE: schema */sagabox_saga_definition (
    saga_type     text        NOT NULL,
    version       integer     NOT NULL CHECK (version >= 1),
    shape         jsonb       NOT NULL,
    registered_at timestamptz NOT NULL,
    seen_at       timestamptz NOT NULL,
    PRIMARY KEY (saga_type, version)
);
