-- The distributed layout of mailroom on a Citus coordinator (docs/scale.md), applied by
-- `mailroom db migrate` after migrations/ and sql/ when the database is a coordinator with
-- workers. Idempotent: a table already placed is left alone, so every migrate re-applies it and
-- a table a new migration adds is placed here (an unplaced table fails the check at the end).
--
-- Three kinds of tables:
-- - distributed, by the key their queries route by: messages by mailbox_id; outbound_messages
--   by lane (a lane is a shard group: the claim takes work from one lane at a time, sql/citus/20).
-- - reference (a copy on every node, written in two phases): the small read-mostly tables that
--   distributed rows point at or that functions pushed to the workers read (plans, settings,
--   senders, the vocabularies, the keys).
-- - local to the coordinator (in Citus' metadata, so they join with the others): what is written
--   on hot paths or locked by one caller at a time (domain state, heartbeats, counters, job locks),
--   and, in this release, mailboxes (docs/scale.md says why and what distributing them needs).
--   accounts (by id) and tokens (by account) are distributed, colocated (below; sql/citus/12).

-- outbound_messages' row triggers redact error_log in the row being written (the pepper is a
-- reference table, on every node): they run on the shard, touch nothing else, and are safe.
SELECT set_config('citus.enable_unsafe_triggers', 'on', true);

-- the statement trigger that tells `mailroom expire` a sooner inbox was created reads its
-- transition table, which Citus cannot plan on a table in its metadata: on Citus, expire
-- re-reads its schedule at each heartbeat instead (docs/scale.md)
DROP TRIGGER IF EXISTS after_mailboxes_inserted ON mailroom.mailboxes;
-- a message's mailbox and the messages of deleted mailboxes are kept by triggers on a single node
-- (sql/23_expiry.sql); messages live on the workers and mailboxes on the coordinator, so neither
-- trigger can run there: deliveries check the mailbox in the guard, purge deletes the messages itself
DROP TRIGGER IF EXISTS before_message_insert ON mailroom.messages;
DROP TRIGGER IF EXISTS after_mailboxes_deleted ON mailroom.mailboxes;

DO $distribute$
DECLARE
    v_table text;
    v_lanes integer;
BEGIN
    -- foreign keys between tables that change kind go first, and come back once both are placed
    IF NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_dist_partition AS p WHERE p.logicalrelid = 'mailroom.messages'::regclass
    ) THEN
        ALTER TABLE mailroom.messages DROP CONSTRAINT IF EXISTS messages_mailbox_id_fkey;
        ALTER TABLE mailroom.outbound_messages DROP CONSTRAINT outbound_messages_sender_id_fkey;
    END IF;

    -- reference tables, parents before children (a foreign key from a reference table points at one)
    FOREACH v_table IN ARRAY ARRAY[
        'settings', 'plans', 'error_codes', 'token_actions', 'token_email_templates', 'senders',
        'redaction_pepper', 'verp_key', 'signing_keys', 'sender_keys', 'domain_limits',
        'suppressions', 'catchall_domains', 'api_keys', 'outbound_lanes', 'dkim_keys', 'spent_signatures'
    ] LOOP
        IF NOT EXISTS (
            SELECT 1 FROM pg_catalog.pg_dist_partition AS p
            WHERE p.logicalrelid = format('mailroom.%I', v_table)::regclass
        ) THEN
            PERFORM create_reference_table(format('mailroom.%I', v_table));
        END IF;
    END LOOP;

    -- messages: by mailbox, the bulk of the data (raw mail). mailboxes stay on the coordinator
    -- (below): their address is unique and a mailbox is created with ON CONFLICT on it, which a
    -- table distributed by id cannot enforce (docs/scale.md). A unique key must hold the
    -- distribution column: messages' key is (mailbox_id, id, received_at); the foreign key to
    -- mailboxes cannot cross to the coordinator, so purge_mailboxes deletes the messages itself
    -- on Citus (sql/citus/20).
    IF NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_dist_partition AS p WHERE p.logicalrelid = 'mailroom.messages'::regclass
    ) THEN
        ALTER TABLE mailroom.messages DROP CONSTRAINT messages_pkey;
        ALTER TABLE mailroom.messages ADD CONSTRAINT messages_pkey PRIMARY KEY (mailbox_id, id, received_at);
        PERFORM create_distributed_table('mailroom.messages', 'mailbox_id', colocate_with => 'none');
    END IF;

    -- outbound_messages: by lane. Each lane value is chosen to fall in its own shard
    -- (outbound_lanes, filled below), and a message gets a lane at random when it is queued.
    IF NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_dist_partition AS p WHERE p.logicalrelid = 'mailroom.outbound_messages'::regclass
    ) THEN
        -- rows queued before (an installation moved to Citus) take lane 0, the first lane of all
        ALTER TABLE mailroom.outbound_messages ADD COLUMN lane integer NOT NULL DEFAULT 0;
        ALTER TABLE mailroom.outbound_messages ALTER COLUMN lane SET DEFAULT mailroom._outbound_lane();
        ALTER TABLE mailroom.outbound_messages DROP CONSTRAINT outbound_messages_pkey;
        ALTER TABLE mailroom.outbound_messages ADD CONSTRAINT outbound_messages_pkey PRIMARY KEY (id, created_at, lane);
        PERFORM create_distributed_table('mailroom.outbound_messages', 'lane', colocate_with => 'none');
        -- one lane per shard: the smallest non-negative integer that hashes into it
        v_lanes := (SELECT count(*) FROM pg_catalog.pg_dist_shard AS s
                    WHERE s.logicalrelid = 'mailroom.outbound_messages'::regclass);
        INSERT INTO mailroom.outbound_lanes (lane)
        SELECT min(g.v)
        FROM generate_series(0, 100 * v_lanes) AS g (v)
        GROUP BY get_shard_id_for_distribution_column('mailroom.outbound_messages', g.v);
        ALTER TABLE mailroom.outbound_messages ADD CONSTRAINT outbound_messages_sender_id_fkey
        FOREIGN KEY (sender_id) REFERENCES mailroom.senders (id);
    END IF;

    -- accounts by id and tokens by account, colocated (issue 26): an account's tokens are on its
    -- shard, so every statement on one account (create_account, consume_token, a reissue) is
    -- single-shard and the token's foreign key stays. A unique key must hold the distribution
    -- column: tokens' primary key becomes (account, id, created_at); login and lower(email) are
    -- kept unique by the lookup tables account_logins and account_emails (sql/citus/12), distributed
    -- by those keys. tokens cannot be a citus local table (docs/scale.md, Limits), it can be distributed.
    IF NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_dist_partition AS p WHERE p.logicalrelid = 'mailroom.accounts'::regclass
    ) THEN
        ALTER TABLE mailroom.tokens DROP CONSTRAINT IF EXISTS tokens_account_fkey;
        ALTER TABLE mailroom.accounts DROP CONSTRAINT IF EXISTS accounts_login_key;
        DROP INDEX IF EXISTS mailroom.accounts_email_lower_key;
        PERFORM create_distributed_table('mailroom.accounts', 'id', colocate_with => 'none');
        ALTER TABLE mailroom.tokens DROP CONSTRAINT tokens_pkey;
        ALTER TABLE mailroom.tokens ADD CONSTRAINT tokens_pkey PRIMARY KEY (account, id, created_at);
        PERFORM create_distributed_table('mailroom.tokens', 'account', colocate_with => 'mailroom.accounts');
        ALTER TABLE mailroom.tokens ADD CONSTRAINT tokens_account_fkey FOREIGN KEY (account)
        REFERENCES mailroom.accounts (id) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED;
    END IF;

    -- everything else stays on the coordinator, in Citus' metadata
    FOR v_table IN
        SELECT c.relname
        FROM pg_catalog.pg_class AS c
        WHERE
            c.relnamespace = 'mailroom'::regnamespace
            AND c.relkind IN ('r', 'p')
            AND NOT c.relispartition
            AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition AS p WHERE p.logicalrelid = c.oid)
        ORDER BY c.relname
    LOOP
        PERFORM citus_add_local_table_to_metadata(format('mailroom.%I', v_table), cascade_via_foreign_keys => true);
    END LOOP;
END;
$distribute$;
