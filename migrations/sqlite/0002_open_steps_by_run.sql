-- A new step waits for the run's unsettled steps (DESIGN.md §5). This index
-- holds only those, per run, so finding them costs the same at step 1,000
-- as at step 1. Its condition is the one the query uses, word for word
-- (src/store/sql.rs, unsettled_sql!).
CREATE INDEX saga_log_open_by_run ON saga_log (run_id, step_idx)
    WHERE status IN ('INTENDED', 'UNKNOWN', 'AWAITING_APPROVAL');
