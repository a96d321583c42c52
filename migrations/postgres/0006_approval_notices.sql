-- A message that tells people an approval is waiting (a Slack post), kept
-- like a step: the row and its key are written before the post, so a
-- retry after a crash or a timeout looks the key up instead of posting
-- twice. `shown` is the digest of the message as last posted or updated;
-- `done` is set once it shows the approval's final outcome.
CREATE TABLE approval_notices (
    approval_id     BIGINT NOT NULL REFERENCES approvals (id),
    place           TEXT NOT NULL,
    run_id          TEXT NOT NULL REFERENCES runs (id),
    idempotency_key TEXT NOT NULL UNIQUE,
    channel         TEXT NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('intended', 'posted', 'unknown', 'failed')),
    message_ref     TEXT,
    shown           TEXT,
    done            BOOLEAN NOT NULL DEFAULT false,
    error           TEXT,
    created_at      TIMESTAMPTZ NOT NULL,
    updated_at      TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (approval_id, place)
);
CREATE INDEX approval_notices_open ON approval_notices (done);

-- Signed requests from Slack already acted on: the same signature again is
-- a replay. Rows older than the signature's window are forgotten.
CREATE TABLE slack_requests (
    signature TEXT PRIMARY KEY,
    seen_at   TIMESTAMPTZ NOT NULL
);
CREATE INDEX slack_requests_by_age ON slack_requests (seen_at);

-- The two-person rule: how many different people must approve, and who
-- approved first while it waits for the second.
ALTER TABLE approvals ADD COLUMN approvers_needed BIGINT NOT NULL DEFAULT 1;
ALTER TABLE approvals ADD COLUMN first_approver TEXT;
ALTER TABLE approvals ADD COLUMN first_approved_at TIMESTAMPTZ;
