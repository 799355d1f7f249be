-- Saga line, version 3: the W3C trace context of the span that started the
-- saga, so that work the orchestrator does on its own (deadlines) joins the
-- saga's trace.
ALTER TABLE /* TEMPLATE: schema */sagabox_saga
    ADD COLUMN traceparent text NOT NULL DEFAULT '',
    ADD COLUMN tracestate  text NOT NULL DEFAULT '';
