-- name: SetLocalTimeouts :exec
-- Bounds the statements of a background transaction so that a stuck lock or a
-- slow plan cannot hold it forever.
SELECT set_config('statement_timeout', @statement_timeout::text, true),
       set_config('lock_timeout', @lock_timeout::text, true);

-- name: InboxDeleteBefore :execrows
DELETE FROM /* TEMPLATE: schema */sagabox_inbox
WHERE message_id IN (
    SELECT message_id FROM /* TEMPLATE: schema */sagabox_inbox
    WHERE received_at < @received_before::timestamptz
    ORDER BY received_at
    LIMIT @max::integer
);

-- name: InboxAttemptDeleteBefore :execrows
DELETE FROM /* TEMPLATE: schema */sagabox_inbox_attempt
WHERE message_id IN (
    SELECT message_id FROM /* TEMPLATE: schema */sagabox_inbox_attempt
    WHERE updated_at < @updated_before::timestamptz
    ORDER BY updated_at
    LIMIT @max::integer
);

-- name: BarrierDeleteBefore :execrows
DELETE FROM /* TEMPLATE: schema */sagabox_barrier
WHERE (saga_id, step, phase) IN (
    SELECT saga_id, step, phase FROM /* TEMPLATE: schema */sagabox_barrier
    WHERE created_at < @created_before::timestamptz
    ORDER BY created_at
    LIMIT @max::integer
);

-- name: OutboxNotify :exec
-- Wakes relays in other processes that LISTEN on @channel. Sent only when a
-- writer opts in: NOTIFY serialises commits.
SELECT pg_notify(@channel::text, '');
