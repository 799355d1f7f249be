-- Saga line, version 9: the saga language v2. Start-key policies: A saga started with a start key keeps a
-- hash of the data it was started with, so that a second start with the
-- same key and different data is told from a retry of the same start. A key
-- can name a new saga once the saga it named has finished
-- (StartKeyReuseFinished): the old saga keeps its key, marked released, and
-- only one saga of a type holds a key unreleased.

ALTER TABLE /* TEMPLATE: schema */sagabox_saga
    ADD COLUMN IF NOT EXISTS start_data_hash bytea,
    ADD COLUMN IF NOT EXISTS start_key_released boolean NOT NULL DEFAULT false;

CREATE UNIQUE INDEX IF NOT EXISTS sagabox_saga_start_key_held_idx
    ON /* TEMPLATE: schema */sagabox_saga (saga_type, start_key)
    WHERE start_key IS NOT NULL AND NOT start_key_released;
DROP INDEX IF EXISTS /* TEMPLATE: schema */sagabox_saga_start_key_idx;
-- Every saga a key has named, for listing by start key.
CREATE INDEX IF NOT EXISTS sagabox_saga_start_key_idx
    ON /* TEMPLATE: schema */sagabox_saga (start_key) WHERE start_key IS NOT NULL;
-- The same as the web console's index of version 7, which it replaces.
DROP INDEX IF EXISTS /* TEMPLATE: schema */sagabox_saga_start_key_only_idx;

-- Cancel and terminate: operator requests "cancel" (the former "abort",
-- whose recorded requests are renamed; an older CLI may still request
-- "abort", which orchestrators apply as a cancel) and "terminate".
ALTER TABLE /* TEMPLATE: schema */sagabox_saga_operation
    DROP CONSTRAINT IF EXISTS sagabox_saga_operation_action_check;
UPDATE /* TEMPLATE: schema */sagabox_saga_operation SET action = 'cancel' WHERE action = 'abort';
ALTER TABLE /* TEMPLATE: schema */sagabox_saga_operation
    ADD CONSTRAINT sagabox_saga_operation_action_check
    CHECK (action IN ('retry', 'cancel', 'terminate', 'abort'));

-- Outside events (orchestrator.SendEvent), written in the sender's
-- transaction: one row per saga and sender-chosen event id, which
-- deduplicates them. A pending event waits for a step of its saga to wait
-- for it; a consumed one was applied; an ignored one came for a saga that
-- had ended (detail says why).
CREATE TABLE IF NOT EXISTS /* TEMPLATE: schema */sagabox_saga_event (
    saga_id         uuid        NOT NULL REFERENCES /* TEMPLATE: schema */sagabox_saga (id) ON DELETE CASCADE,
    event_id        text        NOT NULL,
    name            text        NOT NULL,
    payload         jsonb       NOT NULL,
    received_at     timestamptz NOT NULL,
    status          text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'consumed', 'ignored')),
    detail          text        NOT NULL DEFAULT '',
    settled_at      timestamptz,
    PRIMARY KEY (saga_id, event_id)
);
CREATE INDEX IF NOT EXISTS sagabox_saga_event_pending_idx
    ON /* TEMPLATE: schema */sagabox_saga_event (saga_id, name, received_at) WHERE status = 'pending';
