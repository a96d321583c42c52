-- What each step counts against the tools file's limits (money, recipients,
-- calls): one row per step and limit scope, written in the statement of the
-- step's intent (crates/core/src/limits.rs). A row counts while its step is
-- INTENDED, UNKNOWN or CONFIRMED; the step's status alone says so, so a
-- failed or compensated step gives its amount back without a write here.
CREATE TABLE limit_usage (
    -- The limit's name and whose usage it is: `refunds|agent:demo-agent`.
    scope    TEXT NOT NULL,
    run_id   TEXT NOT NULL,
    step_idx BIGINT NOT NULL,
    amount   BIGINT NOT NULL CHECK (amount > 0),
    -- The database's clock when the intent was written.
    at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, run_id, step_idx),
    FOREIGN KEY (run_id, step_idx) REFERENCES saga_log (run_id, step_idx) ON DELETE CASCADE
);
CREATE INDEX limit_usage_by_scope_and_time ON limit_usage (scope, at);

-- Whether a step's charges fit under their limits, called from the one
-- statement that writes the intent. Each charge's scope is locked first
-- (a transaction-level advisory lock, in one order, so two callers never
-- wait on each other crosswise), and only then summed: a VOLATILE
-- function's every query takes a fresh snapshot, so the sum sees every
-- intent committed by whoever held the lock before. The locks last until
-- the caller's commit, so the next caller sees this intent too.
CREATE FUNCTION saga_within_limits(charges jsonb) RETURNS boolean
LANGUAGE plpgsql VOLATILE COST 10000 AS $$
DECLARE
    c record;
    used bigint;
BEGIN
    FOR c IN SELECT DISTINCT x.scope FROM jsonb_to_recordset(charges) AS x(scope text)
             ORDER BY x.scope LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended('saga limit ' || c.scope, 0));
    END LOOP;
    FOR c IN SELECT * FROM jsonb_to_recordset(charges)
             AS x(scope text, amount int8, max int8, window_s int8) LOOP
        SELECT coalesce(sum(u.amount), 0) INTO used
        FROM limit_usage u
        JOIN saga_log s ON s.run_id = u.run_id AND s.step_idx = u.step_idx
        WHERE u.scope = c.scope
            AND (c.window_s IS NULL OR u.at > now() - c.window_s * interval '1 second')
            AND s.status IN ('INTENDED', 'UNKNOWN', 'CONFIRMED');
        IF used + c.amount > c.max THEN
            RETURN false;
        END IF;
    END LOOP;
    RETURN true;
END
$$;
