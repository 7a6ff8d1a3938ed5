-- The distributed layout of mailroom on a Citus coordinator (docs/scale.md), applied by
-- `mailroom db migrate` after migrations/ and sql/ when the database is a coordinator with
-- workers. Idempotent: a table already placed is left alone, so every migrate re-applies it and
-- a table a new migration adds is placed here (an unplaced table fails the check at the end).
--
-- Three kinds of tables:
-- - distributed, by the key their queries route by: mailboxes by id and messages by mailbox_id,
--   colocated (sql/citus/30 keeps addresses unique in mailbox_addresses, by address); accounts
--   by id and tokens by account, colocated (sql/citus/12: account_logins, account_emails);
--   outbound_messages by lane (a lane is a shard group: the claim takes one lane at a time,
--   sql/citus/20).
-- - reference (a copy on every node, written in two phases): the small read-mostly tables that
--   distributed rows point at or that functions pushed to the workers read (plans, settings,
--   senders, the vocabularies, the keys).
-- - local to the coordinator (in Citus' metadata, so they join with the others): what is written
--   on hot paths or locked by one caller at a time (domain state, heartbeats, counters, job locks).

-- outbound_messages' row triggers redact error_log in the row being written (the pepper is a
-- reference table, on every node): they run on the shard, touch nothing else, and are safe.
SELECT set_config('citus.enable_unsafe_triggers', 'on', true);

-- the statement trigger that tells `mailroom expire` a sooner inbox was created reads its
-- transition table, which Citus cannot plan on a table in its metadata: on Citus, expire
-- re-reads its schedule at each heartbeat instead (docs/scale.md)
DROP TRIGGER IF EXISTS after_mailboxes_inserted ON mailroom.mailboxes;
-- a message's mailbox and the messages of deleted mailboxes are kept by triggers on a single node
-- (sql/23_expiry.sql); they would query a distributed table from a shard, so neither runs on
-- Citus: deliveries check the mailbox in the guard, purge deletes the messages itself
DROP TRIGGER IF EXISTS before_message_insert ON mailroom.messages;
DROP TRIGGER IF EXISTS after_mailboxes_deleted ON mailroom.mailboxes;
-- inbox.expired webhooks (sql/38_outbound_webhooks.sql) are queued by a row trigger that writes
-- outbound_messages, another distributed table: not from a shard; on Citus the expiry's seam
-- queues them (sql/citus/30_mailboxes.sql, docs/webhooks.md)
DROP TRIGGER IF EXISTS after_mailboxes_expired ON mailroom.mailboxes;

DO $distribute$
DECLARE
    v_table text;
    v_lanes integer;
    v_next bigint;
    v_propagate text;
BEGIN
    -- foreign keys between tables that change kind go first, and come back once both are placed
    IF NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_dist_partition AS p WHERE p.logicalrelid = 'mailroom.messages'::regclass
    ) THEN
        ALTER TABLE mailroom.messages DROP CONSTRAINT IF EXISTS messages_mailbox_id_fkey;
        ALTER TABLE mailroom.outbound_messages DROP CONSTRAINT outbound_messages_sender_id_fkey;
    END IF;
    -- mailboxes' to plans: with it, making plans a reference table would add mailboxes to Citus'
    -- metadata as a local table, which Citus cannot convert to a distributed one (identity
    -- column)
    IF EXISTS (
        SELECT 1 FROM pg_catalog.pg_dist_partition AS p
        WHERE p.logicalrelid = 'mailroom.mailboxes'::regclass AND p.partmethod = 'n'
    ) THEN
        -- an installation of the earlier layout: mailboxes is a Citus local table (added for that
        -- key). Citus takes no table with an identity column out of its metadata, and refuses
        -- DROP IDENTITY on one of its tables unless the DDL is not propagated (a local table has
        -- nothing on the workers): so the identity goes (its next value kept), then the key, which
        -- takes the table out of the metadata (Citus does so by itself for a table it added for a
        -- foreign key alone; undistribute_table otherwise), and the identity comes back on the
        -- plain table, which is distributed below as on a first install. Citus re-creates the
        -- table and drops the functions typed by its row (`mailroom db migrate` applies sql/ again
        -- after this file when it found this layout: mailroom.db.migrate).
        v_next := coalesce(greatest(
            pg_catalog.pg_sequence_last_value(pg_catalog.pg_get_serial_sequence('mailroom.mailboxes', 'id')::regclass),
            (SELECT max(m.id) FROM mailroom.mailboxes AS m)
        ), 0) + 1;
        v_propagate := current_setting('citus.enable_ddl_propagation');
        PERFORM set_config('citus.enable_ddl_propagation', 'off', true);
        ALTER TABLE mailroom.mailboxes ALTER COLUMN id DROP IDENTITY;
        PERFORM set_config('citus.enable_ddl_propagation', v_propagate, true);
        ALTER TABLE mailroom.mailboxes DROP CONSTRAINT IF EXISTS mailboxes_plan_fkey;
        IF EXISTS (
            SELECT 1 FROM pg_catalog.pg_dist_partition AS p WHERE p.logicalrelid = 'mailroom.mailboxes'::regclass
        ) THEN
            PERFORM undistribute_table('mailroom.mailboxes', cascade_via_foreign_keys => true);
        END IF;
        EXECUTE format(
            'ALTER TABLE mailroom.mailboxes ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (START WITH %s)', v_next
        );
    ELSIF NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_dist_partition AS p
        WHERE p.logicalrelid = 'mailroom.mailboxes'::regclass AND p.partmethod = 'h'
    ) THEN
        ALTER TABLE mailroom.mailboxes DROP CONSTRAINT IF EXISTS mailboxes_plan_fkey;
    END IF;

    -- api_key_senders joins api_keys into the foreign-key graph of senders, which outbound_messages
    -- (distributed) points at: Citus then refuses to modify api_keys in a transaction that already ran
    -- a parallel multi-shard statement (erasure deletes messages, then renames owners in api_keys).
    -- Keys are revoked, never deleted, so the cascade this key gives is never needed here; the grant's
    -- functions check the key themselves (sql/32_outbound_send.sql)
    ALTER TABLE mailroom.api_key_senders DROP CONSTRAINT IF EXISTS api_key_senders_key_id_fkey;
    -- the same for a key's webhook endpoints (they point at senders too); an endpoint of a revoked key
    -- is refused where it is used (sql/38_outbound_webhooks.sql)
    ALTER TABLE mailroom.webhook_endpoints DROP CONSTRAINT IF EXISTS webhook_endpoints_key_id_fkey;
    -- reference tables, parents before children (a foreign key from a reference table points at one)
    FOREACH v_table IN ARRAY ARRAY[
        'settings', 'plans', 'error_codes', 'token_actions', 'token_email_templates', 'senders',
        'redaction_pepper', 'verp_key', 'signing_keys', 'sender_keys', 'domain_limits',
        'suppressions', 'catchall_domains', 'api_keys', 'outbound_lanes', 'dkim_keys', 'spent_signatures',
        'smtp_credentials', 'api_key_senders', 'webhook_endpoints'
    ] LOOP
        IF NOT EXISTS (
            SELECT 1 FROM pg_catalog.pg_dist_partition AS p
            WHERE p.logicalrelid = format('mailroom.%I', v_table)::regclass
        ) THEN
            PERFORM create_reference_table(format('mailroom.%I', v_table));
        END IF;
    END LOOP;

    -- messages: by mailbox, the bulk of the data (raw mail). A unique key must hold the
    -- distribution column: messages' key is (mailbox_id, id, received_at). No foreign key to
    -- mailboxes (migration 0181: triggers keep it on one node, dropped above): purge deletes a
    -- mailbox's messages itself on Citus (sql/citus/30).
    IF NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_dist_partition AS p WHERE p.logicalrelid = 'mailroom.messages'::regclass
    ) THEN
        ALTER TABLE mailroom.messages DROP CONSTRAINT messages_pkey;
        ALTER TABLE mailroom.messages ADD CONSTRAINT messages_pkey PRIMARY KEY (mailbox_id, id, received_at);
        PERFORM create_distributed_table('mailroom.messages', 'mailbox_id', colocate_with => 'none');
    END IF;

    -- mailboxes: by id, colocated with messages (a mailbox's row and its messages on one worker:
    -- delivery, reading and purge are single-shard). A unique key must hold the distribution
    -- column, so the address's uniqueness moves to mailbox_addresses, distributed by address
    -- (sql/citus/30_mailboxes.sql, which also fills it). An installation distributed by the
    -- earlier layout (mailboxes a Citus local table, made plain above) is moved here too: Citus
    -- copies its rows to the shards.
    IF NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_dist_partition AS p
        WHERE p.logicalrelid = 'mailroom.mailboxes'::regclass AND p.partmethod = 'h'
    ) THEN
        ALTER TABLE mailroom.mailboxes DROP CONSTRAINT IF EXISTS mailboxes_address_key;
        PERFORM create_distributed_table('mailroom.mailboxes', 'id', colocate_with => 'mailroom.messages');
        ALTER TABLE mailroom.mailboxes ADD CONSTRAINT mailboxes_plan_fkey
        FOREIGN KEY (plan) REFERENCES mailroom.plans (name);
    END IF;

    -- outbound_messages: by lane. Each lane value is chosen to fall in its own shard
    -- (outbound_lanes, filled below), and a message gets a lane at random when it is queued.
    IF NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_dist_partition AS p WHERE p.logicalrelid = 'mailroom.outbound_messages'::regclass
    ) THEN
        -- rows queued before (an installation moved to Citus) are in lane 0, the first lane of all
        -- (the column of every installation since migration 0570: one node is lane 0)
        ALTER TABLE mailroom.outbound_messages ADD COLUMN IF NOT EXISTS lane integer NOT NULL DEFAULT 0;
        ALTER TABLE mailroom.outbound_messages ALTER COLUMN lane SET DEFAULT mailroom_internal._outbound_lane();
        ALTER TABLE mailroom.outbound_messages DROP CONSTRAINT outbound_messages_pkey;
        ALTER TABLE mailroom.outbound_messages ADD CONSTRAINT outbound_messages_pkey PRIMARY KEY (id, created_at, lane);
        -- One lane (one shard) a worker, not citus.shard_count (issue 37): concurrent claimers
        -- share a lane as they share the queue on one node (SKIP LOCKED within the shard), and
        -- every statement that covers the queue (a claim that finds nothing, finalize by ids, the
        -- reaper, the operator verbs) costs one statement a shard: 2 instead of 8 on two workers
        -- (docs/scale.md; a worker added later gets lanes by alter_distributed_table).
        PERFORM create_distributed_table(
            'mailroom.outbound_messages', 'lane', colocate_with => 'none',
            shard_count => greatest((
                SELECT count(*)::integer FROM pg_catalog.pg_dist_node AS n
                WHERE n.groupid <> 0 AND n.isactive AND n.noderole = 'primary'
            ), 1)
        );
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
        -- an installation with accounts already (an upgrade): their rows are copied to the shards
        -- with COPY, which fires the shards' row triggers; the single-node ones name tables a
        -- worker does not have yet (sql/citus/12 replaces them), so they are off for the copy
        ALTER TABLE mailroom.accounts DISABLE TRIGGER USER;
        ALTER TABLE mailroom.tokens DISABLE TRIGGER USER;
        PERFORM create_distributed_table('mailroom.accounts', 'id', colocate_with => 'none');
        ALTER TABLE mailroom.tokens DROP CONSTRAINT tokens_pkey;
        ALTER TABLE mailroom.tokens ADD CONSTRAINT tokens_pkey PRIMARY KEY (account, id, created_at);
        PERFORM create_distributed_table('mailroom.tokens', 'account', colocate_with => 'mailroom.accounts');
        ALTER TABLE mailroom.tokens ADD CONSTRAINT tokens_account_fkey FOREIGN KEY (account)
        REFERENCES mailroom.accounts (id) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED;
        ALTER TABLE mailroom.accounts ENABLE TRIGGER USER;
        ALTER TABLE mailroom.tokens ENABLE TRIGGER USER;
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
