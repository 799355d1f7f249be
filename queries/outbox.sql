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
-- Settles the relay's previous batch and claims its next one, in one
-- statement: the rows @published were confirmed by the broker (deleted, or
-- marked published when @keep_published), the rows @failed were not (they
-- become claimable again after @retry_after_seconds), the rows @dead are
-- given up on (set aside with their @dead_reason, see sagabox_outbox_dead_v);
-- then up to @max unpublished rows are leased for @lease_seconds.
--
-- A row is claimed only when every earlier unpublished row of its ordering key
-- is claimed in the same batch: two relays never publish one key's rows out of
-- order, and a key whose first row another relay holds (or a concurrent claim
-- has just locked) waits for it. The cost is bounded by the batch whatever the
-- planner's statistics: the candidates are the first @max unleased rows in id
-- order (the partial index on unpublished rows, SKIP LOCKED); each looks up
-- the unpublished row before it in its key with one probe of the
-- (ordering_key, id) index (a range on the key: see linked); and the claimable ones are those whose chain of
-- such rows runs back, within the candidates, to the first row of the key.
-- Nothing joins the backlog.
WITH RECURSIVE deleted AS (
    DELETE FROM /* TEMPLATE: schema */sagabox_outbox
    WHERE id = ANY(@published::bigint[]) AND NOT @keep_published::boolean
), marked AS (
    UPDATE /* TEMPLATE: schema */sagabox_outbox
    SET published_at = now(), claimed_until = NULL, last_error = ''
    WHERE id = ANY(@published::bigint[]) AND @keep_published::boolean AND published_at IS NULL
), released AS (
    UPDATE /* TEMPLATE: schema */sagabox_outbox
    SET claimed_until = now() + make_interval(secs => @retry_after_seconds::float8),
        last_error = @last_error::text
    WHERE id = ANY(@failed::bigint[]) AND published_at IS NULL
), buried AS (
    UPDATE /* TEMPLATE: schema */sagabox_outbox o
    SET published_at = now(), dead_at = now(), claimed_until = NULL, last_error = d.reason
    FROM (SELECT unnest(@dead::bigint[]) AS id, unnest(@dead_reason::text[]) AS reason) AS d
    WHERE o.id = d.id AND o.published_at IS NULL
), candidates AS (
    SELECT o.id, o.ordering_key
    FROM /* TEMPLATE: schema */sagabox_outbox o
    WHERE o.published_at IS NULL
      AND (o.claimed_until IS NULL OR o.claimed_until < now())
      AND o.id <> ALL(@published::bigint[])
      AND o.id <> ALL(@failed::bigint[])
      AND o.id <> ALL(@dead::bigint[])
    ORDER BY o.id
    LIMIT @max::integer
    FOR UPDATE SKIP LOCKED
), linked AS (
    -- The key's previous unpublished row comes from a backward probe of the
    -- (ordering_key, id) index. The key is bounded by a range, not an
    -- equality, so that the order asked for cannot be served by the id
    -- index instead (a scan of every unpublished row below the candidate,
    -- filtered by key): the claim runs on a generic plan, built once per
    -- connection whatever the backlog was then.
    SELECT c.id, (
        SELECT p.id
        FROM /* TEMPLATE: schema */sagabox_outbox p
        WHERE p.ordering_key >= c.ordering_key AND p.ordering_key <= c.ordering_key
          AND p.id < c.id
          AND p.published_at IS NULL
          AND p.id <> ALL(@published::bigint[])
          AND p.id <> ALL(@dead::bigint[])
        ORDER BY p.ordering_key DESC, p.id DESC
        LIMIT 1
    ) AS prev_id
    FROM candidates c
), claimable (id) AS (
    SELECT linked.id FROM linked WHERE linked.prev_id IS NULL
    UNION ALL
    SELECT linked.id FROM linked JOIN claimable ON linked.prev_id = claimable.id
)
UPDATE /* TEMPLATE: schema */sagabox_outbox o
SET claimed_until = now() + make_interval(secs => @lease_seconds::float8),
    claimed_by = @claimed_by::text,
    publish_attempts = o.publish_attempts + 1
WHERE o.id = ANY(ARRAY(SELECT claimable.id FROM claimable))
RETURNING o.*;

-- name: OutboxNotify :exec
-- Wakes relays in other processes that LISTEN on @channel, when the
-- transaction commits. Sent only when a client opts in: NOTIFY serialises
-- commits.
SELECT pg_notify(@channel::text, '');

-- name: OutboxDeadList :many
-- Lists up to @max rows the relay gave up on, most recent first, after row
-- @after_id, dead at @after_dead_at (keyset paging; the first page passes a
-- position after every row, so that one predicate reads the dead_at index
-- under a generic plan too).
SELECT * FROM /* TEMPLATE: schema */sagabox_outbox
WHERE dead_at IS NOT NULL
  AND (dead_at, id) < (@after_dead_at::timestamptz, @after_id::bigint)
ORDER BY dead_at DESC, id DESC
LIMIT @max::integer;

-- name: OutboxDeadRetry :execrows
-- Makes dead rows @ids unpublished again, with their attempts reset, for
-- the relay to publish anew (once whatever made them unroutable is fixed).
UPDATE /* TEMPLATE: schema */sagabox_outbox
SET published_at = NULL, dead_at = NULL, claimed_until = NULL, publish_attempts = 0,
    last_error = 'retried by an operator after: ' || last_error
WHERE id = ANY(@ids::bigint[]) AND dead_at IS NOT NULL;

-- name: OutboxDeadDelete :execrows
-- Deletes dead rows @ids.
DELETE FROM /* TEMPLATE: schema */sagabox_outbox
WHERE id = ANY(@ids::bigint[]) AND dead_at IS NOT NULL;

-- name: OutboxWithdraw :execrows
-- Deletes the commands and compensations of sagas @saga_ids that no relay
-- has published yet: a terminated saga sends nothing more. A saga's
-- messages have its id (as text) as their ordering key: the lookup reads the
-- index of unpublished rows by key. A row a relay is publishing at this
-- moment may still go out; its settle finds no row.
DELETE FROM /* TEMPLATE: schema */sagabox_outbox
WHERE ordering_key = ANY(CAST(@saga_ids::uuid[] AS text[]))
  AND saga_id = ANY(@saga_ids::uuid[])
  AND published_at IS NULL AND dead_at IS NULL
  AND kind IN ('command', 'compensation');

-- name: OutboxWithdrawMessages :execrows
-- Deletes the commands and compensations @message_ids of sagas @saga_ids
-- that no relay has published yet: the saga gave up on them (a
-- schedule-to-start timeout). A row a relay is publishing at this moment
-- may still go out; its settle finds no row.
DELETE FROM /* TEMPLATE: schema */sagabox_outbox
WHERE ordering_key = ANY(CAST(@saga_ids::uuid[] AS text[]))
  AND message_id = ANY(@message_ids::uuid[])
  AND published_at IS NULL AND dead_at IS NULL
  AND kind IN ('command', 'compensation');

-- name: OutboxUnpublishedByType :many
-- The commands and compensations waiting in the outbox, unpublished, by
-- type, most first (up to @max types): how many, since when, the most
-- publish attempts one had and the last error a relay recorded for the
-- newest that has one. A type no queue takes shows here, retried for ever.
SELECT o.type, o.kind,
       count(*)::bigint AS count,
       min(o.created_at)::timestamptz AS oldest,
       max(o.publish_attempts)::integer AS attempts,
       coalesce((array_agg(o.last_error ORDER BY o.id DESC) FILTER (WHERE o.last_error <> ''))[1], '')::text AS last_error
FROM /* TEMPLATE: schema */sagabox_outbox o
WHERE o.published_at IS NULL AND o.kind IN ('command', 'compensation')
GROUP BY o.type, o.kind
ORDER BY count(*) DESC, o.type, o.kind
LIMIT @max::integer;

-- name: OutboxPresent :many
-- Returns which of the rows @ids are still in the outbox: a row a relay in
-- log mode keeps retrying is dropped from its retries once it is gone
-- (withdrawn with its terminated saga, or deleted by an operator).
SELECT id FROM /* TEMPLATE: schema */sagabox_outbox
WHERE id = ANY(@ids::bigint[]);
