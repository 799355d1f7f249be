-- Saga line, version 4: a saga transition that writes as little as its
-- guarantees need.
--
-- A transition changes updated_at (and data, steps, current_step...) of its
-- saga's row. No index covers those columns any more, and each page keeps
-- room for a new row version, so the update is a HOT update: one heap
-- write, no index entries, unless the status or deadline changes. Listing
-- is by start time (created_at, which never changes), which also makes
-- keyset paging stable while sagas move on.
--
-- The history's foreign key ran a trigger and locked the saga row for
-- every history row written; its primary key index had no reader. The saga
-- row is locked by the transaction that writes the history anyway, and
-- retention deletes a saga's history with the saga (SagaDeleteFinishedBefore).
ALTER TABLE /* TEMPLATE: schema */sagabox_saga SET (fillfactor = 70);
DROP INDEX /* TEMPLATE: schema */sagabox_saga_status_updated_at_idx;
DROP INDEX /* TEMPLATE: schema */sagabox_saga_type_status_updated_at_idx;
CREATE INDEX sagabox_saga_status_created_at_idx
    ON /* TEMPLATE: schema */sagabox_saga (status, created_at, id);
CREATE INDEX sagabox_saga_type_status_created_at_idx
    ON /* TEMPLATE: schema */sagabox_saga (saga_type, status, created_at, id);

ALTER TABLE /* TEMPLATE: schema */sagabox_saga_history
    DROP CONSTRAINT sagabox_saga_history_saga_id_fkey,
    DROP CONSTRAINT sagabox_saga_history_pkey;
