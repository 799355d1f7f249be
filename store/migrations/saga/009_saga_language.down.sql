DROP TABLE IF EXISTS /* TEMPLATE: schema */sagabox_saga_event;

-- Back to "retry" and "abort" requests: cancel requests become aborts,
-- terminate requests are dropped, and terminated sagas become failed ones
-- (they wait for an operator), which the older code knows.
ALTER TABLE /* TEMPLATE: schema */sagabox_saga_operation
    DROP CONSTRAINT IF EXISTS sagabox_saga_operation_action_check;
UPDATE /* TEMPLATE: schema */sagabox_saga_operation SET action = 'abort' WHERE action = 'cancel';
DELETE FROM /* TEMPLATE: schema */sagabox_saga_operation WHERE action = 'terminate';
ALTER TABLE /* TEMPLATE: schema */sagabox_saga_operation
    ADD CONSTRAINT sagabox_saga_operation_action_check CHECK (action IN ('retry', 'abort'));
UPDATE /* TEMPLATE: schema */sagabox_saga SET status = 'failed', current_step = 0, finished_at = NULL
    WHERE status = 'terminated';

-- Back to one saga per start key and type: the released keys of older
-- sagas are dropped.
DROP INDEX IF EXISTS /* TEMPLATE: schema */sagabox_saga_start_key_idx;
UPDATE /* TEMPLATE: schema */sagabox_saga SET start_key = NULL WHERE start_key_released;
DROP INDEX IF EXISTS /* TEMPLATE: schema */sagabox_saga_start_key_held_idx;
CREATE UNIQUE INDEX sagabox_saga_start_key_idx
    ON /* TEMPLATE: schema */sagabox_saga (saga_type, start_key) WHERE start_key IS NOT NULL;
ALTER TABLE /* TEMPLATE: schema */sagabox_saga
    DROP COLUMN IF EXISTS start_data_hash,
    DROP COLUMN IF EXISTS start_key_released;

CREATE INDEX IF NOT EXISTS sagabox_saga_start_key_only_idx
    ON /* TEMPLATE: schema */sagabox_saga (start_key) WHERE start_key IS NOT NULL;
