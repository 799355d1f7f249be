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
