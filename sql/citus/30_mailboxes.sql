-- Mailboxes on Citus (docs/scale.md): distributed by id, colocated with messages
-- (sql/citus/10_distribute.sql), so a mailbox's row and its messages are on one worker.
--
-- A unique key must hold the distribution column, so mailboxes_address_key is gone here and an
-- address is kept unique by mailbox_addresses, distributed by address: a new mailbox reserves its
-- address there (INSERT … ON CONFLICT (address) DO NOTHING, as the single node's insert into
-- mailboxes), then its row is written under the reserved id. _mailbox_id and _insert_mailbox of
-- sql/20_mailboxes.sql are replaced by versions that use it; every function finds a mailbox by
-- its address through _mailbox_id (one single-shard read), then works on it by id (single shard).
--
-- Expiry and purge: Citus runs FOR UPDATE SKIP LOCKED only in a single-shard statement, and a
-- mailbox's shard has no one distribution value (the key is the id itself). So a batch reads the
-- due ids without locks (one multi-shard SELECT), groups them by shard, and in each shard locks
-- and changes them in one statement with the ids written into its text (`id = ANY('{…}')`, which
-- Citus prunes to that shard at planning; a parameter in its place gets no distributed plan),
-- re-checking the due condition under SKIP LOCKED: with any number of `mailroom expire` workers a
-- mailbox is expired (and purged) by one of them, once.

CREATE TABLE IF NOT EXISTS mailroom.mailbox_addresses (
    address text PRIMARY KEY,
    mailbox_id bigint NOT NULL
);

COMMENT ON TABLE mailroom.mailbox_addresses IS
'Citus only: every mailbox''s address and id, distributed by address: address uniqueness (a new mailbox reserves here) and the lookup by address.';

DO $addresses$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_dist_partition AS p
        WHERE p.logicalrelid = 'mailroom.mailbox_addresses'::regclass
    ) THEN
        -- one connection a worker for the rest of this transaction: the functions below are
        -- created on the workers, which Citus refuses after a parallel multi-shard statement
        PERFORM set_config('citus.multi_shard_modify_mode', 'sequential', true);
        PERFORM create_distributed_table('mailroom.mailbox_addresses', 'address', colocate_with => 'none');
        -- an installation moved from the earlier layout: the addresses of its mailboxes
        INSERT INTO mailroom.mailbox_addresses (address, mailbox_id)
        SELECT m.address, m.id FROM mailroom.mailboxes AS m
        ON CONFLICT (address) DO NOTHING;
    END IF;
END;
$addresses$;

CREATE OR REPLACE FUNCTION mailroom_internal._mailbox_id(p_address text)
RETURNS bigint
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- one single-shard read (the address is the distribution column); p_address is normalized
    RETURN (SELECT a.mailbox_id FROM mailroom.mailbox_addresses AS a WHERE a.address = p_address);
END;
$$;

COMMENT ON FUNCTION mailroom_internal._mailbox_id(text) IS
'Internal (Citus): the id of the mailbox with this (normalized) address, NULL if none, through mailbox_addresses (one shard).';

CREATE OR REPLACE FUNCTION mailroom_internal._insert_mailbox(
    p_address text,
    p_plan text,
    p_owner_type mailroom.mailbox_owner_type,
    p_owner_id text,
    p_session_token_digest bytea,
    p_expires_at timestamptz,
    p_created_at timestamptz,
    p_catchall_domain text DEFAULT null
)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- an id whose mailbox shard is on the worker of the address's reservation (sql/citus/12,
    -- _id_beside): the reservation and the row commit there in one phase, not two
    v_id bigint := mailroom_internal._id_beside(
        pg_catalog.pg_get_serial_sequence('mailroom.mailboxes', 'id')::regclass, 'mailroom.mailboxes',
        mailroom_internal._shard_node(get_shard_id_for_distribution_column('mailroom.mailbox_addresses', p_address))
    );
    v_reserved bigint;
    v_holder bigint;
BEGIN
    INSERT INTO mailroom.mailbox_addresses AS a (address, mailbox_id)
    VALUES (p_address, v_id)
    ON CONFLICT (address) DO NOTHING
    RETURNING a.mailbox_id INTO v_reserved;
    IF v_reserved IS NULL THEN
        -- taken, unless by a mailbox that no longer exists (a reservation left behind: every
        -- delete frees its address, _delete_mailbox and purge): then this one takes the address
        -- over. The row lock waits for a creator that has not committed yet.
        SELECT a.mailbox_id INTO v_holder
        FROM mailroom.mailbox_addresses AS a WHERE a.address = p_address FOR UPDATE;
        IF EXISTS (SELECT 1 FROM mailroom.mailboxes AS m WHERE m.id = v_holder) THEN
            RETURN NULL;
        END IF;
        UPDATE mailroom.mailbox_addresses AS a SET mailbox_id = v_id WHERE a.address = p_address;
    END IF;
    INSERT INTO mailroom.mailboxes (
        id, address, plan, owner_type, owner_id, session_token_digest, expires_at, created_at, catchall_domain
    )
    OVERRIDING SYSTEM VALUE
    VALUES (
        v_id, p_address, p_plan, p_owner_type, p_owner_id, p_session_token_digest, p_expires_at, p_created_at,
        p_catchall_domain
    );
    RETURN v_id;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._insert_mailbox(
    text, text, mailroom.mailbox_owner_type, text, bytea, timestamptz, timestamptz, text
) IS
'Internal (Citus): insert a mailbox unless its (normalized) address is taken: the address reserved in mailbox_addresses (ON CONFLICT), then the row under the reserved id; its id, or NULL.';

CREATE OR REPLACE FUNCTION mailroom_internal._delete_mailbox(p_address text)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_ids bigint[];
BEGIN
    -- erasure (erase_address): the mailbox of this address by its address (every shard: an erasure
    -- is rare, and a row is found even without its reservation), then its messages (no trigger on
    -- Citus: sql/citus/10) and its address, so the address is free again
    WITH gone AS (
        DELETE FROM mailroom.mailboxes AS m WHERE m.address = p_address RETURNING m.id
    )

    SELECT coalesce(array_agg(gone.id), '{}') INTO v_ids FROM gone;
    IF cardinality(v_ids) > 0 THEN
        EXECUTE format('DELETE FROM mailroom.messages AS g WHERE g.mailbox_id = ANY(%L::bigint[])', v_ids);
    END IF;
    DELETE FROM mailroom.mailbox_addresses AS a WHERE a.address = p_address;
    RETURN cardinality(v_ids);
END;
$$;

COMMENT ON FUNCTION mailroom_internal._delete_mailbox(text) IS
'Internal (Citus): delete the mailbox of this (normalized) address, its messages and its address in mailbox_addresses; how many (0 or 1).';

CREATE OR REPLACE FUNCTION mailroom_internal._mailbox_shards(p_ids bigint[])
RETURNS TABLE (shard bigint, ids bigint[])
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- the ids grouped by the shard of mailboxes (and of their messages) they fall in, the shards
    -- in random order so concurrent callers start on different ones
    SELECT s.shard, array_agg(s.id ORDER BY s.id)
    FROM (
        SELECT get_shard_id_for_distribution_column('mailroom.mailboxes'::regclass, u.id) AS shard, u.id
        FROM unnest(p_ids) AS u (id)
    ) AS s
    GROUP BY s.shard
    ORDER BY random()
$$;

COMMENT ON FUNCTION mailroom_internal._mailbox_shards(bigint[]) IS
'Internal (Citus): mailbox ids grouped by their shard (random order of shards).';

-- sql/23's seams of expire_mailboxes and purge_mailboxes (a batch each), shard by shard
CREATE OR REPLACE FUNCTION mailroom_internal._expire_due_mailboxes(p_now timestamptz, p_batch integer)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_batch integer := p_batch;
    v_now timestamptz := p_now;
    v_count integer := 0;
    v_n integer;
    v_ids bigint[];
    v_expired bigint[] := '{}';
    v_got bigint[];
    v_sql text;
    v_shard record;
    v_box record;
    -- webhooks (sql/38_outbound_webhooks.sql): inbox.expired, queued here on Citus (one node's
    -- trigger after_mailboxes_expired would write outbound_messages from a shard)
    v_hooks boolean := EXISTS (
        SELECT 1 FROM mailroom.webhook_endpoints AS w WHERE 'inbox.expired' = ANY (w.events)
    );
BEGIN
    -- candidates without locks (twice the batch: a concurrent worker may hold some of them)
    v_ids := ARRAY(
        SELECT m.id
        FROM mailroom.mailboxes AS m
        WHERE m.is_active AND m.expires_at <= v_now
        ORDER BY m.expires_at
        LIMIT 2 * v_batch
    );
    FOR v_shard IN SELECT s.shard, s.ids FROM mailroom_internal._mailbox_shards(v_ids) AS s LOOP
        EXIT WHEN v_count >= v_batch;
        -- one shard: the ids written into the text; the due condition re-checked under the lock
        v_sql := format($sql$
        UPDATE mailroom.mailboxes AS m
        SET is_active = false, inactive_since = m.expires_at
        WHERE
            m.id = ANY(%1$L::bigint[])
            AND m.id IN (
                SELECT d.id
                FROM mailroom.mailboxes AS d
                WHERE d.id = ANY(%1$L::bigint[]) AND d.is_active AND d.expires_at <= $1
                ORDER BY d.expires_at
                LIMIT $2
                FOR UPDATE SKIP LOCKED
            )
        $sql$, v_shard.ids);
        IF v_hooks THEN
            -- the same statement, saying which inboxes it expired (one shard still)
            EXECUTE 'WITH u AS (' || v_sql || ' RETURNING m.id) SELECT coalesce(array_agg(u.id), ''{}'') FROM u'
            INTO v_got USING v_now, v_batch - v_count;
            v_n := cardinality(v_got);
            v_expired := v_expired || v_got;
        ELSE
            EXECUTE v_sql USING v_now, v_batch - v_count;
            GET DIAGNOSTICS v_n = ROW_COUNT;
        END IF;
        v_count := v_count + v_n;
    END LOOP;
    -- the inboxes this call expired, of an API key's owner: read from their shards, queued here on the
    -- coordinator (a call in the SELECT would run on the workers)
    FOR v_box IN
        SELECT m.owner_id, m.address, m.expires_at, m.message_count
        FROM mailroom.mailboxes AS m
        WHERE m.id = ANY(v_expired) AND m.owner_type IN ('api', 'mcp') AND m.owner_id IS NOT NULL
    LOOP
        PERFORM mailroom_internal._webhook_inbox_expired(v_box.owner_id, v_box.address, v_box.expires_at, v_box.message_count);
    END LOOP;
    RETURN v_count;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._expire_due_mailboxes(timestamptz, integer) IS
'Internal (Citus): mark up to p_batch mailboxes due at p_now inactive, shard by shard (SKIP LOCKED in one shard at a time); returns how many.';

CREATE OR REPLACE FUNCTION mailroom_internal._purge_inactive_mailboxes(p_cutoff timestamptz, p_batch integer)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_batch integer := p_batch;
    v_cutoff timestamptz := p_cutoff;
    v_count integer := 0;
    v_ids bigint[];
    v_shard record;
    v_gone bigint[];
    v_addresses text[];
    v_address text;
BEGIN
    v_ids := ARRAY(
        SELECT m.id
        FROM mailroom.mailboxes AS m
        WHERE NOT m.is_active AND m.inactive_since <= v_cutoff
        ORDER BY m.inactive_since
        LIMIT 2 * v_batch
    );
    FOR v_shard IN SELECT s.shard, s.ids FROM mailroom_internal._mailbox_shards(v_ids) AS s LOOP
        EXIT WHEN v_count >= v_batch;
        -- one shard: the mailboxes (locked, SKIP LOCKED), then their messages (colocated: the
        -- same worker); the messages have no trigger or foreign key to go with them on Citus
        EXECUTE format($sql$
        WITH gone AS (
            DELETE FROM mailroom.mailboxes AS m
            WHERE
                m.id = ANY(%1$L::bigint[])
                AND m.id IN (
                    SELECT d.id
                    FROM mailroom.mailboxes AS d
                    WHERE d.id = ANY(%1$L::bigint[]) AND NOT d.is_active AND d.inactive_since <= $1
                    ORDER BY d.inactive_since
                    LIMIT $2
                    FOR UPDATE SKIP LOCKED
                )
            RETURNING m.id, m.address
        )

        SELECT coalesce(array_agg(gone.id), '{}'), coalesce(array_agg(gone.address), '{}') FROM gone
        $sql$, v_shard.ids) INTO v_gone, v_addresses USING v_cutoff, v_batch - v_count;
        CONTINUE WHEN cardinality(v_gone) = 0;
        EXECUTE format(
            'DELETE FROM mailroom.messages AS g WHERE g.mailbox_id = ANY(%L::bigint[])', v_gone
        );
        -- the addresses are free again: one single-shard statement each (a multi-shard DELETE here,
        -- after this transaction's deletes on a mailboxes shard, met a concurrent purger's in a
        -- distributed deadlock; distinct addresses by single-shard statements lock nothing shared)
        FOREACH v_address IN ARRAY v_addresses LOOP
            DELETE FROM mailroom.mailbox_addresses AS a WHERE a.address = v_address;
        END LOOP;
        v_count := v_count + cardinality(v_gone);
    END LOOP;
    RETURN v_count;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._purge_inactive_mailboxes(timestamptz, integer) IS
'Internal (Citus): hard-delete up to p_batch mailboxes inactive since before p_cutoff, their messages and their addresses, shard by shard (SKIP LOCKED in one shard at a time); returns how many.';
