-- The outcomes of a group of step writes (src/store/postgres/step_writes.rs);
-- $1 is their records, $2 'off' for a lazy commit. Also sent by
-- benches/postgres/probe.sh.
WITH commit_mode AS (
    SELECT set_config('synchronous_commit',
        COALESCE($2, current_setting('synchronous_commit')), true) AS mode
), outcome AS (
    SELECT * FROM jsonb_to_recordset($1::jsonb) AS o(run_id text, step_idx int8,
        from_status text, to_status text, external_ref text, result text, error text,
        at timestamptz, actor text, detail text, release text)
), settled AS (
    UPDATE saga_log SET status = outcome.to_status,
        external_ref = COALESCE(outcome.external_ref, saga_log.external_ref),
        result = COALESCE(outcome.result::jsonb, saga_log.result),
        error = COALESCE(outcome.error, saga_log.error), updated_at = outcome.at
    FROM outcome
    WHERE saga_log.run_id = ANY (ARRAY(SELECT run_id FROM outcome))
        AND saga_log.step_idx = ANY (ARRAY(SELECT step_idx FROM outcome))
        AND saga_log.run_id = outcome.run_id AND saga_log.step_idx = outcome.step_idx
        AND saga_log.status = outcome.from_status
        AND (SELECT mode FROM commit_mode) IS NOT NULL
    RETURNING saga_log.*
), logged AS (
    INSERT INTO events (run_id, entity, entity_id, actor, from_status, to_status,
        detail, at)
    SELECT settled.run_id, 'step', settled.step_idx, outcome.actor, outcome.from_status,
        settled.status, outcome.detail, outcome.at
    FROM settled JOIN outcome
        ON outcome.run_id = settled.run_id AND outcome.step_idx = settled.step_idx
), released AS (
    UPDATE runs SET lease_owner = NULL, lease_until = NULL
    FROM settled JOIN outcome
        ON outcome.run_id = settled.run_id AND outcome.step_idx = settled.step_idx
    WHERE runs.id = settled.run_id AND outcome.release IS NOT NULL
        AND runs.lease_owner = outcome.release
)
SELECT * FROM settled
