ALTER TABLE /* TEMPLATE: schema */sagabox_saga
    DROP COLUMN IF EXISTS tracestate,
    DROP COLUMN IF EXISTS traceparent;
