-- Retention and statistics: background queries, each bounded by the
-- statement and lock timeouts sent ahead of it.

-- name: OutboxDeletePublished :execrows
-- Deletes at most @max rows published before @published_before.
DELETE FROM /* TEMPLATE: schema */sagabox_outbox
WHERE id IN (
    SELECT id FROM /* TEMPLATE: schema */sagabox_outbox
    WHERE published_at < @published_before::timestamptz
    ORDER BY published_at
    LIMIT @max::integer
);

-- name: InboxDeleteBefore :execrows
DELETE FROM /* TEMPLATE: schema */sagabox_inbox
WHERE message_id IN (
    SELECT message_id FROM /* TEMPLATE: schema */sagabox_inbox
    WHERE received_at < @received_before::timestamptz AND state = 'done'
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
WHERE (saga_id, run, step, phase) IN (
    SELECT saga_id, run, step, phase FROM /* TEMPLATE: schema */sagabox_barrier
    WHERE created_at < @created_before::timestamptz
    ORDER BY created_at
    LIMIT @max::integer
);

-- name: SagaDeleteFinishedBefore :execrows
-- Deletes at most @max finished sagas, with their history, that finished
-- before @finished_before.
WITH doomed AS (
    SELECT id FROM /* TEMPLATE: schema */sagabox_saga
    WHERE finished_at < @finished_before::timestamptz
    ORDER BY finished_at
    LIMIT @max::integer
), history AS (
    DELETE FROM /* TEMPLATE: schema */sagabox_saga_history
    WHERE saga_id IN (SELECT id FROM doomed)
)
DELETE FROM /* TEMPLATE: schema */sagabox_saga
WHERE id IN (SELECT id FROM doomed);

-- name: OutboxStats :one
-- Backlog of unpublished rows and the age of the oldest one, and the rows
-- given up on.
SELECT
    count(*)::bigint AS backlog,
    coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 AS oldest_age_seconds,
    count(*) FILTER (WHERE publish_attempts > 1)::bigint AS retrying,
    (SELECT count(*) FROM /* TEMPLATE: schema */sagabox_outbox d WHERE d.dead_at IS NOT NULL)::bigint AS dead
FROM /* TEMPLATE: schema */sagabox_outbox
WHERE published_at IS NULL;

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

-- name: SagaCountByStatus :many
SELECT saga_type, status, count(*)::bigint AS count
FROM /* TEMPLATE: schema */sagabox_saga
GROUP BY saga_type, status
ORDER BY saga_type, status;

-- name: SagaCountOpen :many
-- The running, compensating and failed sagas of the given types, by type
-- and status: ranges of the (saga_type, status, created_at, id) index that
-- hold only sagas not finished, however many finished ones the table keeps.
SELECT saga_type, status, count(*)::bigint AS count
FROM /* TEMPLATE: schema */sagabox_saga
WHERE saga_type = ANY(@saga_types::text[]) AND status IN ('running', 'compensating', 'failed')
GROUP BY saga_type, status;

-- name: SagaCountOverdue :one
-- Running or compensating sagas whose deadline passed before @before: the
-- sweeper is behind or not running.
SELECT count(*)::bigint FROM /* TEMPLATE: schema */sagabox_saga
WHERE deadline < @before::timestamptz AND status IN ('running', 'compensating');
