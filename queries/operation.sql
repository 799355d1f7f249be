-- Operator actions requested from outside an orchestrator (the sagabox CLI),
-- which a running orchestrator applies.

-- name: SagaOperationInsert :one
-- Requests an operator action on a saga; an orchestrator applies it.
INSERT INTO /* TEMPLATE: schema */sagabox_saga_operation (saga_id, action, actor, reason, params)
VALUES (@saga_id::uuid, @action::text, @actor::text, @reason::text, @params::jsonb)
RETURNING *;

-- name: SagaOperationClaim :one
-- Locks the oldest pending operator request, skipping those another
-- orchestrator is applying. Only requests for sagas of the definitions
-- (type, version pairs) the caller runs, or for sagas that do not exist (to
-- be refused), are claimed: requests left for another orchestrator never
-- hide the caller's own behind them.
SELECT o.* FROM /* TEMPLATE: schema */sagabox_saga_operation o
LEFT JOIN /* TEMPLATE: schema */sagabox_saga s ON s.id = o.saga_id
WHERE o.applied_at IS NULL AND o.withdrawn_at IS NULL
  AND (s.id IS NULL OR (s.saga_type, s.version) IN (
      SELECT unnest(@saga_types::text[]), unnest(@versions::integer[])
  ))
ORDER BY o.id
LIMIT 1
FOR UPDATE OF o SKIP LOCKED;

-- name: SagaOperationMarkApplied :exec
UPDATE /* TEMPLATE: schema */sagabox_saga_operation
SET applied_at = @applied_at::timestamptz, error = @error::text
WHERE id = @id::bigint;

-- name: SagaOperationGet :one
SELECT * FROM /* TEMPLATE: schema */sagabox_saga_operation WHERE id = @id::bigint;

-- name: SagaOperationListPendingAfter :many
-- Lists pending operator requests oldest first, after request @after_id
-- (keyset paging on the pending index).
SELECT * FROM /* TEMPLATE: schema */sagabox_saga_operation
WHERE applied_at IS NULL AND withdrawn_at IS NULL AND id > @after_id::bigint
ORDER BY id
LIMIT @max::integer;

-- name: SagaOperationWithdraw :one
-- Withdraws a pending operator request: no orchestrator applies it. It
-- waits for an orchestrator applying it right now and then matches nothing,
-- so a request is either applied or withdrawn, never both.
UPDATE /* TEMPLATE: schema */sagabox_saga_operation
SET withdrawn_at = now(), withdrawn_by = @actor::text
WHERE id = @id::bigint AND applied_at IS NULL AND withdrawn_at IS NULL
RETURNING *;

-- name: SagaOperationListPending :many
-- The pending operator requests, oldest first (the partial index).
SELECT * FROM /* TEMPLATE: schema */sagabox_saga_operation
WHERE applied_at IS NULL AND withdrawn_at IS NULL
ORDER BY id
LIMIT @max_rows::integer;

-- name: SagaOperationListRecent :many
-- The most recent operator requests, pending or not, newest first.
SELECT * FROM /* TEMPLATE: schema */sagabox_saga_operation
ORDER BY id DESC
LIMIT @max_rows::integer;

-- name: SagaOperationCountPending :one
-- Counts the pending operator requests (the partial index).
SELECT count(*) FROM /* TEMPLATE: schema */sagabox_saga_operation
WHERE applied_at IS NULL AND withdrawn_at IS NULL;
