-- Saga line, version 2: operator requests and the inspection views.

-- Operator actions requested from outside the orchestrator process (the
-- sagabox CLI). Running the saga core needs the definitions, which only an
-- orchestrator has: the orchestrator applies pending requests and records
-- the outcome here.
CREATE TABLE /* TEMPLATE: schema */sagabox_saga_operation (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    saga_id         uuid        NOT NULL,
    action          text        NOT NULL CHECK (action IN ('retry', 'abort')),
    actor           text        NOT NULL,
    reason          text        NOT NULL,
    requested_at    timestamptz NOT NULL DEFAULT now(),
    applied_at      timestamptz,
    -- error is empty when the action was applied, else why it was refused.
    error           text        NOT NULL DEFAULT ''
);
CREATE INDEX sagabox_saga_operation_pending_idx
    ON /* TEMPLATE: schema */sagabox_saga_operation (id) WHERE applied_at IS NULL;

-- Inspection views: a supported, stable query API for psql and BI tools.
-- Columns are only ever added to them, never renamed or removed.

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

CREATE VIEW /* TEMPLATE: schema */sagabox_saga_history_v AS
SELECT h.saga_id, s.saga_type, h.id AS seq, h.at, h.event, h.step, h.step_index, h.phase,
       h.attempt, h.detail, h.actor, h.message_id
FROM /* TEMPLATE: schema */sagabox_saga_history h
JOIN /* TEMPLATE: schema */sagabox_saga s ON s.id = h.saga_id;
