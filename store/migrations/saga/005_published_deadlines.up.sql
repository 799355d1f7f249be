-- Saga line, version 5: a step's timeout counts from when the broker has its
-- command. The relay pushes back the deadline of a step whose command it
-- published late (SagaShiftDeadlines), with these two functions over the
-- steps' state (the JSON of saga.StepState: "status", "attempt",
-- "compensation_attempt", "deadline").

-- sagabox_shift_deadlines returns steps with the deadline of each step
-- step_index[i] moved by delay_seconds[i], when that step is still waiting
-- for the attempt attempt[i] of its phase[i] ('action' or 'compensation').
CREATE FUNCTION /* TEMPLATE: schema */sagabox_shift_deadlines(
    steps jsonb, step_index integer[], phase text[], attempt integer[], delay_seconds float8[]
) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(jsonb_agg(
        CASE WHEN m.delay IS NOT NULL AND x.e ? 'deadline' THEN
            jsonb_set(x.e, '{deadline}', to_jsonb((x.e->>'deadline')::timestamptz + make_interval(secs => m.delay)))
        ELSE x.e END
        ORDER BY x.ord), '[]'::jsonb)
    FROM jsonb_array_elements(steps) WITH ORDINALITY AS x(e, ord)
    LEFT JOIN LATERAL (
        SELECT max(r.delay) AS delay
        FROM unnest(step_index, phase, attempt, delay_seconds) AS r(i, ph, a, delay)
        WHERE r.i = x.ord - 1
          AND ((r.ph = 'action' AND x.e->>'status' = 'running' AND coalesce((x.e->>'attempt')::integer, 0) = r.a)
            OR (r.ph = 'compensation' AND x.e->>'status' = 'compensating'
                AND coalesce((x.e->>'compensation_attempt')::integer, 0) = r.a))
    ) AS m ON true
$$;

-- sagabox_earliest_deadline returns the earliest deadline of steps, the
-- saga's deadline (saga.Instance.Deadline), or null when none is set.
CREATE FUNCTION /* TEMPLATE: schema */sagabox_earliest_deadline(steps jsonb) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT min((e->>'deadline')::timestamptz) FROM jsonb_array_elements(steps) AS e WHERE e ? 'deadline'
$$;
