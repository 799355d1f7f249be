-- Messaging line, version 4: an outbox that takes as few writes per message
-- as the relay needs. The relay deletes a row once the broker confirmed it
-- (unless published rows are kept for inspection), so nothing reads the
-- message id index; the lease update that claims a row changes no indexed
-- column and, with room left on each page, is a HOT update; and the inbox's
-- index of duplicated messages has no reader.
ALTER TABLE /* TEMPLATE: schema */sagabox_outbox DROP CONSTRAINT sagabox_outbox_message_id_key;
ALTER TABLE /* TEMPLATE: schema */sagabox_outbox SET (fillfactor = 80);
DROP INDEX /* TEMPLATE: schema */sagabox_inbox_duplicates_idx;
