-- Saga line, version 6: flow control. A saga started while its definition
-- has as many running sagas as its limit allows, or while another saga of
-- its concurrency key runs, is stored as 'queued': its row and a history
-- entry, no step state and no message. The orchestrator's admission pass
-- starts queued sagas in start order (created_at, id) as running ones end.
--
-- concurrency_key: at most one saga of a type and key is running or
-- compensating at a time (StartOpts.ConcurrencyKey). admitted_at: when the
-- saga's first step was run; created_at for a saga that never waited.
ALTER TABLE /* TEMPLATE: schema */sagabox_saga
    ADD COLUMN concurrency_key text,
    ADD COLUMN admitted_at timestamptz;
UPDATE /* TEMPLATE: schema */sagabox_saga SET admitted_at = created_at;

-- The sagas that hold or wait for a concurrency key.
CREATE INDEX sagabox_saga_concurrency_key_idx
    ON /* TEMPLATE: schema */sagabox_saga (saga_type, concurrency_key, created_at, id)
    WHERE concurrency_key IS NOT NULL AND status IN ('queued', 'running', 'compensating');

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

-- Sagas waiting for admission, per type: how many and since when.
CREATE VIEW /* TEMPLATE: schema */sagabox_saga_queued_v AS
SELECT s.saga_type,
       count(*) AS queued,
       min(s.created_at) AS oldest_queued_at,
       extract(epoch FROM now() - min(s.created_at))::float8 AS oldest_wait_seconds
FROM /* TEMPLATE: schema */sagabox_saga s
WHERE s.status = 'queued'
GROUP BY s.saga_type;
