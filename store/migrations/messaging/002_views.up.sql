-- Messaging line, version 2: inspection views, a supported and stable query
-- API for psql and BI tools. Columns are only ever added, never renamed or
-- removed.

CREATE VIEW /* TEMPLATE: schema */sagabox_outbox_backlog_v AS
SELECT count(*)::bigint AS backlog,
       min(created_at) AS oldest_unsent_at,
       coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 AS oldest_age_seconds,
       count(*) FILTER (WHERE publish_attempts > 1)::bigint AS retrying
FROM /* TEMPLATE: schema */sagabox_outbox
WHERE published_at IS NULL;

CREATE VIEW /* TEMPLATE: schema */sagabox_outbox_v AS
SELECT id, message_id, kind, type, routing_key, saga_id, saga_type, step, attempt,
       created_at, published_at, publish_attempts, last_error,
       (published_at IS NOT NULL) AS published
FROM /* TEMPLATE: schema */sagabox_outbox;

CREATE VIEW /* TEMPLATE: schema */sagabox_inbox_v AS
SELECT i.message_id, i.kind, i.type, i.saga_id, i.step, i.received_at, i.duplicates,
       i.last_duplicate_at
FROM /* TEMPLATE: schema */sagabox_inbox i;

CREATE VIEW /* TEMPLATE: schema */sagabox_dead_letter_v AS
SELECT a.message_id, a.kind, a.type, a.saga_id, a.attempts, a.last_error, a.dead_lettered_at
FROM /* TEMPLATE: schema */sagabox_inbox_attempt a
WHERE a.dead_lettered_at IS NOT NULL;
