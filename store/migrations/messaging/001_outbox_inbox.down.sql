DROP TABLE IF EXISTS /* TEMPLATE: schema */sagabox_barrier;
DROP TABLE IF EXISTS /* TEMPLATE: schema */sagabox_inbox_attempt;
DROP TABLE IF EXISTS /* TEMPLATE: schema */sagabox_inbox;
DROP TABLE IF EXISTS /* TEMPLATE: schema */sagabox_outbox;
