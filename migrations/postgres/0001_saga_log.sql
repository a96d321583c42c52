-- The saga log and everything around it (DESIGN.md §3).
-- Ids are UUID text so both backends hold the same values; JSON columns are JSONB;
-- timestamps are TIMESTAMPTZ.

CREATE TABLE runs (
    id                        TEXT PRIMARY KEY NOT NULL,
    agent                     TEXT NOT NULL,
    -- The client's own name for the run: idempotent creation per agent.
    label                     TEXT,
    purpose                   TEXT NOT NULL DEFAULT '',
    status                    TEXT NOT NULL,
    -- Where a NEEDS_ATTENTION run goes back to once every question is answered.
    resume_to                 TEXT,
    next_step                 BIGINT NOT NULL DEFAULT 0 CHECK (next_step >= 0),
    pivot_approval_id         BIGINT,
    irreversible_before_pivot BIGINT NOT NULL DEFAULT 0,
    created_at                TIMESTAMPTZ NOT NULL,
    updated_at                TIMESTAMPTZ NOT NULL,
    UNIQUE (agent, label)
);
CREATE INDEX runs_by_status ON runs (status, created_at);

-- One row per non-pure step, committed as INTENDED before the call (R2).
CREATE TABLE saga_log (
    run_id                TEXT NOT NULL REFERENCES runs (id),
    step_idx              BIGINT NOT NULL CHECK (step_idx >= 0),
    tool                  TEXT NOT NULL,
    tool_class            TEXT NOT NULL CHECK (tool_class IN ('reversible', 'compensatable', 'irreversible')),
    idempotency_key       TEXT NOT NULL UNIQUE,
    args                  JSONB NOT NULL,
    status                TEXT NOT NULL,
    external_ref          TEXT,
    -- The undo, compensation or correction, written before the call (R6).
    compensation          JSONB,
    audience              TEXT NOT NULL,
    result                JSONB,
    error                 TEXT,
    phase                 TEXT NOT NULL CHECK (phase IN ('before_pivot', 'after_pivot')),
    approved_individually BOOLEAN NOT NULL DEFAULT FALSE,
    created_at            TIMESTAMPTZ NOT NULL,
    updated_at            TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (run_id, step_idx)
);
CREATE INDEX saga_log_unsettled ON saga_log (status) WHERE status IN ('INTENDED', 'UNKNOWN');

-- One intent row per compensation call, with its own key (R8).
CREATE TABLE compensations (
    run_id          TEXT NOT NULL,
    step_idx        BIGINT NOT NULL,
    tool            TEXT NOT NULL,
    idempotency_key TEXT NOT NULL UNIQUE,
    args            JSONB NOT NULL,
    status          TEXT NOT NULL,
    external_ref    TEXT,
    result          JSONB,
    error           TEXT,
    created_at      TIMESTAMPTZ NOT NULL,
    updated_at      TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (run_id, step_idx),
    FOREIGN KEY (run_id, step_idx) REFERENCES saga_log (run_id, step_idx)
);

-- Pivot and single-step approval requests.
CREATE TABLE approvals (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id      TEXT NOT NULL REFERENCES runs (id),
    kind        TEXT NOT NULL CHECK (kind IN ('pivot', 'step')),
    step_idx    BIGINT,
    summary     TEXT NOT NULL,
    plan        JSONB NOT NULL,
    digest      TEXT NOT NULL,
    status      TEXT NOT NULL,
    expires_at  TIMESTAMPTZ,
    decided_by  TEXT,
    decided_at  TIMESTAMPTZ,
    note        TEXT,
    created_at  TIMESTAMPTZ NOT NULL
);
CREATE INDEX approvals_pending ON approvals (status, created_at);
CREATE INDEX approvals_by_run ON approvals (run_id);

-- Customer-facing corrections, ranked by blast radius (R10).
CREATE TABLE corrections (
    id              BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id          TEXT NOT NULL REFERENCES runs (id),
    step_idx        BIGINT NOT NULL,
    source          TEXT NOT NULL CHECK (source IN ('step', 'compensation')),
    tool            TEXT NOT NULL,
    audience        TEXT NOT NULL,
    rank            BIGINT NOT NULL,
    template        TEXT NOT NULL,
    recipients      JSONB NOT NULL,
    message         TEXT NOT NULL,
    status          TEXT NOT NULL,
    idempotency_key TEXT NOT NULL UNIQUE,
    send_status     TEXT,
    external_ref    TEXT,
    decided_by      TEXT,
    decided_at      TIMESTAMPTZ,
    dismiss_reason  TEXT,
    created_at      TIMESTAMPTZ NOT NULL,
    updated_at      TIMESTAMPTZ NOT NULL,
    UNIQUE (run_id, step_idx, source)
);
CREATE INDEX corrections_queue ON corrections (status, rank);

-- Append-only audit trail of every transition.
CREATE TABLE events (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id      TEXT,
    entity      TEXT NOT NULL,
    entity_id   BIGINT,
    actor       TEXT NOT NULL,
    from_status TEXT,
    to_status   TEXT,
    detail      TEXT,
    at          TIMESTAMPTZ NOT NULL
);
CREATE INDEX events_by_run ON events (run_id, id);

-- Support leads who sign in to the dashboard.
CREATE TABLE users (
    id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    username      TEXT NOT NULL UNIQUE,
    password_hash TEXT NOT NULL,
    role          TEXT NOT NULL CHECK (role IN ('viewer', 'approver', 'admin')),
    created_at    TIMESTAMPTZ NOT NULL
);

-- Bearer tokens for agents; only their SHA-256 is kept.
CREATE TABLE api_tokens (
    id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    agent      TEXT NOT NULL,
    token_hash TEXT NOT NULL UNIQUE,
    label      TEXT,
    created_at TIMESTAMPTZ NOT NULL,
    revoked_at TIMESTAMPTZ
);
