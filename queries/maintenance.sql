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
WHERE (saga_id, step, phase) IN (
    SELECT saga_id, step, phase FROM /* TEMPLATE: schema */sagabox_barrier
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
-- Running or compensating sagas whose deadline passed before @before and
-- that the sweeper would claim (see SagaClaimDue): the sweeper is behind or
-- not running. A saga held by an unpublished message is not the sweeper's
-- to fire (SagaCountUnpublishedOverdue counts those).
SELECT count(*)::bigint FROM /* TEMPLATE: schema */sagabox_saga s
WHERE s.deadline < @before::timestamptz AND s.status IN ('running', 'compensating')
  AND (
      NOT EXISTS (
          SELECT 1 FROM /* TEMPLATE: schema */sagabox_outbox o
          WHERE o.ordering_key = s.id::text AND o.published_at IS NULL
            AND o.kind IN ('command', 'compensation')
      )
      OR EXISTS (
          SELECT 1 FROM jsonb_array_elements(s.steps) AS st
          WHERE (st->>'start_by')::timestamptz < @before::timestamptz
      )
  );

-- name: SagaCountUnpublishedOverdue :many
-- Running or compensating sagas, by type, that wait for a command or
-- compensation written before @before and still unpublished, past their
-- deadline (before @before) or without one: no deadline fires while a
-- saga's message is unpublished, so without a schedule-to-start timeout
-- they wait for the message for ever. Driven by the outbox's unpublished
-- rows, few when all is well.
SELECT s.saga_type, count(DISTINCT s.id)::bigint AS count
FROM /* TEMPLATE: schema */sagabox_outbox o
JOIN /* TEMPLATE: schema */sagabox_saga s ON s.id = o.saga_id
WHERE o.published_at IS NULL
  AND o.kind IN ('command', 'compensation')
  AND o.created_at < @before::timestamptz
  AND s.status IN ('running', 'compensating')
  AND (s.deadline IS NULL OR s.deadline < @before::timestamptz)
GROUP BY s.saga_type
ORDER BY s.saga_type;
