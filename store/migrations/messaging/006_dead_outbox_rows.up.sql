-- Messaging line, version 6: outbox rows the relay gave up on. A reply or an
-- event that no queue takes (the broker returns it as unroutable) is retried
-- a bounded number of times and then set aside, dead, with the reason:
-- retried for ever it would keep the relay's error rate up and hide real
-- failures. A dead row leaves the unpublished indexes (its published_at is
-- set, so no later row of its key waits behind it) and stays until an
-- operator retries or deletes it.
ALTER TABLE /* TEMPLATE: schema */sagabox_outbox ADD COLUMN dead_at timestamptz;
CREATE INDEX sagabox_outbox_dead_idx
    ON /* TEMPLATE: schema */sagabox_outbox (dead_at) WHERE dead_at IS NOT NULL;

CREATE VIEW /* TEMPLATE: schema */sagabox_outbox_dead_v AS
SELECT o.id, o.message_id, o.kind, o.type, o.routing_key, o.saga_id, o.saga_type, o.step,
       o.attempt, o.correlation_id, o.publish_attempts, o.last_error, o.created_at, o.dead_at
FROM /* TEMPLATE: schema */sagabox_outbox o
WHERE o.dead_at IS NOT NULL;
