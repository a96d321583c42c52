-- Usernames are case-insensitive: `Dana` and `dana` are one person, and a
-- second one cannot be created beside the first.
CREATE UNIQUE INDEX users_username_folded ON users (lower(username));

-- The audit page shows people's decisions newest first, a page at a time,
-- however many events agents write: this index holds only people's. Its
-- condition is the one the query uses, word for word (src/store/sql.rs).
CREATE INDEX events_by_people ON events (id) WHERE actor LIKE 'user:%';
