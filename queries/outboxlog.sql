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

-- name: OutboxLogInProgress :one
-- How many of the transactions @xids (their 32-bit ids, as a logical
-- replication stream gives them) a new snapshot does not show yet: a commit
-- is streamed once its record is flushed, before the transaction is visible
-- to other sessions (with synchronous replication, until the standby
-- confirmed it). Each id is widened to the 64-bit id nearest the
-- snapshot's xmax (the ids of streamed transactions are recent); a
-- transaction at or past xmax, or in the snapshot's list of running ones,
-- is not visible yet.
SELECT count(*)::integer AS in_progress
FROM (SELECT pg_current_snapshot() AS snap) AS s,
    LATERAL (SELECT pg_snapshot_xmax(s.snap)::text::bigint AS xmax) AS m,
    unnest(@xids::bigint[]) AS x,
    LATERAL (SELECT ((m.xmax >> 32) << 32) | x AS wide) AS w
WHERE NOT pg_visible_in_snapshot(
    greatest(CASE
        WHEN w.wide - m.xmax > 2147483648 THEN w.wide - 4294967296
        WHEN m.xmax - w.wide > 2147483648 THEN w.wide + 4294967296
        ELSE w.wide END, 0)::text::xid8,
    s.snap);

-- name: OutboxLogSlotCreated :exec
-- Records that the slot was (re)created now: the outbox rows written
-- before it, up to the last one now, are owed from the table.
INSERT INTO /* TEMPLATE: schema */sagabox_outbox_log (slot, catch_up_through)
VALUES (@slot::text, coalesce((SELECT max(id) FROM /* TEMPLATE: schema */sagabox_outbox), 0))
ON CONFLICT (slot) DO UPDATE
SET created_at = now(), catch_up_through = EXCLUDED.catch_up_through, caught_up_at = NULL;

-- name: OutboxLogOwed :one
-- How many rows written before the slot was created are still unpublished;
-- when none is (or none was owed), the slot is marked caught up.
WITH owed AS (
    SELECT count(o.id)::bigint AS n
    FROM /* TEMPLATE: schema */sagabox_outbox_log l
    JOIN /* TEMPLATE: schema */sagabox_outbox o ON o.id <= l.catch_up_through AND o.published_at IS NULL
    WHERE l.slot = @slot::text AND l.caught_up_at IS NULL
), done AS (
    UPDATE /* TEMPLATE: schema */sagabox_outbox_log
    SET caught_up_at = now()
    WHERE slot = @slot::text AND caught_up_at IS NULL AND (SELECT n FROM owed) = 0
)
SELECT n FROM owed;
