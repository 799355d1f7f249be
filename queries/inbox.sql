-- name: InboxAttemptRecord :one
-- Counts a failed processing attempt. It runs in a transaction of its own:
-- the processing transaction was rolled back.
INSERT INTO /* TEMPLATE: schema */sagabox_inbox_attempt AS a (message_id, kind, type, saga_id, attempts, last_error)
VALUES (
    @message_id::uuid,
    @kind::text,
    @type::text,
    nullif(@saga_id::uuid, '00000000-0000-0000-0000-000000000000'::uuid),
    1,
    @last_error::text
)
ON CONFLICT (message_id) DO UPDATE
SET attempts = a.attempts + 1,
    last_error = excluded.last_error,
    updated_at = now()
RETURNING attempts;

-- name: InboxAttemptMarkDeadLettered :exec
-- Records that a message was dead-lettered, with the reason.
INSERT INTO /* TEMPLATE: schema */sagabox_inbox_attempt (message_id, kind, type, saga_id, attempts, last_error, dead_lettered_at)
VALUES (
    @message_id::uuid,
    @kind::text,
    @type::text,
    nullif(@saga_id::uuid, '00000000-0000-0000-0000-000000000000'::uuid),
    0,
    @reason::text,
    now()
)
ON CONFLICT (message_id) DO UPDATE
SET last_error = excluded.last_error,
    dead_lettered_at = now(),
    updated_at = now();

-- name: InboxAttemptGet :one
SELECT * FROM /* TEMPLATE: schema */sagabox_inbox_attempt WHERE message_id = @message_id::uuid;

-- name: InboxAttemptList :many
-- Attempt rows, most recently updated first, after the row of message
-- @after_message_id, updated at @after_updated_at (keyset paging; the first
-- page passes a position after every row); only dead-lettered ones when
-- @dead_lettered_only.
SELECT * FROM /* TEMPLATE: schema */sagabox_inbox_attempt
WHERE (NOT @dead_lettered_only::boolean OR dead_lettered_at IS NOT NULL)
  AND (updated_at, message_id) < (@after_updated_at::timestamptz, @after_message_id::uuid)
ORDER BY updated_at DESC, message_id DESC
LIMIT @max::integer;
