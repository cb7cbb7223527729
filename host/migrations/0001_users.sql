-- Users, in creation order. `seq` comes from the identity column's sequence, never from a clock,
-- so the order is the same whichever replica (or machine clock) created a user.
CREATE TABLE users (
    seq       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id        uuid   NOT NULL CONSTRAINT users_id_unique UNIQUE,
    name      text   NOT NULL,
    email     text   NOT NULL,
    -- The address case-folded by the host (Unicode lower case, whatever the database's locale):
    -- duplicates in any letter case are refused here, across every replica.
    email_key text   NOT NULL CONSTRAINT users_email_key_unique UNIQUE
);

-- The store's cap, split into shards so that concurrent creations do not all queue on one row.
-- A creation takes one unit of a shard's quota in the same statement that inserts the user, so
-- `sum(used)` is the number of users (a cheap count for /metrics) and never exceeds the quotas,
-- whose sum the hosts set to `--max-users` at start.
CREATE TABLE user_slots (
    shard smallint PRIMARY KEY,
    quota bigint   NOT NULL,
    used  bigint   NOT NULL DEFAULT 0
);
INSERT INTO user_slots (shard, quota) SELECT shard, 0 FROM generate_series(0, 15) AS shard;
