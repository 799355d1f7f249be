-- The orchestrator's transactions. A start is one statement in the caller's
-- transaction; a reply, a sweep and an operator action each read (and lock)
-- their sagas in one statement sent with BEGIN, and write every transition
-- in one statement sent with COMMIT.

-- name: SagaStart :one
-- Starts a saga in the caller's transaction: its row, its history and its
-- first messages. With a start key that a saga of the same type already has,
-- nothing at all is written and inserted is false (a concurrent start with
-- the same key waits here for the other transaction to end).
WITH saga AS (
    INSERT INTO /* TEMPLATE: schema */sagabox_saga (
        id, saga_type, version, status, start_key, data, steps, current_step, phase,
        deadline, attempts, last_error, created_at, updated_at, finished_at, traceparent, tracestate,
        concurrency_key, admitted_at, start_data_hash
    ) VALUES (
        @id::uuid, @saga_type::text, @version::integer, @status::text, sqlc.narg('start_key')::text,
        @data::jsonb, @steps::jsonb, @current_step::integer, @phase::text,
        sqlc.narg('deadline')::timestamptz, @attempts::integer, @last_error::text,
        @now::timestamptz, @now::timestamptz, sqlc.narg('finished_at')::timestamptz,
        @traceparent::text, @tracestate::text,
        sqlc.narg('concurrency_key')::text,
        CASE WHEN @status::text = 'queued' THEN NULL ELSE @now::timestamptz END,
        sqlc.narg('start_data_hash')::bytea
    )
    ON CONFLICT (saga_type, start_key) WHERE start_key IS NOT NULL AND NOT start_key_released DO NOTHING
    RETURNING id
), history AS (
    INSERT INTO /* TEMPLATE: schema */sagabox_saga_history (
        saga_id, at, event, step, step_index, phase, attempt, detail, actor, message_id
    )
    SELECT saga.id,
           unnest(@h_at::timestamptz[]),
           unnest(@h_event::text[]),
           unnest(@h_step::text[]),
           unnest(@h_step_index::integer[]),
           unnest(@h_phase::text[]),
           unnest(@h_attempt::integer[]),
           unnest(@h_detail::text[]),
           unnest(@h_actor::text[]),
           nullif(unnest(@h_message_id::uuid[]), '00000000-0000-0000-0000-000000000000'::uuid)
    FROM saga
), outbox AS (
    INSERT INTO /* TEMPLATE: schema */sagabox_outbox (
        message_id, ordering_key, kind, type, routing_key, saga_id, saga_type, step,
        step_index, attempt, reply_to, correlation_id, traceparent, tracestate,
        headers, payload, created_at
    )
    SELECT unnest(@o_message_id::uuid[]),
           unnest(@o_ordering_key::text[]),
           unnest(@o_kind::text[]),
           unnest(@o_type::text[]),
           unnest(@o_routing_key::text[]),
           saga.id,
           unnest(@o_saga_type::text[]),
           unnest(@o_step::text[]),
           unnest(@o_step_index::integer[]),
           unnest(@o_attempt::integer[]),
           unnest(@o_reply_to::text[]),
           unnest(@o_correlation_id::text[]),
           unnest(@o_traceparent::text[]),
           unnest(@o_tracestate::text[]),
           unnest(@o_headers::jsonb[]),
           unnest(@o_payload::bytea[]),
           unnest(@o_created_at::timestamptz[])
    FROM saga
)
SELECT (count(*) > 0)::boolean AS inserted FROM saga;

-- name: SagaReceive :many
-- Receives replies: records each in the inbox (a duplicate counts itself
-- instead) and locks, in id order, the sagas of those seen for the first
-- time. One row per message; the saga columns are null for a duplicate and
-- for a saga that does not exist here.
WITH inbox AS (
    INSERT INTO /* TEMPLATE: schema */sagabox_inbox AS i (message_id, kind, type, saga_id, step)
    SELECT unnest(@message_id::uuid[]), unnest(@kind::text[]), unnest(@type::text[]),
           unnest(@saga_id::uuid[]), unnest(@step::text[])
    ON CONFLICT (message_id) DO UPDATE
    SET duplicates = i.duplicates + 1, last_duplicate_at = now()
    RETURNING i.message_id, i.saga_id, (xmax = 0) AS fresh
), locked AS (
    -- One primary-key lookup per saga, in id order, whatever the planner
    -- believes of the table's size: a join could scan the whole table when
    -- its statistics are missing or stale (a fresh deployment, a burst).
    SELECT l.*
    FROM (SELECT DISTINCT inbox.saga_id FROM inbox WHERE inbox.fresh ORDER BY inbox.saga_id) AS k,
         LATERAL (
             SELECT s.* FROM /* TEMPLATE: schema */sagabox_saga s WHERE s.id = k.saga_id FOR UPDATE
         ) AS l
)
SELECT inbox.message_id, inbox.fresh::boolean AS fresh, locked.*
FROM inbox LEFT JOIN locked ON locked.id = inbox.saga_id AND inbox.fresh;

-- name: SagaReceiveKnown :exec
-- Receives replies to sagas whose state the orchestrator kept from its own
-- last write of them (its saga cache): records each in the inbox, and fails
-- the transaction with a serialization failure if the inbox had any (a
-- duplicate, or a concurrent delivery of the same message that committed
-- first), for it to be run again the ordinary way (SagaReceive), which
-- counts the duplicate. The sagas are neither read nor locked here: the
-- transition written in the same transaction (SagaWrite) checks each one's
-- revision, and fails the same way if a saga moved on meanwhile.
WITH inbox AS (
    INSERT INTO /* TEMPLATE: schema */sagabox_inbox (message_id, kind, type, saga_id, step)
    SELECT unnest(@message_id::uuid[]), unnest(@kind::text[]), unnest(@type::text[]),
           unnest(@saga_id::uuid[]), unnest(@step::text[])
    ON CONFLICT (message_id) DO NOTHING
    RETURNING message_id
)
SELECT /* TEMPLATE: schema */sagabox_check(
    (SELECT count(*) FROM inbox) = cardinality(@message_id::uuid[]),
    '40001',
    'sagabox: a reply was received before; the transaction is run again'
)::boolean AS ok;

-- name: SagaLock :many
-- Locks the sagas @ids, in id order, so that their events are applied one at
-- a time. One primary-key lookup per saga, as in SagaReceive: a generic plan
-- of id = ANY(@ids), built while the table had no statistics, scans the
-- whole table, and a connection keeps it.
SELECT l.*
FROM (SELECT DISTINCT k.id FROM unnest(@ids::uuid[]) AS k(id) ORDER BY k.id) AS k,
     LATERAL (
         SELECT s.* FROM /* TEMPLATE: schema */sagabox_saga s WHERE s.id = k.id FOR UPDATE
     ) AS l
ORDER BY l.id;

-- name: SagaClaimDue :many
-- Locks up to @max running or compensating sagas whose deadline is at or
-- before @now, skipping sagas another orchestrator (or reply) holds. Only
-- sagas of the definitions (type, version pairs) the caller runs are
-- claimed: an orchestrator never starves on sagas it cannot run. A saga
-- whose command or compensation is still in the outbox, unpublished, is
-- not due: the time a command waits for the relay or the broker is not the
-- participant's (its deadline is pushed back once it is published, see
-- SagaShiftDeadlines), and a re-send would only queue behind it; unless a
-- step's schedule-to-start timeout has passed (its "start_by" in the
-- steps' state, saga.StepState.StartBy): the saga is due then, and its
-- timer finds out whether that step's command is still unpublished.
SELECT s.* FROM /* TEMPLATE: schema */sagabox_saga s
WHERE s.deadline <= @now::timestamptz
  AND s.deadline IS NOT NULL
  AND s.status IN ('running', 'compensating')
  AND (s.saga_type, s.version) IN (
      SELECT unnest(@saga_types::text[]), unnest(@versions::integer[])
  )
  AND (
      NOT EXISTS (
          SELECT 1 FROM /* TEMPLATE: schema */sagabox_outbox o
          WHERE o.ordering_key = s.id::text AND o.published_at IS NULL
            AND o.kind IN ('command', 'compensation')
      )
      OR EXISTS (
          SELECT 1 FROM jsonb_array_elements(s.steps) AS st
          WHERE (st->>'start_by')::timestamptz <= @now::timestamptz
      )
  )
ORDER BY s.deadline
LIMIT @max::integer
FOR UPDATE OF s SKIP LOCKED;

-- name: SagaAdmission :one
-- What a start of a saga of @saga_type needs to know to run at once or be
-- queued: whether sagas wait for admission that are not waiting for a
-- concurrency key of their own (a new start queues behind them), how many
-- sagas of the type are running or compensating (counted up to
-- @max_running; not counted, 0, when sagas are queued unless
-- @count_when_queued: a start queues then anyway), and whether a saga of the
-- type holds or waits for @concurrency_key.
WITH q AS (
    SELECT EXISTS (
        SELECT 1 FROM /* TEMPLATE: schema */sagabox_saga
        WHERE saga_type = @saga_type::text AND status = 'queued' AND concurrency_key IS NULL
    ) AS queued
)
SELECT
    (CASE WHEN q.queued AND NOT @count_when_queued::boolean THEN 0 ELSE (
        SELECT count(*) FROM (
            SELECT 1 FROM /* TEMPLATE: schema */sagabox_saga
            WHERE saga_type = @saga_type::text AND status IN ('running', 'compensating')
            LIMIT @max_running::integer
        ) AS r
    ) END)::integer AS running,
    q.queued::boolean AS queued,
    EXISTS (
        SELECT 1 FROM /* TEMPLATE: schema */sagabox_saga
        WHERE saga_type = @saga_type::text AND concurrency_key = sqlc.narg('concurrency_key')::text
          AND status IN ('queued', 'running', 'compensating')
    ) AS key_taken
FROM q;

-- name: SagaLockConcurrencyKey :exec
-- Takes the transaction-scoped advisory lock of the concurrency key
-- @concurrency_key of @saga_type, waiting for it. A start with a key holds
-- it until the caller's transaction ends, so that the admission pass and
-- other starts decide on the key only once they can see its saga.
SELECT pg_advisory_xact_lock(hashtextextended(
    'sagabox.concurrency:' || @schema_name::text || ':' || @saga_type::text || ':' || @concurrency_key::text, 0));

-- name: SagaTryLockConcurrencyKeys :many
-- Takes, without waiting, the transaction-scoped advisory locks of the
-- concurrency keys @concurrency_key of @saga_type that nobody holds, and
-- returns those keys.
SELECT k.key::text AS concurrency_key
FROM unnest(@concurrency_key::text[]) AS k(key)
WHERE pg_try_advisory_xact_lock(hashtextextended(
    'sagabox.concurrency:' || @schema_name::text || ':' || @saga_type::text || ':' || k.key, 0));

-- name: SagaTryLockAdmission :one
-- Takes the transaction-scoped advisory lock of the admission pass of the
-- schema @schema_name, if no other orchestrator holds it: one pass at a
-- time admits, so that two never both fill the same free places.
SELECT pg_try_advisory_xact_lock(hashtextextended('sagabox.admission:' || @schema_name::text, 0))::boolean AS locked;

-- name: SagaClaimQueued :many
-- Locks up to @max queued sagas of @saga_type (of the versions @versions)
-- that may run now, in start order: those without a concurrency key, and
-- the first queued saga of each key no saga of the type is running or
-- compensating for.
SELECT s.* FROM /* TEMPLATE: schema */sagabox_saga s
WHERE s.saga_type = @saga_type::text
  AND s.status = 'queued'
  AND s.version = ANY(@versions::integer[])
  AND (s.concurrency_key IS NULL OR NOT EXISTS (
      SELECT 1 FROM /* TEMPLATE: schema */sagabox_saga o
      WHERE o.saga_type = s.saga_type AND o.concurrency_key = s.concurrency_key
        AND o.status IN ('queued', 'running', 'compensating')
        AND (o.status <> 'queued' OR (o.created_at, o.id) < (s.created_at, s.id))
  ))
ORDER BY s.created_at, s.id
LIMIT @max::integer
FOR UPDATE OF s SKIP LOCKED;

-- name: SagaKeysRunning :many
-- Returns which of the concurrency keys @concurrency_key of @saga_type a
-- saga is running or compensating for (read after their locks were taken).
SELECT DISTINCT concurrency_key::text AS concurrency_key FROM /* TEMPLATE: schema */sagabox_saga
WHERE saga_type = @saga_type::text AND concurrency_key = ANY(@concurrency_key::text[])
  AND status IN ('running', 'compensating');

-- name: SagaQueuedCounts :many
-- Counts the sagas waiting for admission, per type, with the oldest's start.
SELECT saga_type, count(*)::bigint AS queued, min(created_at)::timestamptz AS oldest
FROM /* TEMPLATE: schema */sagabox_saga
WHERE status = 'queued'
GROUP BY saga_type;

-- name: SagaWrite :one
-- Writes transitions: the new state of the sagas @id (each checked against
-- the revision it was read at: a saga changed meanwhile fails the whole
-- statement with a serialization failure, so that it is not committed and
-- the transaction is run again), their history and their outgoing messages.
-- A zero deadline or finished_at is stored as null.
--
-- With @lease_seconds above zero the messages are written claimed by the
-- relay @claimed_by (the write-time lease: that relay publishes them once
-- the transaction commits, with no claim), except those whose ordering key
-- has an earlier unpublished row that is not among @confirmed (rows that
-- relay has published and not settled yet): those stay unclaimed, for a
-- claim to take in key order. Rows of one key written by this statement
-- are leased together. leased_ids and leased_message_ids name the rows
-- leased, in id order.
WITH updated AS (
    UPDATE /* TEMPLATE: schema */sagabox_saga AS s
    SET status = u.status,
        version = u.version,
        run = u.run,
        data = u.data,
        steps = u.steps,
        current_step = u.current_step,
        phase = u.phase,
        deadline = nullif(u.deadline, '0001-01-01 00:00:00+00'::timestamptz),
        attempts = u.attempts,
        last_error = u.last_error,
        revision = s.revision + 1,
        updated_at = @now::timestamptz,
        finished_at = nullif(u.finished_at, '0001-01-01 00:00:00+00'::timestamptz),
        -- The first transition out of 'queued' admits the saga.
        admitted_at = CASE WHEN s.admitted_at IS NULL AND u.status <> 'queued' THEN @now::timestamptz
                           ELSE s.admitted_at END
    FROM (
        SELECT unnest(@id::uuid[]) AS id,
               unnest(@revision::bigint[]) AS revision,
               unnest(@status::text[]) AS status,
               unnest(@version::integer[]) AS version,
               unnest(@run::integer[]) AS run,
               unnest(@data::jsonb[]) AS data,
               unnest(@steps::jsonb[]) AS steps,
               unnest(@current_step::integer[]) AS current_step,
               unnest(@phase::text[]) AS phase,
               unnest(@deadline::timestamptz[]) AS deadline,
               unnest(@attempts::integer[]) AS attempts,
               unnest(@last_error::text[]) AS last_error,
               unnest(@finished_at::timestamptz[]) AS finished_at
    ) AS u
    -- s.id = ANY(@id) lets the planner find the rows by primary key even
    -- when it misjudges the table's size (no statistics yet).
    WHERE s.id = ANY(@id::uuid[]) AND s.id = u.id AND s.revision = u.revision
    RETURNING s.id
), history AS (
    INSERT INTO /* TEMPLATE: schema */sagabox_saga_history (
        saga_id, at, event, step, step_index, phase, attempt, detail, actor, message_id
    )
    SELECT unnest(@h_saga_id::uuid[]),
           unnest(@h_at::timestamptz[]),
           unnest(@h_event::text[]),
           unnest(@h_step::text[]),
           unnest(@h_step_index::integer[]),
           unnest(@h_phase::text[]),
           unnest(@h_attempt::integer[]),
           unnest(@h_detail::text[]),
           unnest(@h_actor::text[]),
           nullif(unnest(@h_message_id::uuid[]), '00000000-0000-0000-0000-000000000000'::uuid)
), message AS (
    SELECT unnest(@o_message_id::uuid[]) AS message_id,
           unnest(@o_ordering_key::text[]) AS ordering_key,
           unnest(@o_kind::text[]) AS kind,
           unnest(@o_type::text[]) AS type,
           unnest(@o_routing_key::text[]) AS routing_key,
           unnest(@o_saga_id::uuid[]) AS saga_id,
           unnest(@o_saga_type::text[]) AS saga_type,
           unnest(@o_step::text[]) AS step,
           unnest(@o_step_index::integer[]) AS step_index,
           unnest(@o_attempt::integer[]) AS attempt,
           unnest(@o_reply_to::text[]) AS reply_to,
           unnest(@o_correlation_id::text[]) AS correlation_id,
           unnest(@o_traceparent::text[]) AS traceparent,
           unnest(@o_tracestate::text[]) AS tracestate,
           unnest(@o_headers::jsonb[]) AS headers,
           unnest(@o_payload::bytea[]) AS payload,
           unnest(@o_created_at::timestamptz[]) AS created_at
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
SELECT /* TEMPLATE: schema */sagabox_check(
    (SELECT count(*) FROM updated) = cardinality(@id::uuid[]),
    '40001',
    'sagabox: a saga changed since its transition was computed; the transaction is run again'
)::boolean AS ok,
coalesce((SELECT array_agg(o.id ORDER BY o.id) FROM outbox o WHERE o.leased), '{}')::bigint[] AS leased_ids,
coalesce((SELECT array_agg(o.message_id ORDER BY o.id) FROM outbox o WHERE o.leased), '{}')::uuid[] AS leased_message_ids;

-- name: SagaGet :one
SELECT * FROM /* TEMPLATE: schema */sagabox_saga WHERE id = @id::uuid;

-- name: SagaGetByStartKey :one
-- Returns the saga a start key names now: the one holding it unreleased.
SELECT * FROM /* TEMPLATE: schema */sagabox_saga
WHERE saga_type = @saga_type::text AND start_key = @start_key::text AND NOT start_key_released;

-- name: SagaReleaseStartKey :many
-- Releases, in the caller's transaction, the start key of the finished
-- (completed, compensated or terminated) saga holding it, so that a start
-- with the key can insert a new saga; the old saga keeps the key, marked
-- released, and gets a history entry. A saga that has not finished keeps
-- the key. A concurrent release of the same key waits for the row lock and
-- then finds nothing to release.
WITH released AS (
    UPDATE /* TEMPLATE: schema */sagabox_saga
    SET start_key_released = true
    WHERE saga_type = @saga_type::text AND start_key = @start_key::text
      AND NOT start_key_released AND finished_at IS NOT NULL
    RETURNING id, phase
), history AS (
    INSERT INTO /* TEMPLATE: schema */sagabox_saga_history (saga_id, at, event, phase, detail)
    SELECT released.id, @now::timestamptz, @event::text, released.phase, @detail::text
    FROM released
)
SELECT released.id FROM released;

-- name: SagaList :many
-- Lists sagas oldest first (by start), filtered by type, version, status,
-- start key, the time of their last change and an overdue deadline, with
-- keyset paging on (created_at, id), which never change: a page follows the
-- previous one however the sagas move on. Each filter has an index to
-- start from: type and status (sagabox_saga_type_status_created_at_idx,
-- sagabox_saga_status_created_at_idx), start key (sagabox_saga_start_key_held_idx
-- with a type, sagabox_saga_start_key_idx without), overdue deadline
-- (sagabox_saga_deadline_idx).
SELECT * FROM /* TEMPLATE: schema */sagabox_saga
WHERE (sqlc.narg('saga_type')::text IS NULL OR saga_type = sqlc.narg('saga_type')::text)
  AND (sqlc.narg('version')::integer IS NULL OR version = sqlc.narg('version')::integer)
  AND (cardinality(@statuses::text[]) = 0 OR status = ANY(@statuses::text[]))
  AND (sqlc.narg('start_key')::text IS NULL OR start_key = sqlc.narg('start_key')::text)
  AND (sqlc.narg('updated_before')::timestamptz IS NULL OR updated_at < sqlc.narg('updated_before')::timestamptz)
  AND (sqlc.narg('deadline_before')::timestamptz IS NULL
       OR (deadline < sqlc.narg('deadline_before')::timestamptz AND deadline IS NOT NULL
           AND status IN ('running', 'compensating')))
  AND (sqlc.narg('after_created_at')::timestamptz IS NULL
       OR (created_at, id) > (sqlc.narg('after_created_at')::timestamptz, sqlc.narg('after_id')::uuid))
ORDER BY created_at, id
LIMIT @max::integer;

-- name: SagaHistoryList :many
SELECT * FROM /* TEMPLATE: schema */sagabox_saga_history
WHERE saga_id = @saga_id::uuid
ORDER BY id;

-- name: SagaUnpublished :many
-- The commands and compensations of sagas @saga_ids still in the outbox,
-- not yet published, in the order they were written: what a timer needs to
-- tell a schedule-to-start timeout that expired from one whose command went
-- out. A saga's messages have its id (as text) as their ordering key: the
-- lookup reads the index of unpublished rows by key.
SELECT o.saga_id::uuid AS saga_id, o.message_id, o.kind, o.step_index, o.attempt, o.created_at
FROM /* TEMPLATE: schema */sagabox_outbox o
WHERE o.ordering_key = ANY(CAST(@saga_ids::uuid[] AS text[]))
  AND o.saga_id = ANY(@saga_ids::uuid[])
  AND o.published_at IS NULL
  AND o.kind IN ('command', 'compensation')
ORDER BY o.id;

-- name: SagaShiftDeadlines :exec
-- Pushes back the deadlines of steps whose command or compensation was
-- published late (held in the outbox by a broker outage or a backlog), by
-- the time it waited: a step's timeout measures the participant, from when
-- the broker has its command. Each row of the arrays is one published
-- message: its saga, step, phase, attempt and delay; a step that has moved
-- on since (another attempt, or settled) is left alone. The shift is
-- computed from the row as locked, so it composes with a concurrent
-- transition.
UPDATE /* TEMPLATE: schema */sagabox_saga s
SET steps = /* TEMPLATE: schema */sagabox_shift_deadlines(s.steps, l.step_index, l.phase, l.attempt, l.delay_seconds),
    -- The saga's deadline is the earliest of the steps' deadlines and
    -- schedule-to-start deadlines (saga.EarliestDeadline); LEAST ignores
    -- a null.
    deadline = least(
        /* TEMPLATE: schema */sagabox_earliest_deadline(
            /* TEMPLATE: schema */sagabox_shift_deadlines(s.steps, l.step_index, l.phase, l.attempt, l.delay_seconds)),
        (SELECT min((e->>'start_by')::timestamptz) FROM jsonb_array_elements(s.steps) AS e WHERE e ? 'start_by')),
    revision = s.revision + 1
FROM (
    SELECT r.saga_id, array_agg(r.step_index) AS step_index, array_agg(r.phase) AS phase,
           array_agg(r.attempt) AS attempt, array_agg(r.delay_seconds) AS delay_seconds
    FROM (
        SELECT unnest(@saga_id::uuid[]) AS saga_id, unnest(@step_index::integer[]) AS step_index,
               unnest(@phase::text[]) AS phase, unnest(@attempt::integer[]) AS attempt,
               unnest(@delay_seconds::float8[]) AS delay_seconds
    ) AS r
    GROUP BY r.saga_id
) AS l
WHERE s.id = l.saga_id
  AND s.status IN ('running', 'compensating')
  AND /* TEMPLATE: schema */sagabox_shift_deadlines(s.steps, l.step_index, l.phase, l.attempt, l.delay_seconds) IS DISTINCT FROM s.steps;
