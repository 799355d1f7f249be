DROP INDEX IF EXISTS /* TEMPLATE: schema */sagabox_saga_operation_pending_idx;
-- Withdrawn requests must not be applied after the downgrade.
UPDATE /* TEMPLATE: schema */sagabox_saga_operation
SET applied_at = withdrawn_at, error = 'withdrawn by ' || withdrawn_by
WHERE withdrawn_at IS NOT NULL AND applied_at IS NULL;
ALTER TABLE /* TEMPLATE: schema */sagabox_saga_operation
    DROP COLUMN IF EXISTS withdrawn_by,
    DROP COLUMN IF EXISTS withdrawn_at;
CREATE INDEX IF NOT EXISTS sagabox_saga_operation_pending_idx
    ON /* TEMPLATE: schema */sagabox_saga_operation (id) WHERE applied_at IS NULL;

CREATE OR REPLACE VIEW /* TEMPLATE: schema */sagabox_saga_v AS
SELECT s.id,
       s.saga_type,
       s.version,
       s.status,
       s.current_step,
       s.steps -> s.current_step ->> 'name' AS current_step_name,
       s.phase,
       s.last_error,
       s.deadline,
       s.start_key,
       s.revision,
       s.created_at,
       s.updated_at,
       s.finished_at,
       extract(epoch FROM coalesce(s.finished_at, now()) - s.created_at)::float8 AS age_seconds,
       s.data,
       s.concurrency_key,
       s.admitted_at,
       extract(epoch FROM coalesce(s.admitted_at, now()) - s.created_at)::float8 AS admission_wait_seconds
FROM /* TEMPLATE: schema */sagabox_saga s;
