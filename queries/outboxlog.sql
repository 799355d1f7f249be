-- name: OutboxLogStatus :one
-- The state of log mode's set-up: the server's wal_level, whether the
-- publication and the slot exist, who reads the slot and how much
-- write-ahead log it holds.
SELECT current_setting('wal_level')::text AS wal_level,
    EXISTS (SELECT 1 FROM pg_catalog.pg_publication p WHERE p.pubname = @publication::text) AS publication_exists,
    (s.slot_name IS NOT NULL)::boolean AS slot_exists,
    coalesce(s.active, false)::boolean AS active,
    coalesce(s.active_pid, 0)::integer AS active_pid,
    coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn), 0)::bigint AS lag_bytes,
    coalesce(s.confirmed_flush_lsn::text, '0/0')::text AS confirmed_lsn
FROM (SELECT 1) AS one
LEFT JOIN pg_catalog.pg_replication_slots s ON s.slot_name = @slot::text;

-- name: OutboxLogCreateSlot :exec
-- Creates log mode's logical replication slot (pgoutput).
SELECT pg_create_logical_replication_slot(@slot::text, 'pgoutput');

-- name: OutboxLogDropSlot :exec
-- Drops log mode's replication slot.
SELECT pg_drop_replication_slot(@slot::text);
