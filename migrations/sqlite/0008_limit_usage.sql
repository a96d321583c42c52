-- What each step counts against the tools file's limits (money, recipients,
-- calls): one row per step and limit scope, written in the commit of the
-- step's intent (crates/core/src/limits.rs). A row counts while its step is
-- INTENDED, UNKNOWN or CONFIRMED; the step's status alone says so, so a
-- failed or compensated step gives its amount back without a write here.
CREATE TABLE limit_usage (
    -- The limit's name and whose usage it is: `refunds|agent:demo-agent`.
    scope    TEXT NOT NULL,
    run_id   TEXT NOT NULL,
    step_idx INTEGER NOT NULL,
    amount   INTEGER NOT NULL CHECK (amount > 0),
    -- julianday('now') on the database's clock when the intent was written.
    at       REAL NOT NULL,
    PRIMARY KEY (scope, run_id, step_idx),
    FOREIGN KEY (run_id, step_idx) REFERENCES saga_log (run_id, step_idx) ON DELETE CASCADE
);
CREATE INDEX limit_usage_by_scope_and_time ON limit_usage (scope, at);
