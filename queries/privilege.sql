-- name: PrivilegeRole :one
-- The current role, whether the schema exists and the role may use it,
-- and whether it may read the write-ahead log (REPLICATION, or superuser).
-- This and PrivilegeMissing read the catalogs only, which every role may,
-- so they answer even for a role that may not use the schema.
SELECT current_user::text AS role,
    (n.oid IS NOT NULL)::boolean AS schema_exists,
    coalesce(pg_catalog.has_schema_privilege(n.oid, 'USAGE'), false)::boolean AS schema_usage,
    coalesce((SELECT r.rolreplication OR r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user), false)::boolean AS replication
FROM (SELECT 1) AS one
LEFT JOIN pg_catalog.pg_namespace n ON n.nspname = @schema::text;

-- name: PrivilegeMissing :many
-- The privileges the current role lacks on the schema's sagabox tables,
-- views and functions: SELECT on every one of them (the migration table
-- and the views are read only), INSERT, UPDATE and DELETE on the tables
-- unless @read_only, and EXECUTE on the functions.
SELECT c.relname::text AS object,
    (CASE WHEN c.relkind = 'v' THEN 'view' ELSE 'table' END)::text AS kind,
    p.privilege::text AS privilege
FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
CROSS JOIN LATERAL unnest(CASE
    WHEN @read_only::boolean OR c.relkind = 'v' OR c.relname = 'sagabox_migration' THEN ARRAY['SELECT']::text[]
    ELSE ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE']::text[] END) AS p(privilege)
WHERE n.nspname = @schema::text AND c.relkind IN ('r', 'p', 'v') AND c.relname LIKE 'sagabox\_%'
    AND NOT pg_catalog.has_table_privilege(c.oid, p.privilege)
UNION ALL
SELECT (f.proname || '(' || pg_catalog.pg_get_function_identity_arguments(f.oid) || ')')::text,
    'function'::text, 'EXECUTE'::text
FROM pg_catalog.pg_proc f
JOIN pg_catalog.pg_namespace n ON n.oid = f.pronamespace
WHERE n.nspname = @schema::text AND f.proname LIKE 'sagabox\_%'
    AND NOT pg_catalog.has_function_privilege(f.oid, 'EXECUTE')
ORDER BY 1, 3;
