-- Saga line, version 1: saga instances and their history. Only the
-- orchestrator's schema has these tables.

CREATE TABLE /* TEMPLATE: schema */sagabox_saga (
    id              uuid        PRIMARY KEY,
    saga_type       text        NOT NULL,
    version         integer     NOT NULL,
    status          text        NOT NULL,
    -- An optional caller-chosen key that makes Start idempotent per saga type.
    start_key       text,
    data            jsonb       NOT NULL,
    -- Per-step state (status, attempt, deadline) as written by the saga core.
    steps           jsonb       NOT NULL,
    current_step    integer     NOT NULL DEFAULT 0,
    phase           text        NOT NULL DEFAULT 'action',
    -- revision counts applied transitions; it guards against lost updates.
    revision        bigint      NOT NULL DEFAULT 1,
    -- The earliest pending step deadline; NULL when nothing is waiting on time.
    deadline        timestamptz,
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text        NOT NULL DEFAULT '',
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz
);

CREATE UNIQUE INDEX sagabox_saga_start_key_idx
    ON /* TEMPLATE: schema */sagabox_saga (saga_type, start_key) WHERE start_key IS NOT NULL;
-- The deadline sweeper reads only sagas that wait on time.
CREATE INDEX sagabox_saga_deadline_idx
    ON /* TEMPLATE: schema */sagabox_saga (deadline)
    WHERE deadline IS NOT NULL AND status IN ('running', 'compensating');
-- Listing by status, stalest first.
CREATE INDEX sagabox_saga_status_updated_at_idx
    ON /* TEMPLATE: schema */sagabox_saga (status, updated_at);
CREATE INDEX sagabox_saga_type_status_updated_at_idx
    ON /* TEMPLATE: schema */sagabox_saga (saga_type, status, updated_at);
-- Retention of finished sagas.
CREATE INDEX sagabox_saga_finished_at_idx
    ON /* TEMPLATE: schema */sagabox_saga (finished_at) WHERE finished_at IS NOT NULL;

CREATE TABLE /* TEMPLATE: schema */sagabox_saga_history (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    saga_id         uuid        NOT NULL REFERENCES /* TEMPLATE: schema */sagabox_saga (id) ON DELETE CASCADE,
    at              timestamptz NOT NULL,
    event           text        NOT NULL,
    step            text        NOT NULL DEFAULT '',
    step_index      integer     NOT NULL DEFAULT 0,
    phase           text        NOT NULL DEFAULT '',
    attempt         integer     NOT NULL DEFAULT 0,
    detail          text        NOT NULL DEFAULT '',
    actor           text        NOT NULL DEFAULT '',
    message_id      uuid
);
CREATE INDEX sagabox_saga_history_saga_id_idx
    ON /* TEMPLATE: schema */sagabox_saga_history (saga_id, id);
