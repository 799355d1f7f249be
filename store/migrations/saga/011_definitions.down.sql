DROP TABLE IF EXISTS /* TEMPLATE: schema */sagabox_saga_definition;
