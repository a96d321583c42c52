-- The intents of a group of step writes (src/store/postgres/step_writes.rs);
-- $1 is their records. Also sent by benches/postgres/probe.sh.
WITH intent AS (
    SELECT * FROM jsonb_to_recordset($1::jsonb) AS i(run_id text, step_idx int8, tool text,
        tool_class text, idempotency_key text, args text, status text, compensation text,
        audience text, phase text, at timestamptz, irreversible int8, actor text,
        detail text, agent text, token text, lease_owner text, lease_ms float8,
        handover text[])
), advanced AS (
    UPDATE runs SET next_step = runs.next_step + 1,
        irreversible_before_pivot = runs.irreversible_before_pivot + intent.irreversible,
        updated_at = intent.at, lease_owner = intent.lease_owner,
        lease_until = clock_timestamp() + intent.lease_ms * interval '1 millisecond'
    FROM intent
    WHERE runs.id = ANY (ARRAY(SELECT run_id FROM intent))
        AND runs.id = intent.run_id AND runs.next_step = intent.step_idx
        AND runs.agent = intent.agent AND runs.status = 'RUNNING'
        AND (runs.lease_owner IS NULL OR runs.lease_until < clock_timestamp()
            OR runs.lease_owner = ANY(intent.handover))
        AND (intent.token IS NULL OR EXISTS (SELECT 1 FROM api_tokens
            WHERE api_tokens.token_hash = intent.token AND api_tokens.agent = intent.agent
                AND api_tokens.revoked_at IS NULL))
        AND NOT EXISTS (SELECT 1 FROM saga_log
            WHERE saga_log.run_id = intent.run_id AND saga_log.status IN ('INTENDED', 'UNKNOWN', 'AWAITING_APPROVAL'))
        AND NOT EXISTS (SELECT 1 FROM saga_log
            WHERE saga_log.run_id = intent.run_id AND saga_log.owed_to_agent)
    RETURNING runs.id
), inserted AS (
    INSERT INTO saga_log (run_id, step_idx, tool, tool_class, idempotency_key, args,
        status, compensation, audience, phase, approved_individually, created_at,
        updated_at)
    SELECT intent.run_id, intent.step_idx, intent.tool, intent.tool_class,
        intent.idempotency_key, intent.args::jsonb, intent.status,
        intent.compensation::jsonb, intent.audience, intent.phase, FALSE, intent.at,
        intent.at
    FROM intent JOIN advanced ON advanced.id = intent.run_id
    RETURNING *
), logged AS (
    INSERT INTO events (run_id, entity, entity_id, actor, from_status, to_status,
        detail, at)
    SELECT inserted.run_id, 'step', inserted.step_idx, intent.actor, NULL,
        inserted.status, intent.detail, intent.at
    FROM inserted JOIN intent ON intent.run_id = inserted.run_id
)
SELECT * FROM inserted
