CREATE INDEX sagabox_inbox_duplicates_idx
    ON /* TEMPLATE: schema */sagabox_inbox (last_duplicate_at) WHERE duplicates > 0;
ALTER TABLE /* TEMPLATE: schema */sagabox_outbox RESET (fillfactor);
ALTER TABLE /* TEMPLATE: schema */sagabox_outbox ADD CONSTRAINT sagabox_outbox_message_id_key UNIQUE (message_id);
