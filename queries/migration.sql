-- name: MigrationLock :exec
-- Serialises migrators of one schema for the rest of the transaction.
SELECT pg_advisory_xact_lock(@key::bigint);

-- name: MigrationList :many
SELECT * FROM /* TEMPLATE: schema */sagabox_migration
ORDER BY line, version;

-- name: MigrationInsert :exec
INSERT INTO /* TEMPLATE: schema */sagabox_migration (line, version, name)
VALUES (@line::text, @version::integer, @name::text);

-- name: MigrationDelete :exec
DELETE FROM /* TEMPLATE: schema */sagabox_migration
WHERE line = @line::text AND version = @version::integer;
