-- Messaging line, version 3: what the engine's one-round-trip operations
-- need. An operation sends its statements and COMMIT in one batch, so a
-- condition that must hold before the commit is checked in SQL: a failed
-- check raises, the transaction aborts, and COMMIT is not run.
CREATE FUNCTION /* TEMPLATE: schema */sagabox_check(ok boolean, code text, message text)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF NOT ok THEN
        RAISE EXCEPTION USING ERRCODE = code, MESSAGE = message;
    END IF;
    RETURN true;
END
$$;
