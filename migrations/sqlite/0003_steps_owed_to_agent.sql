-- R12: a step whose last answer to the agent was not final (unknown, not
-- executed, awaiting approval) is owed to the agent until it has been given
-- the step's final outcome. While it is, the run's `next_step` names it,
-- and a new step of the same tool is refused as a likely reworded retry.
ALTER TABLE saga_log ADD COLUMN owed_to_agent INTEGER NOT NULL DEFAULT 0;

-- Every call reads the run's owed steps; this index holds only those, so
-- the read costs the same at step 1,000 as at step 1. Its condition is the
-- one the query uses, word for word (src/store/sqlite.rs).
CREATE INDEX saga_log_owed_by_run ON saga_log (run_id, step_idx) WHERE owed_to_agent = 1;
