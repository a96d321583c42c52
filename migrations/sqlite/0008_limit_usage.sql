-- Limits on the sum of correct calls (crates/core/src/limits.rs).
--
-- `limit_usage`: one row per step and limit scope it counts against
-- (`refunds|agent:demo-agent`), written in the commit of the step's
-- intent. A row counts while its step is INTENDED, UNKNOWN or CONFIRMED.
--
-- `limit_totals`: each scope's counted sum, so a check reads one row, not
-- every row of its window. Kept by triggers: a usage row adds its amount
-- when its step counts; a step moving into or out of a counting status
-- adds or gives back its amounts. Rows that leave a rolling window are
-- swept out by the next check of their scope (`swept_at`, a julianday:
-- every counted row at or before it has left `used`), each row once.
CREATE TABLE limit_usage (
    scope    TEXT NOT NULL,
    run_id   TEXT NOT NULL,
    step_idx INTEGER NOT NULL,
    amount   INTEGER NOT NULL CHECK (amount > 0),
    -- julianday('now') on the database's clock when the intent was written.
    at       REAL NOT NULL,
    -- By step first: a step's rows are found when its status moves. No
    -- foreign key: its check would cost every limited intent a read of
    -- the row it has just written; whoever deletes a step deletes its
    -- rows here in the same transaction.
    PRIMARY KEY (run_id, step_idx, scope)
);
-- A scope's rows in time order: the rows leaving its window.
CREATE INDEX limit_usage_by_scope_and_time ON limit_usage (scope, at);

CREATE TABLE limit_totals (
    scope    TEXT PRIMARY KEY NOT NULL,
    used     INTEGER NOT NULL DEFAULT 0,
    swept_at REAL NOT NULL DEFAULT 0
);

CREATE TRIGGER limit_usage_counted AFTER INSERT ON limit_usage
WHEN EXISTS (SELECT 1 FROM saga_log s
             WHERE s.run_id = NEW.run_id AND s.step_idx = NEW.step_idx
                 AND s.status IN ('INTENDED', 'UNKNOWN', 'CONFIRMED'))
BEGIN
    INSERT OR IGNORE INTO limit_totals (scope, used, swept_at) VALUES (NEW.scope, 0, 0);
    UPDATE limit_totals SET used = used + NEW.amount
    WHERE scope = NEW.scope AND NEW.at > swept_at;
END;

CREATE TRIGGER saga_log_recounted AFTER UPDATE OF status ON saga_log
WHEN (OLD.status IN ('INTENDED', 'UNKNOWN', 'CONFIRMED'))
    <> (NEW.status IN ('INTENDED', 'UNKNOWN', 'CONFIRMED'))
BEGIN
    UPDATE limit_totals
    SET used = used + (CASE WHEN NEW.status IN ('INTENDED', 'UNKNOWN', 'CONFIRMED')
                            THEN 1 ELSE -1 END)
        * (SELECT u.amount FROM limit_usage u
           WHERE u.run_id = NEW.run_id AND u.step_idx = NEW.step_idx
               AND u.scope = limit_totals.scope)
    WHERE EXISTS (SELECT 1 FROM limit_usage u
                  WHERE u.run_id = NEW.run_id AND u.step_idx = NEW.step_idx
                      AND u.scope = limit_totals.scope AND u.at > limit_totals.swept_at);
END;
