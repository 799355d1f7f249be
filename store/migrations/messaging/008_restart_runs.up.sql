-- Messaging line, version 8: restart from a step. An operator can run a
-- failed or compensated saga again from a step (a new run of it, numbered by
-- saga.Instance.Run and carried by its commands): the barrier keeps one mark
-- per saga, run, step and phase, so that a restarted step is performed again
-- while re-sends within a run still are at most once.
ALTER TABLE /* TEMPLATE: schema */sagabox_barrier
    ADD COLUMN IF NOT EXISTS run integer NOT NULL DEFAULT 0;
ALTER TABLE /* TEMPLATE: schema */sagabox_barrier
    DROP CONSTRAINT IF EXISTS sagabox_barrier_pkey,
    ADD CONSTRAINT sagabox_barrier_pkey PRIMARY KEY (saga_id, run, step, phase);
