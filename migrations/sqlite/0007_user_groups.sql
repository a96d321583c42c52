-- The groups a local account is in (a JSON array of names), set with
-- `saga-harness user group add|remove`: a tool's `approvers` name groups,
-- and people signed in through the identity provider bring theirs.
ALTER TABLE users ADD COLUMN member_of TEXT NOT NULL DEFAULT '[]';
