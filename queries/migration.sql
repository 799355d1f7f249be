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

-- name: SchemaList :many
-- Lists the schemas that hold sagabox tables (they have a migration table).
SELECT n.nspname::text AS schema
FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relname = 'sagabox_migration' AND c.relkind = 'r'
ORDER BY n.nspname;
