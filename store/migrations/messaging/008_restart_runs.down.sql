DELETE FROM /* TEMPLATE: schema */sagabox_barrier WHERE run > 0;
ALTER TABLE /* TEMPLATE: schema */sagabox_barrier
    DROP CONSTRAINT IF EXISTS sagabox_barrier_pkey,
    ADD CONSTRAINT sagabox_barrier_pkey PRIMARY KEY (saga_id, step, phase);
ALTER TABLE /* TEMPLATE: schema */sagabox_barrier DROP COLUMN IF EXISTS run;
