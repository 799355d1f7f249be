DROP FUNCTION /* TEMPLATE: schema */sagabox_outbox_leasable(text, bigint[]);
