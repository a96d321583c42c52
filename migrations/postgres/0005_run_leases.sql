-- Work on a run is serialised across harness instances by a lease in the
-- run's row, not by a lock held on a connection: the holder's token, and
-- the database time the lease ends. Nothing is held while a tool call
-- waits on its system; a holder that dies stops renewing, and once the
-- lease is over another instance takes the run and reconciles what was in
-- flight (R7). Works behind a transaction-pooling PgBouncer, which session
-- advisory locks do not survive.
ALTER TABLE runs ADD COLUMN lease_owner TEXT;
ALTER TABLE runs ADD COLUMN lease_until TIMESTAMPTZ;
