DROP INDEX IF EXISTS /* TEMPLATE: schema */sagabox_saga_start_key_only_idx;
