-- Messaging line, version 8: the write-time lease. A statement that writes
-- a delivery's outgoing messages claims them for the relay of its process
-- unless an earlier unpublished row of their ordering key, other than the
-- rows that relay has had confirmed, is there (SagaWrite, DeliveryFinish).
--
-- The check is a function of its own, not a subquery of those statements:
-- a per-row probe inside them makes their generic plan look ten times
-- dearer than a custom plan (PostgreSQL assumes ten elements in an array
-- parameter, and one in a custom plan's), and the plan cache then plans
-- every execution anew, at three times the cost of running it. A PL/pgSQL
-- function is never inlined: its cost is what COST says, and its query is
-- one probe of the (ordering_key, id) index of unpublished rows, planned
-- once per connection. STABLE: it sees the calling statement's snapshot,
-- so rows of one key that a statement writes are leased together.
CREATE FUNCTION /* TEMPLATE: schema */sagabox_outbox_leasable(key text, confirmed bigint[])
RETURNS boolean LANGUAGE plpgsql STABLE COST 1 AS $$
BEGIN
    RETURN NOT EXISTS (
        SELECT 1 FROM /* TEMPLATE: schema */sagabox_outbox p
        WHERE p.ordering_key = key AND p.published_at IS NULL AND p.id <> ALL(confirmed)
    );
END
$$;
