-- Messaging line: handlers that call an outside system (a payment
-- provider, an e-mail service). Such a delivery records its inbox entry in a
-- commit of its own, in state 'started', before the outside call, and marks
-- it 'done' in a second commit with the handler's writes and the reply, so
-- that a duplicate is detected before the side effect and a delivery that
-- died between the two commits is resumed, not skipped. Every other entry is
-- 'done' from the start. attempt counts the times the outside call was begun.
ALTER TABLE /* TEMPLATE: schema */sagabox_inbox
    ADD COLUMN IF NOT EXISTS state text NOT NULL DEFAULT 'done',
    ADD COLUMN IF NOT EXISTS attempt integer NOT NULL DEFAULT 1;
-- Entries left 'started' (a delivery in flight, or one waiting to be
-- resumed) are few; operators list them, and retention keeps them.
CREATE INDEX IF NOT EXISTS sagabox_inbox_started_idx
    ON /* TEMPLATE: schema */sagabox_inbox (received_at) WHERE state = 'started';
