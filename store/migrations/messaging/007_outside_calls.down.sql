DROP INDEX IF EXISTS /* TEMPLATE: schema */sagabox_inbox_started_idx;
ALTER TABLE /* TEMPLATE: schema */sagabox_inbox
    DROP COLUMN IF EXISTS attempt,
    DROP COLUMN IF EXISTS state;
