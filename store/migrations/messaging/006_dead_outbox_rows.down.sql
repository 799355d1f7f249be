DROP VIEW IF EXISTS /* TEMPLATE: schema */sagabox_outbox_dead_v;
DROP INDEX IF EXISTS /* TEMPLATE: schema */sagabox_outbox_dead_idx;
ALTER TABLE /* TEMPLATE: schema */sagabox_outbox DROP COLUMN IF EXISTS dead_at;
