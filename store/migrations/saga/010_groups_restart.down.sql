DROP VIEW IF EXISTS /* TEMPLATE: schema */sagabox_saga_step_v;
CREATE VIEW /* TEMPLATE: schema */sagabox_saga_step_v AS
SELECT s.id AS saga_id,
       s.saga_type,
       (st.ordinality - 1)::integer AS step_index,
       st.value ->> 'name' AS step,
       st.value ->> 'status' AS status,
       coalesce((st.value ->> 'attempt')::integer, 0) AS attempt,
       (st.value ->> 'deadline')::timestamptz AS deadline,
       (st.value ->> 'started_at')::timestamptz AS started_at,
       (st.value ->> 'finished_at')::timestamptz AS finished_at,
       st.value ->> 'last_error' AS last_error
FROM /* TEMPLATE: schema */sagabox_saga s,
     jsonb_array_elements(s.steps) WITH ORDINALITY AS st(value, ordinality);

DROP VIEW IF EXISTS /* TEMPLATE: schema */sagabox_saga_v;
CREATE VIEW /* TEMPLATE: schema */sagabox_saga_v AS
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

-- Pending restart requests cannot be applied after the downgrade; the
-- applied ones stay, as the audit record they are.
UPDATE /* TEMPLATE: schema */sagabox_saga_operation
SET applied_at = now(), error = 'restart is not supported by this version'
WHERE action = 'restart' AND applied_at IS NULL AND withdrawn_at IS NULL;
ALTER TABLE /* TEMPLATE: schema */sagabox_saga_operation DROP COLUMN IF EXISTS params;

ALTER TABLE /* TEMPLATE: schema */sagabox_saga DROP COLUMN IF EXISTS run;
