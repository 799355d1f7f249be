-- Saga line, version 7: an index for the web console's start-key filter
-- without a saga type (sagabox_saga_start_key_idx leads with the type).
CREATE INDEX IF NOT EXISTS sagabox_saga_start_key_only_idx
    ON /* TEMPLATE: schema */sagabox_saga (start_key) WHERE start_key IS NOT NULL;
