-- The shapes of the definitions orchestrators run (saga.Shape as JSON),
-- recorded when an orchestrator starts, for tools without their Go code.

-- name: SagaDefinitionUpsert :many
-- Records the shapes of definitions, one per element of @saga_types,
-- @versions and @shapes (in name and version order, so that concurrent
-- starts lock the rows in one order), seen at @seen_at: a new
-- name and version is registered then, a known one gets its shape and
-- seen_at updated. It returns the names and versions whose recorded shape
-- was another (a definition changed without a new version): the final
-- SELECT reads the rows as they were before the INSERT.
WITH input AS (
    SELECT unnest(@saga_types::text[]) AS saga_type, unnest(@versions::integer[]) AS version,
           unnest(@shapes::jsonb[]) AS shape
), upserted AS (
    INSERT INTO /* TEMPLATE: schema */sagabox_saga_definition AS t (saga_type, version, shape, registered_at, seen_at)
    SELECT i.saga_type, i.version, i.shape, @seen_at::timestamptz, @seen_at::timestamptz FROM input i
    ON CONFLICT (saga_type, version) DO UPDATE
    SET shape = excluded.shape, seen_at = greatest(t.seen_at, excluded.seen_at)
    RETURNING t.saga_type
)
SELECT d.saga_type, d.version
FROM /* TEMPLATE: schema */sagabox_saga_definition d
JOIN input i ON i.saga_type = d.saga_type AND i.version = d.version
WHERE d.shape <> i.shape
ORDER BY d.saga_type, d.version;

-- name: SagaDefinitionList :many
-- Every recorded definition, by name then version.
SELECT * FROM /* TEMPLATE: schema */sagabox_saga_definition
ORDER BY saga_type, version;

-- name: SagaDefinitionGet :one
-- The recorded definition @saga_type at @version, or at its highest
-- version when @version is 0.
SELECT * FROM /* TEMPLATE: schema */sagabox_saga_definition
WHERE saga_type = @saga_type::text AND (@version::integer = 0 OR version = @version::integer)
ORDER BY version DESC
LIMIT 1;
