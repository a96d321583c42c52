-- Limits on the sum of correct calls (crates/core/src/limits.rs).
--
-- `limit_usage`: one row per step and limit scope it counts against
-- (`refunds|agent:demo-agent`), written in the statement of the step's
-- intent. A row counts while its step is INTENDED, UNKNOWN or CONFIRMED.
--
-- `limit_totals`: each scope's counted sum, so a check reads one row, not
-- every row of its window. Kept by triggers: a usage row adds its amount
-- when its step counts; a step moving into or out of a counting status
-- adds or gives back its amounts. Rows that leave a rolling window are
-- swept out by the next check of their scope (`swept_at`: every counted
-- row at or before it has left `used`), each row once.
CREATE TABLE limit_usage (
    scope    TEXT NOT NULL,
    run_id   TEXT NOT NULL,
    step_idx BIGINT NOT NULL,
    amount   BIGINT NOT NULL CHECK (amount > 0),
    -- The database's clock when the intent was written.
    at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- By step first: a step's rows are found when its status moves. No
    -- foreign key: its check would cost every limited intent a read of
    -- the row it has just written; whoever deletes a step deletes its
    -- rows here in the same transaction.
    PRIMARY KEY (run_id, step_idx, scope)
);
-- A scope's rows in time order: the rows leaving its window.
CREATE INDEX limit_usage_by_scope_and_time ON limit_usage (scope, at);

CREATE TABLE limit_totals (
    scope    TEXT PRIMARY KEY,
    used     BIGINT NOT NULL DEFAULT 0,
    swept_at TIMESTAMPTZ NOT NULL DEFAULT '-infinity'
);

-- A usage row counts from its insert when its step already counts.
CREATE FUNCTION saga_usage_counted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM saga_log s
               WHERE s.run_id = NEW.run_id AND s.step_idx = NEW.step_idx
                   AND s.status IN ('INTENDED', 'UNKNOWN', 'CONFIRMED')) THEN
        INSERT INTO limit_totals AS t (scope, used) VALUES (NEW.scope, NEW.amount)
        ON CONFLICT (scope) DO UPDATE SET used = t.used + EXCLUDED.used
            WHERE NEW.at > t.swept_at;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER limit_usage_counted AFTER INSERT ON limit_usage
    FOR EACH ROW EXECUTE FUNCTION saga_usage_counted();

-- A step that starts or stops counting adds or gives back its amounts
-- still inside their windows.
CREATE FUNCTION saga_step_recounted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE limit_totals t
    SET used = t.used + CASE WHEN NEW.status IN ('INTENDED', 'UNKNOWN', 'CONFIRMED')
                             THEN u.amount ELSE -u.amount END
    FROM limit_usage u
    WHERE u.run_id = NEW.run_id AND u.step_idx = NEW.step_idx
        AND t.scope = u.scope AND u.at > t.swept_at;
    RETURN NULL;
END
$$;
CREATE TRIGGER saga_log_recounted AFTER UPDATE OF status ON saga_log
    FOR EACH ROW
    WHEN ((OLD.status IN ('INTENDED', 'UNKNOWN', 'CONFIRMED'))
        IS DISTINCT FROM (NEW.status IN ('INTENDED', 'UNKNOWN', 'CONFIRMED')))
    EXECUTE FUNCTION saga_step_recounted();

-- Whether a step's charges fit under their limits, called from the one
-- statement that writes the intent. Each scope's totals row is locked (in
-- one order, so two callers never wait on each other crosswise) and read
-- as last committed; rows that left its window since the last check are
-- swept out; the step fits when every charge does. Nothing is added here:
-- the intent's usage rows add themselves, so a statement that writes no
-- intent counts nothing. The row locks last until the caller's commit.
CREATE FUNCTION saga_within_limits(charges jsonb) RETURNS boolean
LANGUAGE plpgsql VOLATILE COST 10000 AS $$
DECLARE
    c record;
    used_now bigint;
    swept timestamptz;
    cutoff timestamptz;
    expired bigint;
    leaving bigint;
    fits boolean := true;
BEGIN
    FOR c IN SELECT * FROM jsonb_to_recordset(charges)
             AS x(scope text, amount int8, max int8, window_s int8)
             ORDER BY x.scope LOOP
        SELECT t.used, t.swept_at INTO used_now, swept
        FROM limit_totals t WHERE t.scope = c.scope FOR UPDATE;
        IF NOT FOUND THEN
            INSERT INTO limit_totals (scope) VALUES (c.scope) ON CONFLICT (scope) DO NOTHING;
            SELECT t.used, t.swept_at INTO used_now, swept
            FROM limit_totals t WHERE t.scope = c.scope FOR UPDATE;
        END IF;
        IF c.window_s IS NOT NULL THEN
            cutoff := now() - c.window_s * interval '1 second';
            -- Only the rows that left the window since the last sweep
            -- are read, and the row is written only when there are some.
            SELECT coalesce(sum(u.amount) FILTER (WHERE s.status IN
                       ('INTENDED', 'UNKNOWN', 'CONFIRMED')), 0), count(*)
            INTO expired, leaving
            FROM limit_usage u
            JOIN saga_log s ON s.run_id = u.run_id AND s.step_idx = u.step_idx
            WHERE u.scope = c.scope AND u.at > swept AND u.at <= cutoff;
            IF leaving > 0 THEN
                UPDATE limit_totals SET used = used - expired, swept_at = cutoff
                WHERE scope = c.scope;
                used_now := used_now - expired;
            END IF;
        END IF;
        IF used_now + c.amount > c.max THEN
            fits := false;
        END IF;
    END LOOP;
    RETURN fits;
END
$$;
