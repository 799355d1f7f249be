-- Saga line, the saga language v2. Start-key policies: A saga started with a start key keeps a
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

-- Cancel and terminate: operator requests "cancel" (the former "abort",
-- whose recorded requests are renamed; an older CLI may still request
-- "abort", which orchestrators apply as a cancel) and "terminate".
ALTER TABLE /* TEMPLATE: schema */sagabox_saga_operation
    DROP CONSTRAINT IF EXISTS sagabox_saga_operation_action_check;
UPDATE /* TEMPLATE: schema */sagabox_saga_operation SET action = 'cancel' WHERE action = 'abort';
ALTER TABLE /* TEMPLATE: schema */sagabox_saga_operation
    ADD CONSTRAINT sagabox_saga_operation_action_check
    CHECK (action IN ('retry', 'cancel', 'terminate', 'abort'));
