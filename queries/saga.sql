-- name: SagaInsert :one
-- Inserts a saga in the caller's transaction. With a start key that already
-- exists for the saga type nothing is inserted and no row is returned.
INSERT INTO /* TEMPLATE: schema */sagabox_saga (
    id, saga_type, version, status, start_key, data, steps, current_step, phase,
    deadline, attempts, last_error, created_at, updated_at, finished_at, traceparent, tracestate
) VALUES (
    @id::uuid, @saga_type::text, @version::integer, @status::text, sqlc.narg('start_key')::text,
    @data::jsonb, @steps::jsonb, @current_step::integer, @phase::text,
    sqlc.narg('deadline')::timestamptz, @attempts::integer, @last_error::text,
    @now::timestamptz, @now::timestamptz, sqlc.narg('finished_at')::timestamptz,
    @traceparent::text, @tracestate::text
)
ON CONFLICT (saga_type, start_key) WHERE start_key IS NOT NULL DO NOTHING
RETURNING *;

-- name: SagaGetByStartKey :one
SELECT * FROM /* TEMPLATE: schema */sagabox_saga
WHERE saga_type = @saga_type::text AND start_key = @start_key::text;

-- name: SagaGet :one
SELECT * FROM /* TEMPLATE: schema */sagabox_saga WHERE id = @id::uuid;

-- name: SagaGetForUpdate :one
-- Locks one saga so that its events are applied one at a time.
SELECT * FROM /* TEMPLATE: schema */sagabox_saga WHERE id = @id::uuid FOR UPDATE;

-- name: SagaUpdate :execrows
-- Writes a transition. The revision check makes a lost update impossible even
-- if a caller forgot the row lock.
UPDATE /* TEMPLATE: schema */sagabox_saga
SET status = @status::text,
    data = @data::jsonb,
    steps = @steps::jsonb,
    current_step = @current_step::integer,
    phase = @phase::text,
    deadline = sqlc.narg('deadline')::timestamptz,
    attempts = @attempts::integer,
    last_error = @last_error::text,
    revision = revision + 1,
    updated_at = @now::timestamptz,
    finished_at = sqlc.narg('finished_at')::timestamptz
WHERE id = @id::uuid AND revision = @revision::bigint;

-- name: SagaClaimDue :many
-- Locks up to @max sagas whose deadline has passed, skipping sagas another
-- orchestrator is working on. The caller applies their timers in the same
-- transaction, so each deadline fires once.
SELECT * FROM /* TEMPLATE: schema */sagabox_saga
WHERE deadline <= @now::timestamptz
  AND deadline IS NOT NULL
  AND status IN ('running', 'compensating')
ORDER BY deadline
LIMIT @max::integer
FOR UPDATE SKIP LOCKED;

-- name: SagaList :many
-- Lists sagas stalest first (least recently updated), filtered by type,
-- status and age, with keyset paging on (updated_at, id).
SELECT * FROM /* TEMPLATE: schema */sagabox_saga
WHERE (sqlc.narg('saga_type')::text IS NULL OR saga_type = sqlc.narg('saga_type')::text)
  AND (cardinality(@statuses::text[]) = 0 OR status = ANY(@statuses::text[]))
  AND (sqlc.narg('updated_before')::timestamptz IS NULL OR updated_at < sqlc.narg('updated_before')::timestamptz)
  AND (sqlc.narg('after_updated_at')::timestamptz IS NULL
       OR (updated_at, id) > (sqlc.narg('after_updated_at')::timestamptz, sqlc.narg('after_id')::uuid))
ORDER BY updated_at, id
LIMIT @max::integer;

-- name: SagaCountByStatus :many
SELECT saga_type, status, count(*)::bigint AS count
FROM /* TEMPLATE: schema */sagabox_saga
GROUP BY saga_type, status
ORDER BY saga_type, status;

-- name: SagaCountOverdue :one
-- Sagas whose deadline passed more than @grace ago: the sweeper is behind or
-- not running.
SELECT count(*)::bigint FROM /* TEMPLATE: schema */sagabox_saga
WHERE deadline < @before::timestamptz AND status IN ('running', 'compensating');

-- name: SagaDeleteFinishedBefore :execrows
DELETE FROM /* TEMPLATE: schema */sagabox_saga
WHERE id IN (
    SELECT id FROM /* TEMPLATE: schema */sagabox_saga
    WHERE finished_at < @finished_before::timestamptz
    ORDER BY finished_at
    LIMIT @max::integer
);

-- name: SagaHistoryInsert :exec
INSERT INTO /* TEMPLATE: schema */sagabox_saga_history (
    saga_id, at, event, step, step_index, phase, attempt, detail, actor, message_id
)
SELECT @saga_id::uuid,
       unnest(@at::timestamptz[]),
       unnest(@event::text[]),
       unnest(@step::text[]),
       unnest(@step_index::integer[]),
       unnest(@phase::text[]),
       unnest(@attempt::integer[]),
       unnest(@detail::text[]),
       unnest(@actor::text[]),
       nullif(unnest(@message_id::uuid[]), '00000000-0000-0000-0000-000000000000'::uuid);

-- name: SagaHistoryList :many
SELECT * FROM /* TEMPLATE: schema */sagabox_saga_history
WHERE saga_id = @saga_id::uuid
ORDER BY id;

-- name: SagaClaimDueOf :many
-- SagaClaimDue restricted to the definitions (type, version pairs) the
-- caller can run: an orchestrator never claims, and so never starves on,
-- sagas of a definition it does not know.
SELECT s.* FROM /* TEMPLATE: schema */sagabox_saga s
WHERE s.deadline <= @now::timestamptz
  AND s.deadline IS NOT NULL
  AND s.status IN ('running', 'compensating')
  AND (s.saga_type, s.version) IN (
      SELECT unnest(@saga_types::text[]), unnest(@versions::integer[])
  )
ORDER BY s.deadline
LIMIT @max::integer
FOR UPDATE OF s SKIP LOCKED;

-- name: SagaOperationInsert :one
-- Requests an operator action on a saga; an orchestrator applies it.
INSERT INTO /* TEMPLATE: schema */sagabox_saga_operation (saga_id, action, actor, reason)
VALUES (@saga_id::uuid, @action::text, @actor::text, @reason::text)
RETURNING *;

-- name: SagaOperationClaimPending :many
-- Locks up to @max pending operator requests, oldest first, skipping those
-- another orchestrator is applying. Only requests for sagas of the
-- definitions (type, version pairs) the caller runs, or for sagas that do
-- not exist (to be refused), are claimed: requests left for another
-- orchestrator never hide the caller's own behind them.
SELECT o.* FROM /* TEMPLATE: schema */sagabox_saga_operation o
LEFT JOIN /* TEMPLATE: schema */sagabox_saga s ON s.id = o.saga_id
WHERE o.applied_at IS NULL
  AND (s.id IS NULL OR (s.saga_type, s.version) IN (
      SELECT unnest(@saga_types::text[]), unnest(@versions::integer[])
  ))
ORDER BY o.id
LIMIT @max::integer
FOR UPDATE OF o SKIP LOCKED;

-- name: SagaOperationMarkApplied :exec
UPDATE /* TEMPLATE: schema */sagabox_saga_operation
SET applied_at = @applied_at::timestamptz, error = @error::text
WHERE id = @id::bigint;

-- name: SagaOperationGet :one
SELECT * FROM /* TEMPLATE: schema */sagabox_saga_operation WHERE id = @id::bigint;
