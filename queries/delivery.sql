-- The participant's deliveries. Each is one transaction of two round trips:
-- a Begin statement sent with BEGIN (and the handler's savepoint), the
-- handler's own statements, and a Finish statement sent with COMMIT.

-- name: InboxRecord :one
-- Records a message in the inbox: how a plain event's delivery begins, and how
-- a delivery given up on is recorded. fresh is false for a message processed
-- before, which counts itself as a duplicate instead; an entry left 'started'
-- (an outside call given up on) is fresh, and marked 'done'. A concurrent
-- delivery of the same message waits here for the first one's transaction to
-- end.
INSERT INTO /* TEMPLATE: schema */sagabox_inbox AS i (message_id, kind, type, saga_id, step)
VALUES (
    @message_id::uuid, @kind::text, @type::text,
    nullif(@saga_id::uuid, '00000000-0000-0000-0000-000000000000'::uuid), @step::text
)
ON CONFLICT (message_id) DO UPDATE
SET duplicates = i.duplicates + 1, last_duplicate_at = now()
RETURNING (xmax = 0)::boolean AS fresh;

-- name: DeliveryBeginAction :one
-- Begins the delivery of a step's action: records the message in the inbox
-- (as InboxRecord) and, for a message seen for the first time, leaves
-- the action's barrier mark of (saga, step). marked is false when an earlier
-- message of the step left the mark (a re-send after a timeout, or the mark a
-- compensation left first); outcome and reply are then that mark's. A
-- concurrent action or compensation of the same step waits here for the
-- other's transaction to end, then sees its mark.
-- With @started (a handler that calls an outside system) the inbox entry is
-- left 'started' and the mark 'started': both are committed before the call.
-- A message whose entry is still 'started' is no duplicate but resumed: it
-- counts an attempt, and its mark is its own.
WITH inbox AS (
    INSERT INTO /* TEMPLATE: schema */sagabox_inbox AS i (message_id, kind, type, saga_id, step, state)
    VALUES (@message_id::uuid, 'command', @type::text, @saga_id::uuid, @step::text,
            CASE WHEN @started::boolean THEN 'started' ELSE 'done' END)
    ON CONFLICT (message_id) DO UPDATE
    SET duplicates = i.duplicates + CASE WHEN i.state = 'started' THEN 0 ELSE 1 END,
        last_duplicate_at = CASE WHEN i.state = 'started' THEN i.last_duplicate_at ELSE now() END,
        attempt = i.attempt + CASE WHEN i.state = 'started' THEN 1 ELSE 0 END
    RETURNING (xmax = 0) AS fresh, i.state, i.attempt
), mark AS (
    INSERT INTO /* TEMPLATE: schema */sagabox_barrier AS b (saga_id, step, phase, message_id, outcome)
    SELECT @saga_id::uuid, @step::text, 'action', @message_id::uuid,
           CASE WHEN @started::boolean THEN 'started' ELSE 'applied' END
    FROM inbox WHERE inbox.fresh
    ON CONFLICT (saga_id, step, phase) DO UPDATE SET outcome = b.outcome
    RETURNING (xmax = 0) AS inserted, b.outcome, b.reply_kind, b.reply_payload
)
SELECT inbox.fresh::boolean AS fresh,
       (NOT inbox.fresh AND inbox.state = 'started')::boolean AS resumed,
       inbox.attempt::integer AS inbox_attempt,
       coalesce(mark.inserted, false)::boolean AS marked,
       coalesce(mark.outcome, '')::text AS outcome,
       coalesce(mark.reply_kind, '')::text AS reply_kind,
       mark.reply_payload
FROM inbox LEFT JOIN mark ON true;

-- name: DeliveryBeginCompensation :one
-- Begins the delivery of a step's compensation: records the message in the
-- inbox and, for a message seen for the first time, leaves the compensation's
-- barrier mark (marked false: an earlier compensation of the step left it;
-- outcome and reply are then its). A new mark also leaves the action's mark
-- "blocked" with @blocked_reply unless the action left its own:
-- action_blocked says the action never ran here (it will not be applied
-- should it arrive), action_outcome is the action's outcome otherwise.
WITH inbox AS (
    INSERT INTO /* TEMPLATE: schema */sagabox_inbox AS i (message_id, kind, type, saga_id, step, state)
    VALUES (@message_id::uuid, 'compensation', @type::text, @saga_id::uuid, @step::text,
            CASE WHEN @started::boolean THEN 'started' ELSE 'done' END)
    ON CONFLICT (message_id) DO UPDATE
    SET duplicates = i.duplicates + CASE WHEN i.state = 'started' THEN 0 ELSE 1 END,
        last_duplicate_at = CASE WHEN i.state = 'started' THEN i.last_duplicate_at ELSE now() END,
        attempt = i.attempt + CASE WHEN i.state = 'started' THEN 1 ELSE 0 END
    RETURNING (xmax = 0) AS fresh, i.state, i.attempt
), mark AS (
    INSERT INTO /* TEMPLATE: schema */sagabox_barrier AS b (saga_id, step, phase, message_id, outcome, reply_kind, reply_payload)
    SELECT @saga_id::uuid, @step::text, 'compensation', @message_id::uuid,
           CASE WHEN @started::boolean THEN 'started' ELSE 'applied' END, 'reply-success', '{}'::bytea
    FROM inbox WHERE inbox.fresh
    ON CONFLICT (saga_id, step, phase) DO UPDATE SET outcome = b.outcome
    RETURNING (xmax = 0) AS inserted, b.outcome, b.reply_kind, b.reply_payload
), action AS (
    INSERT INTO /* TEMPLATE: schema */sagabox_barrier AS b (saga_id, step, phase, message_id, outcome, reply_kind, reply_payload)
    SELECT @saga_id::uuid, @step::text, 'action', @message_id::uuid, 'blocked', 'reply-failure', @blocked_reply::bytea
    FROM mark WHERE mark.inserted
    ON CONFLICT (saga_id, step, phase) DO UPDATE SET outcome = b.outcome
    RETURNING (xmax = 0) AS inserted, b.outcome
)
SELECT inbox.fresh::boolean AS fresh,
       (NOT inbox.fresh AND inbox.state = 'started')::boolean AS resumed,
       inbox.attempt::integer AS inbox_attempt,
       coalesce(mark.inserted, false)::boolean AS marked,
       coalesce(mark.outcome, '')::text AS outcome,
       coalesce(mark.reply_kind, '')::text AS reply_kind,
       mark.reply_payload,
       coalesce(action.inserted, false)::boolean AS action_blocked,
       coalesce(action.outcome, '')::text AS action_outcome
FROM inbox LEFT JOIN mark ON true LEFT JOIN action ON true;

-- name: DeliveryFinish :one
-- Finishes a delivery: sets the outcome and reply of the barrier mark it left
-- (when @set_mark), marks the inbox entry of @inbox_message_id 'done' (when
-- @settle_inbox: a delivery that began 'started' and ends in the same
-- transaction) and writes its reply to the outbox (an empty @message_id
-- array writes none). Sent with COMMIT.
--
-- With @lease_seconds above zero the reply is written under the relay's
-- write-time lease, as SagaWrite writes a saga's commands (see there):
-- leased_ids and leased_message_ids name the rows leased.
WITH mark AS (
    UPDATE /* TEMPLATE: schema */sagabox_barrier
    SET outcome = @outcome::text, reply_kind = @reply_kind::text, reply_payload = @reply_payload::bytea
    WHERE @set_mark::boolean AND saga_id = @saga_id::uuid AND step = @step::text AND phase = @phase::text
), done AS (
    UPDATE /* TEMPLATE: schema */sagabox_inbox
    SET state = 'done'
    WHERE @settle_inbox::boolean AND message_id = @inbox_message_id::uuid AND state = 'started'
), message AS (
    SELECT unnest(@message_id::uuid[]) AS message_id,
           unnest(@ordering_key::text[]) AS ordering_key,
           unnest(@kind::text[]) AS kind,
           unnest(@type::text[]) AS type,
           unnest(@routing_key::text[]) AS routing_key,
           nullif(unnest(@reply_saga_id::uuid[]), '00000000-0000-0000-0000-000000000000'::uuid) AS saga_id,
           unnest(@saga_type::text[]) AS saga_type,
           unnest(@reply_step::text[]) AS step,
           unnest(@step_index::integer[]) AS step_index,
           unnest(@attempt::integer[]) AS attempt,
           unnest(@reply_to::text[]) AS reply_to,
           unnest(@correlation_id::text[]) AS correlation_id,
           unnest(@traceparent::text[]) AS traceparent,
           unnest(@tracestate::text[]) AS tracestate,
           unnest(@headers::jsonb[]) AS headers,
           unnest(@payload::bytea[]) AS payload,
           unnest(@created_at::timestamptz[]) AS created_at
), outbox AS (
    INSERT INTO /* TEMPLATE: schema */sagabox_outbox (
        message_id, ordering_key, kind, type, routing_key, saga_id, saga_type, step,
        step_index, attempt, reply_to, correlation_id, traceparent, tracestate,
        headers, payload, created_at, claimed_until, claimed_by, publish_attempts
    )
    SELECT m.message_id, m.ordering_key, m.kind, m.type, m.routing_key, m.saga_id, m.saga_type, m.step,
           m.step_index, m.attempt, m.reply_to, m.correlation_id, m.traceparent, m.tracestate,
           m.headers, m.payload, m.created_at,
           CASE WHEN l.leased THEN now() + make_interval(secs => @lease_seconds::float8) END,
           CASE WHEN l.leased THEN @claimed_by::text ELSE '' END,
           CASE WHEN l.leased THEN 1 ELSE 0 END
    -- The lease is decided per message, in array order (the order of the
    -- ids), by sagabox_outbox_leasable; none is checked without a lease.
    FROM message m CROSS JOIN LATERAL (
        SELECT @lease_seconds::float8 > 0
               AND /* TEMPLATE: schema */sagabox_outbox_leasable(m.ordering_key, @confirmed::bigint[]) AS leased
    ) AS l
    RETURNING id, message_id, claimed_until IS NOT NULL AS leased
)
SELECT coalesce((SELECT array_agg(o.id ORDER BY o.id) FROM outbox o WHERE o.leased), '{}')::bigint[] AS leased_ids,
       coalesce((SELECT array_agg(o.message_id ORDER BY o.id) FROM outbox o WHERE o.leased), '{}')::uuid[] AS leased_message_ids;

-- name: BarrierGet :one
-- The mark of (saga, step, phase), for a delivery given up on.
SELECT * FROM /* TEMPLATE: schema */sagabox_barrier
WHERE saga_id = @saga_id::uuid AND step = @step::text AND phase = @phase::text;

-- name: BarrierInsert :execrows
-- Leaves a mark of (saga, step, phase) with its final outcome and reply, for a
-- delivery given up on, or completes the 'started' mark the same message left
-- (an outside call given up on). Zero rows means another mark was there
-- already.
INSERT INTO /* TEMPLATE: schema */sagabox_barrier AS b (saga_id, step, phase, message_id, outcome, reply_kind, reply_payload)
VALUES (@saga_id::uuid, @step::text, @phase::text, @message_id::uuid, @outcome::text, @reply_kind::text, @reply_payload::bytea)
ON CONFLICT (saga_id, step, phase) DO UPDATE
SET outcome = excluded.outcome, reply_kind = excluded.reply_kind, reply_payload = excluded.reply_payload
WHERE b.outcome = 'started' AND b.message_id = excluded.message_id;

-- name: BarrierDropStarted :exec
-- Removes the 'started' mark a compensation given up on left before its
-- outside call, so that an operator's retry runs it again.
DELETE FROM /* TEMPLATE: schema */sagabox_barrier
WHERE saga_id = @saga_id::uuid AND step = @step::text AND phase = @phase::text
  AND outcome = 'started' AND message_id = @message_id::uuid;

-- name: DeliveryResume :one
-- Begins the transaction that records an outside call's result (or gives the
-- message up): marks the message's 'started' inbox entry 'done' and locks it.
-- No row means another delivery of the message recorded it first (or gave it
-- up), or none began it. A concurrent delivery of the message waits here.
UPDATE /* TEMPLATE: schema */sagabox_inbox
SET state = 'done'
WHERE message_id = @message_id::uuid AND state = 'started'
RETURNING attempt;

-- name: BarrierListBySaga :many
-- The marks saga @saga_id left at this participant (its primary key's
-- prefix), in the order they were left: what the barrier decided for each
-- step and phase, for inspection.
SELECT * FROM /* TEMPLATE: schema */sagabox_barrier
WHERE saga_id = @saga_id::uuid
ORDER BY created_at, step, phase;

-- name: InboxCountDuplicate :exec
-- Counts a duplicate of message @message_id that was found out only when it
-- came to record its outside call: another delivery of the message, in
-- flight at the same time (both saw the entry 'started'), recorded first.
UPDATE /* TEMPLATE: schema */sagabox_inbox
SET duplicates = duplicates + 1, last_duplicate_at = now()
WHERE message_id = @message_id::uuid;

-- name: DeliveryBeginMany :many
-- Begins the deliveries of a group applied in one transaction (group
-- commit), in one statement: what DeliveryBeginAction,
-- DeliveryBeginCompensation and InboxRecord do for one message, for every
-- row of the arrays (@kind is 'command', 'compensation' or 'event'). Rows
-- must not repeat a message id nor a saga step (@saga_id, @step): the
-- caller leaves such a delivery out of the group. Inbox entries are
-- inserted in message id order and the deliveries' own marks in (saga, step)
-- order, then the blocked action marks of the compensations: two groups that
-- hold an action and a compensation of the same steps crosswise can
-- deadlock, which fails one of them retryably (the engine runs it again,
-- then one delivery at a time). The result has one row per input row, in
-- @ord order.
WITH d AS (
    SELECT unnest(@ord::integer[]) AS ord,
           unnest(@message_id::uuid[]) AS message_id,
           unnest(@kind::text[]) AS kind,
           unnest(@type::text[]) AS type,
           unnest(@saga_id::uuid[]) AS saga_id,
           unnest(@step::text[]) AS step,
           unnest(@blocked_reply::bytea[]) AS blocked_reply
), inbox AS (
    INSERT INTO /* TEMPLATE: schema */sagabox_inbox AS i (message_id, kind, type, saga_id, step, state)
    SELECT d.message_id, d.kind, d.type, nullif(d.saga_id, '00000000-0000-0000-0000-000000000000'::uuid), d.step, 'done'
    FROM d ORDER BY d.message_id
    ON CONFLICT (message_id) DO UPDATE
    SET duplicates = i.duplicates + CASE WHEN i.state = 'started' THEN 0 ELSE 1 END,
        last_duplicate_at = CASE WHEN i.state = 'started' THEN i.last_duplicate_at ELSE now() END,
        attempt = i.attempt + CASE WHEN i.state = 'started' THEN 1 ELSE 0 END
    RETURNING i.message_id, (xmax = 0) AS fresh, i.state, i.attempt
), mark AS (
    INSERT INTO /* TEMPLATE: schema */sagabox_barrier AS b (saga_id, step, phase, message_id, outcome, reply_kind, reply_payload)
    SELECT d.saga_id, d.step, CASE WHEN d.kind = 'command' THEN 'action' ELSE 'compensation' END, d.message_id, 'applied',
           CASE WHEN d.kind = 'command' THEN '' ELSE 'reply-success' END,
           CASE WHEN d.kind = 'command' THEN NULL ELSE '{}'::bytea END
    FROM d JOIN inbox ON inbox.message_id = d.message_id
    WHERE inbox.fresh AND d.kind IN ('command', 'compensation')
    ORDER BY d.saga_id, d.step
    ON CONFLICT (saga_id, step, phase) DO UPDATE SET outcome = b.outcome
    RETURNING b.saga_id, b.step, (xmax = 0) AS inserted, b.outcome, b.reply_kind, b.reply_payload
), action AS (
    INSERT INTO /* TEMPLATE: schema */sagabox_barrier AS b (saga_id, step, phase, message_id, outcome, reply_kind, reply_payload)
    SELECT d.saga_id, d.step, 'action', d.message_id, 'blocked', 'reply-failure', d.blocked_reply
    FROM d JOIN mark ON mark.saga_id = d.saga_id AND mark.step = d.step
    WHERE d.kind = 'compensation' AND mark.inserted
    ORDER BY d.saga_id, d.step
    ON CONFLICT (saga_id, step, phase) DO UPDATE SET outcome = b.outcome
    RETURNING b.saga_id, b.step, (xmax = 0) AS inserted, b.outcome
)
SELECT d.ord::integer AS ord,
       inbox.fresh::boolean AS fresh,
       (NOT inbox.fresh AND inbox.state = 'started')::boolean AS resumed,
       inbox.attempt::integer AS inbox_attempt,
       coalesce(mark.inserted, false)::boolean AS marked,
       coalesce(mark.outcome, '')::text AS outcome,
       coalesce(mark.reply_kind, '')::text AS reply_kind,
       mark.reply_payload,
       coalesce(action.inserted, false)::boolean AS action_blocked,
       coalesce(action.outcome, '')::text AS action_outcome
FROM d
JOIN inbox ON inbox.message_id = d.message_id
LEFT JOIN mark ON d.kind IN ('command', 'compensation') AND mark.saga_id = d.saga_id AND mark.step = d.step
LEFT JOIN action ON d.kind = 'compensation' AND action.saga_id = d.saga_id AND action.step = d.step
ORDER BY d.ord;

-- name: DeliveryFinishMany :one
-- Finishes the deliveries of a group begun with DeliveryBeginMany, in one
-- statement sent with COMMIT: sets the outcome and reply of the barrier
-- marks they left (the @mark_ arrays), removes what the begin wrote for the
-- deliveries that failed (the @undo_ arrays: their inbox entries and the
-- marks they left, which this transaction inserted), and writes the
-- replies to the outbox, under the write-time lease as DeliveryFinish
-- does.
WITH mark AS (
    UPDATE /* TEMPLATE: schema */sagabox_barrier AS b
    SET outcome = m.outcome, reply_kind = m.reply_kind, reply_payload = m.reply_payload
    FROM (
        SELECT unnest(@mark_saga_id::uuid[]) AS saga_id,
               unnest(@mark_step::text[]) AS step,
               unnest(@mark_phase::text[]) AS phase,
               unnest(@mark_outcome::text[]) AS outcome,
               unnest(@mark_reply_kind::text[]) AS reply_kind,
               unnest(@mark_reply_payload::bytea[]) AS reply_payload
    ) AS m
    WHERE b.saga_id = m.saga_id AND b.step = m.step AND b.phase = m.phase
), undo AS (
    SELECT unnest(@undo_message_id::uuid[]) AS message_id,
           unnest(@undo_saga_id::uuid[]) AS saga_id,
           unnest(@undo_step::text[]) AS step
), undone_inbox AS (
    DELETE FROM /* TEMPLATE: schema */sagabox_inbox AS i
    USING undo WHERE i.message_id = undo.message_id
), undone_marks AS (
    DELETE FROM /* TEMPLATE: schema */sagabox_barrier AS b
    USING undo WHERE b.saga_id = undo.saga_id AND b.step = undo.step AND b.message_id = undo.message_id
), message AS (
    SELECT unnest(@message_id::uuid[]) AS message_id,
           unnest(@ordering_key::text[]) AS ordering_key,
           unnest(@kind::text[]) AS kind,
           unnest(@type::text[]) AS type,
           unnest(@routing_key::text[]) AS routing_key,
           nullif(unnest(@reply_saga_id::uuid[]), '00000000-0000-0000-0000-000000000000'::uuid) AS saga_id,
           unnest(@saga_type::text[]) AS saga_type,
           unnest(@reply_step::text[]) AS step,
           unnest(@step_index::integer[]) AS step_index,
           unnest(@attempt::integer[]) AS attempt,
           unnest(@reply_to::text[]) AS reply_to,
           unnest(@correlation_id::text[]) AS correlation_id,
           unnest(@traceparent::text[]) AS traceparent,
           unnest(@tracestate::text[]) AS tracestate,
           unnest(@headers::jsonb[]) AS headers,
           unnest(@payload::bytea[]) AS payload,
           unnest(@created_at::timestamptz[]) AS created_at
), outbox AS (
    INSERT INTO /* TEMPLATE: schema */sagabox_outbox (
        message_id, ordering_key, kind, type, routing_key, saga_id, saga_type, step,
        step_index, attempt, reply_to, correlation_id, traceparent, tracestate,
        headers, payload, created_at, claimed_until, claimed_by, publish_attempts
    )
    SELECT m.message_id, m.ordering_key, m.kind, m.type, m.routing_key, m.saga_id, m.saga_type, m.step,
           m.step_index, m.attempt, m.reply_to, m.correlation_id, m.traceparent, m.tracestate,
           m.headers, m.payload, m.created_at,
           CASE WHEN l.leased THEN now() + make_interval(secs => @lease_seconds::float8) END,
           CASE WHEN l.leased THEN @claimed_by::text ELSE '' END,
           CASE WHEN l.leased THEN 1 ELSE 0 END
    FROM message m CROSS JOIN LATERAL (
        SELECT @lease_seconds::float8 > 0
               AND /* TEMPLATE: schema */sagabox_outbox_leasable(m.ordering_key, @confirmed::bigint[]) AS leased
    ) AS l
    RETURNING id, message_id, claimed_until IS NOT NULL AS leased
)
SELECT coalesce((SELECT array_agg(o.id ORDER BY o.id) FROM outbox o WHERE o.leased), '{}')::bigint[] AS leased_ids,
       coalesce((SELECT array_agg(o.message_id ORDER BY o.id) FROM outbox o WHERE o.leased), '{}')::uuid[] AS leased_message_ids;
