DROP TABLE IF EXISTS /* TEMPLATE: schema */sagabox_saga_history;
DROP TABLE IF EXISTS /* TEMPLATE: schema */sagabox_saga;
