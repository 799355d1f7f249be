-- Messaging line, version 1: the transactional outbox, the inbox and the
-- compensation barrier. Every service that sends or receives messages has
-- these tables in its own schema.

CREATE TABLE /* TEMPLATE: schema */sagabox_outbox (
    -- id is the write order; the relay publishes rows of one ordering key in id order.
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id      uuid        NOT NULL,
    ordering_key    text        NOT NULL,
    kind            text        NOT NULL,
    type            text        NOT NULL,
    routing_key     text        NOT NULL,
    saga_id         uuid,
    saga_type       text        NOT NULL DEFAULT '',
    step            text        NOT NULL DEFAULT '',
    step_index      integer     NOT NULL DEFAULT 0,
    attempt         integer     NOT NULL DEFAULT 0,
    reply_to        text        NOT NULL DEFAULT '',
    correlation_id  text        NOT NULL DEFAULT '',
    traceparent     text        NOT NULL DEFAULT '',
    tracestate      text        NOT NULL DEFAULT '',
    headers         jsonb       NOT NULL DEFAULT '{}',
    payload         bytea       NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- A relay that claimed the row owns it until claimed_until.
    claimed_until   timestamptz,
    claimed_by      text        NOT NULL DEFAULT '',
    publish_attempts integer    NOT NULL DEFAULT 0,
    last_error      text        NOT NULL DEFAULT '',
    published_at    timestamptz,
    CONSTRAINT sagabox_outbox_message_id_key UNIQUE (message_id)
);

-- The claim reads only unpublished rows: a backlog of published rows (or their
-- dead tuples) is invisible to it.
CREATE INDEX sagabox_outbox_unpublished_idx
    ON /* TEMPLATE: schema */sagabox_outbox (id) WHERE published_at IS NULL;
CREATE INDEX sagabox_outbox_unpublished_key_idx
    ON /* TEMPLATE: schema */sagabox_outbox (ordering_key, id) WHERE published_at IS NULL;
-- Retention deletes published rows oldest first.
CREATE INDEX sagabox_outbox_published_at_idx
    ON /* TEMPLATE: schema */sagabox_outbox (published_at) WHERE published_at IS NOT NULL;

CREATE TABLE /* TEMPLATE: schema */sagabox_inbox (
    message_id      uuid        PRIMARY KEY,
    kind            text        NOT NULL,
    type            text        NOT NULL,
    saga_id         uuid,
    step            text        NOT NULL DEFAULT '',
    received_at     timestamptz NOT NULL DEFAULT now(),
    -- How many times the message arrived again after it was processed.
    duplicates      integer     NOT NULL DEFAULT 0,
    last_duplicate_at timestamptz
);
CREATE INDEX sagabox_inbox_received_at_idx
    ON /* TEMPLATE: schema */sagabox_inbox (received_at);
CREATE INDEX sagabox_inbox_duplicates_idx
    ON /* TEMPLATE: schema */sagabox_inbox (last_duplicate_at) WHERE duplicates > 0;

-- Failed processing attempts of a message, written outside the (rolled back)
-- processing transaction so that retries are bounded by Postgres, not only by
-- broker redeliveries.
CREATE TABLE /* TEMPLATE: schema */sagabox_inbox_attempt (
    message_id      uuid        PRIMARY KEY,
    kind            text        NOT NULL DEFAULT '',
    type            text        NOT NULL,
    saga_id         uuid,
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text        NOT NULL DEFAULT '',
    dead_lettered_at timestamptz,
    updated_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX sagabox_inbox_attempt_updated_at_idx
    ON /* TEMPLATE: schema */sagabox_inbox_attempt (updated_at);

-- The compensation barrier: one row per (saga, step, phase) that reached this
-- participant, whichever message carried it.
CREATE TABLE /* TEMPLATE: schema */sagabox_barrier (
    saga_id         uuid        NOT NULL,
    step            text        NOT NULL,
    phase           text        NOT NULL,
    message_id      uuid        NOT NULL,
    -- outcome is applied, rejected, skipped (null compensation) or blocked
    -- (an action row written by a compensation that arrived first: the
    -- late action is never applied).
    outcome         text        NOT NULL,
    -- The reply every later message of the same (saga, step, phase) gets:
    -- a re-sent action is answered with the first run's reply.
    reply_kind      text        NOT NULL DEFAULT '',
    reply_payload   bytea,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (saga_id, step, phase)
);
CREATE INDEX sagabox_barrier_created_at_idx
    ON /* TEMPLATE: schema */sagabox_barrier (created_at);
