-- The saga log and everything around it (DESIGN.md §3).
-- Ids are UUID text so both backends hold the same values; JSON columns are
-- TEXT holding JSON; timestamps are RFC 3339 text in UTC.

CREATE TABLE runs (
    id                        TEXT PRIMARY KEY NOT NULL,
    agent                     TEXT NOT NULL,
    -- The client's own name for the run: idempotent creation per agent.
    label                     TEXT,
    purpose                   TEXT NOT NULL DEFAULT '',
    status                    TEXT NOT NULL,
    -- Where a NEEDS_ATTENTION run goes back to once every question is answered.
    resume_to                 TEXT,
    next_step                 INTEGER NOT NULL DEFAULT 0 CHECK (next_step >= 0),
    pivot_approval_id         INTEGER,
    irreversible_before_pivot INTEGER NOT NULL DEFAULT 0,
    created_at                TEXT NOT NULL,
    updated_at                TEXT NOT NULL,
    UNIQUE (agent, label)
);
CREATE INDEX runs_by_status ON runs (status, created_at);

-- One row per non-pure step, committed as INTENDED before the call (R2).
CREATE TABLE saga_log (
    run_id                TEXT NOT NULL REFERENCES runs (id),
    step_idx              INTEGER NOT NULL CHECK (step_idx >= 0),
    tool                  TEXT NOT NULL,
    tool_class            TEXT NOT NULL CHECK (tool_class IN ('reversible', 'compensatable', 'irreversible')),
    idempotency_key       TEXT NOT NULL UNIQUE,
    args                  TEXT NOT NULL,
    status                TEXT NOT NULL,
    external_ref          TEXT,
    -- The undo, compensation or correction, written before the call (R6).
    compensation          TEXT,
    audience              TEXT NOT NULL,
    result                TEXT,
    error                 TEXT,
    phase                 TEXT NOT NULL CHECK (phase IN ('before_pivot', 'after_pivot')),
    approved_individually INTEGER NOT NULL DEFAULT 0,
    created_at            TEXT NOT NULL,
    updated_at            TEXT NOT NULL,
    PRIMARY KEY (run_id, step_idx)
);
CREATE INDEX saga_log_unsettled ON saga_log (status) WHERE status IN ('INTENDED', 'UNKNOWN');

-- One intent row per compensation call, with its own key (R8).
CREATE TABLE compensations (
    run_id          TEXT NOT NULL,
    step_idx        INTEGER NOT NULL,
    tool            TEXT NOT NULL,
    idempotency_key TEXT NOT NULL UNIQUE,
    args            TEXT NOT NULL,
    status          TEXT NOT NULL,
    external_ref    TEXT,
    result          TEXT,
    error           TEXT,
    created_at      TEXT NOT NULL,
    updated_at      TEXT NOT NULL,
    PRIMARY KEY (run_id, step_idx),
    FOREIGN KEY (run_id, step_idx) REFERENCES saga_log (run_id, step_idx)
);

-- Pivot and single-step approval requests.
CREATE TABLE approvals (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id      TEXT NOT NULL REFERENCES runs (id),
    kind        TEXT NOT NULL CHECK (kind IN ('pivot', 'step')),
    step_idx    INTEGER,
    summary     TEXT NOT NULL,
    plan        TEXT NOT NULL,
    digest      TEXT NOT NULL,
    status      TEXT NOT NULL,
    expires_at  TEXT,
    decided_by  TEXT,
    decided_at  TEXT,
    note        TEXT,
    created_at  TEXT NOT NULL
);
CREATE INDEX approvals_pending ON approvals (status, created_at);
CREATE INDEX approvals_by_run ON approvals (run_id);

-- Customer-facing corrections, ranked by blast radius (R10).
CREATE TABLE corrections (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id          TEXT NOT NULL REFERENCES runs (id),
    step_idx        INTEGER NOT NULL,
    source          TEXT NOT NULL CHECK (source IN ('step', 'compensation')),
    tool            TEXT NOT NULL,
    audience        TEXT NOT NULL,
    rank            INTEGER NOT NULL,
    template        TEXT NOT NULL,
    recipients      TEXT NOT NULL,
    message         TEXT NOT NULL,
    status          TEXT NOT NULL,
    idempotency_key TEXT NOT NULL UNIQUE,
    send_status     TEXT,
    external_ref    TEXT,
    decided_by      TEXT,
    decided_at      TEXT,
    dismiss_reason  TEXT,
    created_at      TEXT NOT NULL,
    updated_at      TEXT NOT NULL,
    UNIQUE (run_id, step_idx, source)
);
CREATE INDEX corrections_queue ON corrections (status, rank);

-- Append-only audit trail of every transition.
CREATE TABLE events (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id      TEXT,
    entity      TEXT NOT NULL,
    entity_id   INTEGER,
    actor       TEXT NOT NULL,
    from_status TEXT,
    to_status   TEXT,
    detail      TEXT,
    at          TEXT NOT NULL
);
CREATE INDEX events_by_run ON events (run_id, id);

-- Support leads who sign in to the dashboard.
CREATE TABLE users (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    username      TEXT NOT NULL UNIQUE,
    password_hash TEXT NOT NULL,
    role          TEXT NOT NULL CHECK (role IN ('viewer', 'approver', 'admin')),
    created_at    TEXT NOT NULL
);

-- Bearer tokens for agents; only their SHA-256 is kept.
CREATE TABLE api_tokens (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    agent      TEXT NOT NULL,
    token_hash TEXT NOT NULL UNIQUE,
    label      TEXT,
    created_at TEXT NOT NULL,
    revoked_at TEXT
);
