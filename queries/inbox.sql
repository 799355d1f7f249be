-- name: InboxInsert :execrows
-- Records a received message in the processing transaction. Zero rows means
-- the message was recorded before: a duplicate. A concurrent delivery of the
-- same message waits here for the first one's transaction to end.
INSERT INTO /* TEMPLATE: schema */sagabox_inbox (message_id, kind, type, saga_id, step)
VALUES (
    @message_id::uuid,
    @kind::text,
    @type::text,
    nullif(@saga_id::uuid, '00000000-0000-0000-0000-000000000000'::uuid),
    @step::text
)
ON CONFLICT (message_id) DO NOTHING;

-- name: InboxCountDuplicate :one
-- Counts one more arrival of an already processed message.
UPDATE /* TEMPLATE: schema */sagabox_inbox
SET duplicates = duplicates + 1, last_duplicate_at = now()
WHERE message_id = @message_id::uuid
RETURNING duplicates;

-- name: InboxGet :one
SELECT * FROM /* TEMPLATE: schema */sagabox_inbox WHERE message_id = @message_id::uuid;

-- name: InboxStats :one
-- Totals of the inbox: messages processed, duplicate arrivals, and duplicate
-- arrivals of messages last duplicated within @recent_seconds.
SELECT
    count(*)::bigint AS total,
    coalesce(sum(duplicates), 0)::bigint AS duplicates,
    count(*) FILTER (WHERE duplicates > 0)::bigint AS duplicated_messages,
    count(*) FILTER (
        WHERE last_duplicate_at > now() - make_interval(secs => @recent_seconds::float8)
    )::bigint AS recently_duplicated
FROM /* TEMPLATE: schema */sagabox_inbox;

-- name: InboxListDuplicated :many
-- The messages that arrived more than once, most recently duplicated first.
SELECT * FROM /* TEMPLATE: schema */sagabox_inbox
WHERE duplicates > 0
ORDER BY last_duplicate_at DESC
LIMIT @max::integer;

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
-- Attempt rows, most recently updated first; only dead-lettered ones when
-- @dead_lettered_only.
SELECT * FROM /* TEMPLATE: schema */sagabox_inbox_attempt
WHERE NOT @dead_lettered_only::boolean OR dead_lettered_at IS NOT NULL
ORDER BY updated_at DESC
LIMIT @max::integer;

-- name: BarrierInsert :execrows
-- Leaves the mark of (saga, step, phase). Zero rows means a mark was there
-- already. A concurrent insert of the same key waits for the other
-- transaction, which is what serialises an action and its compensation.
INSERT INTO /* TEMPLATE: schema */sagabox_barrier (saga_id, step, phase, message_id, outcome, reply_kind, reply_payload)
VALUES (
    @saga_id::uuid,
    @step::text,
    @phase::text,
    @message_id::uuid,
    @outcome::text,
    @reply_kind::text,
    @reply_payload::bytea
)
ON CONFLICT (saga_id, step, phase) DO NOTHING;

-- name: BarrierGet :one
SELECT * FROM /* TEMPLATE: schema */sagabox_barrier
WHERE saga_id = @saga_id::uuid AND step = @step::text AND phase = @phase::text;

-- name: BarrierSetOutcome :execrows
UPDATE /* TEMPLATE: schema */sagabox_barrier
SET outcome = @outcome::text, reply_kind = @reply_kind::text, reply_payload = @reply_payload::bytea
WHERE saga_id = @saga_id::uuid AND step = @step::text AND phase = @phase::text;

-- name: BarrierListBySaga :many
SELECT * FROM /* TEMPLATE: schema */sagabox_barrier
WHERE saga_id = @saga_id::uuid
ORDER BY created_at, step, phase;
