-- Saga line, version 8: the current step's name of a finished saga, and operator
-- requests that can be withdrawn.
--
-- A finished saga has current_step -1, and `steps -> -1` counts from the end
-- of the array in PostgreSQL: sagabox_saga_v named the last step (one that
-- may never have run) as the current step of every finished saga. It is
-- NULL now when no step is current.
CREATE OR REPLACE VIEW /* TEMPLATE: schema */sagabox_saga_v AS
SELECT s.id,
       s.saga_type,
       s.version,
       s.status,
       s.current_step,
       CASE WHEN s.current_step >= 0 THEN s.steps -> s.current_step ->> 'name' END AS current_step_name,
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

-- An operator request the CLI withdrew (its --wait expired, it was
-- interrupted, or `sagabox ops cancel`): no orchestrator applies it. A
-- request is pending while both applied_at and withdrawn_at are NULL; the
-- orchestrator claims it with a row lock, so a withdrawal and an application
-- never both happen.
ALTER TABLE /* TEMPLATE: schema */sagabox_saga_operation
    ADD COLUMN IF NOT EXISTS withdrawn_at timestamptz,
    ADD COLUMN IF NOT EXISTS withdrawn_by text NOT NULL DEFAULT '';
DROP INDEX IF EXISTS /* TEMPLATE: schema */sagabox_saga_operation_pending_idx;
CREATE INDEX IF NOT EXISTS sagabox_saga_operation_pending_idx
    ON /* TEMPLATE: schema */sagabox_saga_operation (id) WHERE applied_at IS NULL AND withdrawn_at IS NULL;
