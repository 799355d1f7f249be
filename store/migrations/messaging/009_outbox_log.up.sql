-- Messaging line, version 9: what a log relay owes from the table. A
-- replication slot streams only what is committed after it was created:
-- after a failover (the promoted standby has no slot), a slot dropped by an
-- operator, or a first switch from polling to log mode, the rows already in
-- the outbox would never be streamed. Whoever creates the slot (the relay
-- itself, or `sagabox relay setup-log`) records here the last outbox row
-- written before it; a relay publishes the unpublished rows up to it by
-- claims, as the polling relay does, before it streams, and then marks the
-- slot caught up.
CREATE TABLE /* TEMPLATE: schema */sagabox_outbox_log (
    slot text PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now(),
    catch_up_through bigint NOT NULL,
    caught_up_at timestamptz
);
