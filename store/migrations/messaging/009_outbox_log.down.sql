DROP TABLE /* TEMPLATE: schema */sagabox_outbox_log;
