DROP VIEW IF EXISTS /* TEMPLATE: schema */sagabox_saga_history_v;
DROP VIEW IF EXISTS /* TEMPLATE: schema */sagabox_saga_step_v;
DROP VIEW IF EXISTS /* TEMPLATE: schema */sagabox_saga_v;
DROP TABLE IF EXISTS /* TEMPLATE: schema */sagabox_saga_operation;
