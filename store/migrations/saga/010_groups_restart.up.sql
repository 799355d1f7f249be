-- Saga line, version 10: parallel step groups and restart from a step.
--
-- A saga's run counts the operator's restarts (saga.Instance.Run): the
-- commands of a restarted run carry it, and the participants' barriers keep
-- one mark per run, so the restarted steps are performed again. A restart
-- may also move the saga to a newer version of its definition.
ALTER TABLE /* TEMPLATE: schema */sagabox_saga
    ADD COLUMN IF NOT EXISTS run integer NOT NULL DEFAULT 0;

-- Operator requests "restart", whose step, version and replacement data are
-- its params: {"from": "step", "version": 2, "data": {...}}.
ALTER TABLE /* TEMPLATE: schema */sagabox_saga_operation
    DROP CONSTRAINT IF EXISTS sagabox_saga_operation_action_check;
ALTER TABLE /* TEMPLATE: schema */sagabox_saga_operation
    ADD COLUMN IF NOT EXISTS params jsonb,
    ADD CONSTRAINT sagabox_saga_operation_action_check
    CHECK (action IN ('retry', 'cancel', 'terminate', 'abort', 'restart'));

-- The views gain columns, as they only ever do: a saga's run, and the
-- parallel group a step is a branch of.
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
       extract(epoch FROM coalesce(s.admitted_at, now()) - s.created_at)::float8 AS admission_wait_seconds,
       s.run
FROM /* TEMPLATE: schema */sagabox_saga s;

CREATE OR REPLACE VIEW /* TEMPLATE: schema */sagabox_saga_step_v AS
SELECT s.id AS saga_id,
       s.saga_type,
       (st.ordinality - 1)::integer AS step_index,
       st.value ->> 'name' AS step,
       st.value ->> 'status' AS status,
       coalesce((st.value ->> 'attempt')::integer, 0) AS attempt,
       (st.value ->> 'deadline')::timestamptz AS deadline,
       (st.value ->> 'started_at')::timestamptz AS started_at,
       (st.value ->> 'finished_at')::timestamptz AS finished_at,
       st.value ->> 'last_error' AS last_error,
       st.value ->> 'group' AS step_group
FROM /* TEMPLATE: schema */sagabox_saga s,
     jsonb_array_elements(s.steps) WITH ORDINALITY AS st(value, ordinality);
