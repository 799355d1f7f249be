ALTER TABLE /* TEMPLATE: schema */sagabox_outbox RESET (
    autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold, autovacuum_vacuum_cost_delay
);
ALTER TABLE /* TEMPLATE: schema */sagabox_barrier RESET (fillfactor);
