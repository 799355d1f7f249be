DROP VIEW IF EXISTS /* TEMPLATE: schema */sagabox_saga_queued_v;
DROP VIEW IF EXISTS /* TEMPLATE: schema */sagabox_saga_v;
CREATE VIEW /* TEMPLATE: schema */sagabox_saga_v AS
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
       s.data
FROM /* TEMPLATE: schema */sagabox_saga s;
DROP INDEX IF EXISTS /* TEMPLATE: schema */sagabox_saga_concurrency_key_idx;
ALTER TABLE /* TEMPLATE: schema */sagabox_saga
    DROP COLUMN IF EXISTS admitted_at,
    DROP COLUMN IF EXISTS concurrency_key;
