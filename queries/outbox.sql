-- name: OutboxInsert :exec
-- Inserts messages in the caller's transaction, in array order (which
-- becomes the publish order of rows sharing an ordering key).
INSERT INTO /* TEMPLATE: schema */sagabox_outbox (
    message_id, ordering_key, kind, type, routing_key, saga_id, saga_type, step,
    step_index, attempt, reply_to, correlation_id, traceparent, tracestate,
    headers, payload, created_at
)
SELECT
    unnest(@message_id::uuid[]),
    unnest(@ordering_key::text[]),
    unnest(@kind::text[]),
    unnest(@type::text[]),
    unnest(@routing_key::text[]),
    nullif(unnest(@saga_id::uuid[]), '00000000-0000-0000-0000-000000000000'::uuid),
    unnest(@saga_type::text[]),
    unnest(@step::text[]),
    unnest(@step_index::integer[]),
    unnest(@attempt::integer[]),
    unnest(@reply_to::text[]),
    unnest(@correlation_id::text[]),
    unnest(@traceparent::text[]),
    unnest(@tracestate::text[]),
    unnest(@headers::jsonb[]),
    unnest(@payload::bytea[]),
    unnest(@created_at::timestamptz[]);

-- name: OutboxClaim :many
-- Claims up to @max unpublished rows for @lease_seconds. A row is claimed only
-- when every earlier unpublished row of its ordering key is claimed in the same
-- batch, so that two relays never publish one key's rows out of order. Rows
-- locked by a concurrent claim are skipped, never waited for.
WITH locked AS (
    SELECT o.id, o.ordering_key
    FROM /* TEMPLATE: schema */sagabox_outbox o
    WHERE o.published_at IS NULL
      AND (o.claimed_until IS NULL OR o.claimed_until < now())
    ORDER BY o.id
    LIMIT @max::integer
    FOR UPDATE SKIP LOCKED
), claimable AS (
    SELECT l.id
    FROM locked l
    WHERE NOT EXISTS (
        SELECT 1
        FROM /* TEMPLATE: schema */sagabox_outbox p
        WHERE p.ordering_key = l.ordering_key
          AND p.id < l.id
          AND p.published_at IS NULL
          AND NOT EXISTS (SELECT 1 FROM locked l2 WHERE l2.id = p.id)
    )
)
UPDATE /* TEMPLATE: schema */sagabox_outbox o
SET claimed_until = now() + make_interval(secs => @lease_seconds::float8),
    claimed_by = @claimed_by::text,
    publish_attempts = o.publish_attempts + 1
FROM claimable c
WHERE o.id = c.id
RETURNING o.*;

-- name: OutboxDone :exec
-- Records the outcome of a published batch in one statement: the rows
-- @published were confirmed by the broker; the rows @failed were not and
-- become claimable again after @retry_after_seconds.
WITH published AS (
    UPDATE /* TEMPLATE: schema */sagabox_outbox
    SET published_at = now(), claimed_until = NULL, last_error = ''
    WHERE id = ANY(@published::bigint[]) AND published_at IS NULL
)
UPDATE /* TEMPLATE: schema */sagabox_outbox
SET claimed_until = now() + make_interval(secs => @retry_after_seconds::float8),
    last_error = @last_error::text
WHERE id = ANY(@failed::bigint[]) AND published_at IS NULL;

-- name: OutboxNotify :exec
-- Wakes relays in other processes that LISTEN on @channel, when the
-- transaction commits. Sent only when a client opts in: NOTIFY serialises
-- commits.
SELECT pg_notify(@channel::text, '');
