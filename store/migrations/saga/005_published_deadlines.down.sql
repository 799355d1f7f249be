DROP FUNCTION IF EXISTS /* TEMPLATE: schema */sagabox_earliest_deadline(jsonb);
DROP FUNCTION IF EXISTS /* TEMPLATE: schema */sagabox_shift_deadlines(jsonb, integer[], text[], integer[], float8[]);
