-- Messaging line, version 5: tables whose rows churn keep their writes small.
--
-- A delivery's barrier mark is written once and completed in place: its
-- outcome and stored reply are in no index and each page keeps room for a
-- new version of its rows, so completing the mark is a HOT update (one heap
-- write, no index entries).
--
-- The outbox is a queue: every row is inserted, leased and deleted within
-- moments. Autovacuum's default (vacuum once a fifth of the table is dead)
-- lets its indexes fill with dead entries that every insert then steps
-- over; it is vacuumed instead once a fixed number of rows died, without
-- the cost-based pauses (the table is small: the work is short).
ALTER TABLE /* TEMPLATE: schema */sagabox_barrier SET (fillfactor = 70);
ALTER TABLE /* TEMPLATE: schema */sagabox_outbox SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_cost_delay = 0
);
