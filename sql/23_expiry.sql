-- Expiry and purge: batched, one batch per call (one short transaction), safe with any number of
-- concurrent workers: each batch claims its rows with FOR UPDATE SKIP LOCKED, so two workers
-- never touch the same mailbox, never wait on each other and cannot deadlock.

CREATE OR REPLACE FUNCTION mailroom_internal._batch_size(p_batch integer, p_setting text)
RETURNS integer
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_batch integer := coalesce(p_batch, mailroom.setting(p_setting)::integer);
BEGIN
    IF v_batch <= 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = format('batch size must be positive, got %s', v_batch);
    END IF;
    RETURN v_batch;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._batch_size(integer, text) IS
'Internal: p_batch, or the named setting when NULL; 22023 unless positive.';

CREATE OR REPLACE FUNCTION mailroom.expire_mailboxes(p_batch integer DEFAULT null)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN mailroom_internal._expire_due_mailboxes(mailroom.clock(), mailroom_internal._batch_size(p_batch, 'inbox.expire_batch'));
END;
$$;

COMMENT ON FUNCTION mailroom.expire_mailboxes(integer) IS
'Mark up to p_batch (default setting inbox.expire_batch) due mailboxes inactive; returns how many. Call until it returns less than the batch. On Citus shard by shard (SKIP LOCKED in one shard at a time).';

GRANT EXECUTE ON FUNCTION mailroom.expire_mailboxes(integer) TO mailroom_inbound;

-- A Citus seam (mailroom.db.citus.SEAMS): expire_mailboxes' batch. On one node one statement; on
-- Citus (sql/citus/30_mailboxes.sql) shard by shard, since SKIP LOCKED runs only in a one-shard statement.
CREATE OR REPLACE FUNCTION mailroom_internal._expire_due_mailboxes(p_now timestamptz, p_batch integer)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_count integer;
BEGIN
    -- Due = not mailroom_internal._mailbox_open, written out: the index condition of mailboxes_expiry_idx
    -- (expires_at) WHERE is_active. Deleted mailboxes are already inactive, so not in the index.
    WITH due AS (
        SELECT m.id FROM mailroom.mailboxes AS m
        WHERE m.is_active AND m.expires_at <= p_now
        ORDER BY m.expires_at LIMIT p_batch
        FOR UPDATE SKIP LOCKED
    )
    UPDATE mailroom.mailboxes AS m SET is_active = false, inactive_since = m.expires_at
    FROM due WHERE m.id = due.id;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._expire_due_mailboxes(timestamptz, integer) IS
'Internal (a Citus seam): mark up to p_batch mailboxes due at p_now inactive (SKIP LOCKED); returns how many.';

CREATE OR REPLACE FUNCTION mailroom.seconds_until_next_expiry()
RETURNS double precision
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT extract(EPOCH FROM min(m.expires_at) - mailroom.clock())::double precision
    FROM mailroom.mailboxes AS m
    WHERE m.is_active
$$;

COMMENT ON FUNCTION mailroom.seconds_until_next_expiry() IS
'Seconds until the next active mailbox expires (negative when one is already due, NULL when none): the worker sleeps until then, like a delay queue.';

GRANT EXECUTE ON FUNCTION mailroom.seconds_until_next_expiry() TO mailroom_inbound;

CREATE OR REPLACE FUNCTION mailroom_internal.trg_mailboxes_schedule()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- Only when a new inbox becomes the next one due (a shorter TTL than every open inbox):
    -- a sleeping `mailroom expire` re-reads seconds_until_next_expiry(). In the steady state
    -- (same TTLs) a new inbox expires last and nothing is sent.
    IF (SELECT min(n.expires_at) FROM new_rows AS n WHERE n.is_active)
        <= (SELECT min(m.expires_at) FROM mailroom.mailboxes AS m WHERE m.is_active) THEN
        PERFORM pg_notify('mailroom_expiry_schedule', '');
    END IF;
    RETURN NULL;
END;
$$;

COMMENT ON FUNCTION mailroom_internal.trg_mailboxes_schedule() IS
'Statement trigger: NOTIFY mailroom_expiry_schedule (empty payload) when inserted inboxes become the next due.';

CREATE OR REPLACE TRIGGER after_mailboxes_inserted
AFTER INSERT ON mailroom.mailboxes
REFERENCING NEW TABLE AS new_rows
FOR EACH STATEMENT
EXECUTE FUNCTION mailroom_internal.trg_mailboxes_schedule();

-- A message belongs to a mailbox (migration 0181: triggers, not a cascading foreign key, so that
-- deleting a batch of mailboxes deletes their messages in one statement, not one per mailbox).
CREATE OR REPLACE FUNCTION mailroom_internal.trg_before_message_insert()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- FOR KEY SHARE, as the foreign key's check: a concurrent DELETE of the mailbox waits for this
    -- transaction, then its statement trigger sees and deletes this message too
    PERFORM FROM mailroom.mailboxes AS m WHERE m.id = NEW.mailbox_id FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'foreign_key_violation',
            MESSAGE = format('mailbox %s does not exist', coalesce(NEW.mailbox_id::text, 'NULL'));
    END IF;
    RETURN NEW;
END;
$$;

COMMENT ON FUNCTION mailroom_internal.trg_before_message_insert() IS
'Trigger: a message''s mailbox must exist (23503), checked under FOR KEY SHARE like a foreign key.';

CREATE OR REPLACE TRIGGER before_message_insert
BEFORE INSERT OR UPDATE OF mailbox_id ON mailroom.messages
FOR EACH ROW
EXECUTE FUNCTION mailroom_internal.trg_before_message_insert();

CREATE OR REPLACE FUNCTION mailroom_internal.trg_after_mailboxes_deleted()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- one index scan per partition for the whole batch (= ANY of an array), where the cascade
    -- ran one query per mailbox, each over every partition
    DELETE FROM mailroom.messages AS g
    WHERE g.mailbox_id = ANY(ARRAY(SELECT d.id FROM deleted_rows AS d));
    RETURN NULL;
END;
$$;

COMMENT ON FUNCTION mailroom_internal.trg_after_mailboxes_deleted() IS
'Statement trigger: delete the messages of every mailbox the statement deleted, in one DELETE.';

CREATE OR REPLACE TRIGGER after_mailboxes_deleted
AFTER DELETE ON mailroom.mailboxes
REFERENCING OLD TABLE AS deleted_rows
FOR EACH STATEMENT
EXECUTE FUNCTION mailroom_internal.trg_after_mailboxes_deleted();

CREATE OR REPLACE FUNCTION mailroom.purge_mailboxes(
    p_older_than interval,
    p_batch integer DEFAULT null
)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_older_than IS NULL OR p_older_than < interval '0' THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = format('retention must be a non-negative interval, got %s',
                coalesce(p_older_than::text, 'NULL'));
    END IF;
    RETURN mailroom_internal._purge_inactive_mailboxes(
        mailroom.clock() - p_older_than, mailroom_internal._batch_size(p_batch, 'inbox.purge_batch')
    );
END;
$$;

COMMENT ON FUNCTION mailroom.purge_mailboxes(interval, integer) IS
'Hard-delete up to p_batch (default inbox.purge_batch) mailboxes inactive for longer than p_older_than, their messages with them (one statement a batch; on Citus shard by shard, their addresses too); returns how many.';

GRANT EXECUTE ON FUNCTION mailroom.purge_mailboxes(interval, integer) TO mailroom_inbound;

-- A Citus seam (mailroom.db.citus.SEAMS): purge_mailboxes' batch. On one node one statement (the
-- messages go by the trigger after_mailboxes_deleted); on Citus (sql/citus/30_mailboxes.sql) shard
-- by shard, with the messages and the addresses' reservations.
CREATE OR REPLACE FUNCTION mailroom_internal._purge_inactive_mailboxes(p_cutoff timestamptz, p_batch integer)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_count integer;
BEGIN
    WITH doomed AS (
        SELECT m.id FROM mailroom.mailboxes AS m
        WHERE NOT m.is_active AND m.inactive_since <= p_cutoff
        ORDER BY m.inactive_since LIMIT p_batch
        FOR UPDATE SKIP LOCKED
    )
    DELETE FROM mailroom.mailboxes AS m USING doomed WHERE m.id = doomed.id;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._purge_inactive_mailboxes(timestamptz, integer) IS
'Internal (a Citus seam): hard-delete up to p_batch mailboxes inactive since before p_cutoff (SKIP LOCKED), their messages with them; returns how many.';

CREATE OR REPLACE PROCEDURE mailroom.run_expiry(
    p_purge_after interval DEFAULT interval '7 days',
    p_expire_batch integer DEFAULT null,
    p_purge_batch integer DEFAULT null
)
LANGUAGE plpgsql
AS $$
-- SECURITY INVOKER and without SET search_path: PostgreSQL refuses COMMIT in a procedure that
-- has either. It runs with its caller's rights and only calls the SECURITY DEFINER batch
-- functions (fully qualified); each of them resolves a NULL batch size from its setting and
-- checks its own arguments (22023).
DECLARE
    v_count integer;
    v_expired bigint := 0;
    v_purged bigint := 0;
BEGIN
    -- One COMMIT per batch keeps every lock short; a phase ends with the first empty batch.
    -- Called inside an explicit transaction block, COMMIT is not allowed: run it as a
    -- top-level CALL (psql, pg_cron).
    LOOP
        v_count := mailroom.expire_mailboxes(p_expire_batch);
        v_expired := v_expired + v_count;
        COMMIT;
        EXIT WHEN v_count = 0;
    END LOOP;
    IF p_purge_after IS NOT NULL THEN
        LOOP
            v_count := mailroom.purge_mailboxes(p_purge_after, p_purge_batch);
            v_purged := v_purged + v_count;
            COMMIT;
            EXIT WHEN v_count = 0;
        END LOOP;
    END IF;
    RAISE NOTICE 'mailroom.run_expiry: expired %, purged %', v_expired, v_purged;
END;
$$;

COMMENT ON PROCEDURE mailroom.run_expiry (interval, integer, integer) IS
'Expire all due mailboxes, then purge those inactive longer than p_purge_after (NULL: no purge), committing after each batch. For pg_cron.';

GRANT EXECUTE ON PROCEDURE mailroom.run_expiry(interval, integer, integer) TO mailroom_inbound;

CREATE OR REPLACE FUNCTION mailroom.inbox_stats()
RETURNS TABLE (
    open bigint,
    expired_unswept bigint,
    closed_unpurged bigint,
    deleted bigint,
    messages bigint,
    next_expiry_seconds double precision
)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := mailroom.clock();
BEGIN
    -- For `mailroom status`: inboxes open now, past their expiry but not yet swept by
    -- expire_mailboxes, closed and waiting for purge_mailboxes (deleted ones among them), messages
    -- they hold, and seconds until the next one is due. Active inboxes through
    -- mailboxes_expiry_idx, closed ones through mailboxes_purge_idx.
    RETURN QUERY
    SELECT
        (SELECT count(*) FROM mailroom.mailboxes AS b WHERE b.is_active AND b.expires_at > v_now),
        (SELECT count(*) FROM mailroom.mailboxes AS b WHERE b.is_active AND b.expires_at <= v_now),
        (SELECT count(*) FROM mailroom.mailboxes AS b WHERE b.inactive_since IS NOT NULL),
        (SELECT count(*) FROM mailroom.mailboxes AS b WHERE b.deleted_at IS NOT NULL AND b.inactive_since IS NOT NULL),
        (SELECT coalesce(sum(b.message_count), 0)::bigint FROM mailroom.mailboxes AS b),
        (
            SELECT extract(EPOCH FROM min(b.expires_at) - v_now)::double precision
            FROM mailroom.mailboxes AS b WHERE b.is_active AND b.expires_at > v_now
        );
END;
$$;

COMMENT ON FUNCTION mailroom.inbox_stats() IS
'Inboxes open, expired but not yet swept, closed awaiting purge (and deleted among them), messages held, seconds until the next expiry.';

GRANT EXECUTE ON FUNCTION mailroom.inbox_stats() TO mailroom_monitor, mailroom_admin;
