-- Every table that holds rows about a run can find them by run: the run
-- page reads a run's corrections, and the pruner reads and removes a page
-- of runs at a time. Without these, each of those reads, and each check of
-- a removed run's references, scans the whole table.
CREATE INDEX corrections_by_run ON corrections (run_id);
CREATE INDEX approval_notices_by_run ON approval_notices (run_id);
