-- The seed's own account/token schema (/work/shared/seeds/mailroom_accounts.txt: its tables and
-- triggers as published), in schema `seed`: the reference the account-insert benchmark compares
-- mailroom.create_account with, in the same cluster and run, and the schema the seed's C collector
-- (bench/c_collector/collector.c) dequeues from: its jobs cursor and its recommended indexes.
-- Not part of mailroom.
DROP SCHEMA IF EXISTS seed CASCADE;
CREATE SCHEMA seed;
SET search_path = seed, public;

CREATE TYPE account_status AS ENUM ('provisioned', 'active', 'suspended');

CREATE TABLE accounts (
    id BIGSERIAL PRIMARY KEY,
    email VARCHAR(254) UNIQUE NOT NULL,
    status ACCOUNT_STATUS DEFAULT 'provisioned' NOT NULL,
    login VARCHAR(254) UNIQUE NOT NULL,
    created_at INTEGER DEFAULT extract(EPOCH FROM now()) NOT NULL,
    status_changed_at INTEGER,
    activated_at INTEGER,
    suspended_at INTEGER,
    unsuspended_at INTEGER
);

CREATE TYPE token_action AS ENUM ('activation', 'password_recovery');

CREATE TABLE tokens (
    id BIGSERIAL PRIMARY KEY,
    action TOKEN_ACTION NOT NULL,
    secret BYTEA DEFAULT gen_random_bytes(32) UNIQUE NOT NULL,
    code VARCHAR(5) DEFAULT lpad(to_char(random() * 100000, 'FM00000'), 5, '0'),
    account BIGINT NOT NULL,
    expires_at INTEGER DEFAULT extract(EPOCH FROM now() + INTERVAL '15 minute') NOT NULL,
    consumed_at INTEGER,
    created_at INTEGER DEFAULT extract(EPOCH FROM now()) NOT NULL,
    FOREIGN KEY (account) REFERENCES accounts (id) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED
);

-- the article's "Index Recommendations" for the dequeue query
CREATE INDEX accounts_id_status_idx ON accounts (id, status);

CREATE INDEX tokens_id_expires_consumed_action_idx ON tokens (id, expires_at, consumed_at, action);

-- the "poor man's job queue": the collector's cursor, advanced by its dequeue CTE
CREATE TYPE job_type AS ENUM ('mailroom');

CREATE TABLE jobs (
    job_type JOB_TYPE PRIMARY KEY,
    last_seq BIGINT
);

INSERT INTO jobs (last_seq, job_type) VALUES (0, 'mailroom');

CREATE OR REPLACE FUNCTION trg_before_account_insert()
RETURNS TRIGGER AS $$
BEGIN
    IF (NEW.status = 'provisioned') THEN
        INSERT INTO tokens (account, action) VALUES (NEW.id, 'activation');
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER before_account_insert
BEFORE INSERT ON accounts
FOR EACH ROW
EXECUTE FUNCTION trg_before_account_insert();

CREATE OR REPLACE FUNCTION trg_after_token_inserted()
RETURNS TRIGGER
LANGUAGE plpgsql
AS $$
BEGIN
    NOTIFY token_insert;
    RETURN NULL;
END;
$$;

CREATE TRIGGER after_token_inserted
AFTER INSERT ON tokens
FOR EACH ROW
EXECUTE FUNCTION trg_after_token_inserted();
