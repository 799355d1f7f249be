DELETE FROM /* TEMPLATE: schema */sagabox_saga_history h
WHERE NOT EXISTS (SELECT 1 FROM /* TEMPLATE: schema */sagabox_saga s WHERE s.id = h.saga_id);
ALTER TABLE /* TEMPLATE: schema */sagabox_saga_history
    ADD CONSTRAINT sagabox_saga_history_pkey PRIMARY KEY (id),
    ADD CONSTRAINT sagabox_saga_history_saga_id_fkey
        FOREIGN KEY (saga_id) REFERENCES /* TEMPLATE: schema */sagabox_saga (id) ON DELETE CASCADE;
DROP INDEX /* TEMPLATE: schema */sagabox_saga_type_status_created_at_idx;
DROP INDEX /* TEMPLATE: schema */sagabox_saga_status_created_at_idx;
CREATE INDEX sagabox_saga_type_status_updated_at_idx
    ON /* TEMPLATE: schema */sagabox_saga (saga_type, status, updated_at);
CREATE INDEX sagabox_saga_status_updated_at_idx
    ON /* TEMPLATE: schema */sagabox_saga (status, updated_at);
ALTER TABLE /* TEMPLATE: schema */sagabox_saga RESET (fillfactor);
