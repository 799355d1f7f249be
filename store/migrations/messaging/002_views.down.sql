DROP VIEW IF EXISTS /* TEMPLATE: schema */sagabox_dead_letter_v;
DROP VIEW IF EXISTS /* TEMPLATE: schema */sagabox_inbox_v;
DROP VIEW IF EXISTS /* TEMPLATE: schema */sagabox_outbox_v;
DROP VIEW IF EXISTS /* TEMPLATE: schema */sagabox_outbox_backlog_v;
