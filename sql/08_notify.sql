-- NOTIFY where someone listens, for the delivery channels only. PostgreSQL serializes the commits
-- of every transaction that has issued a NOTIFY (a cluster-wide lock from PreCommit_Notify to the
-- end of the commit's WAL flush), so the hottest producer, deliver_message, notifies its channels
-- (mailroom_inbox, mailroom_delivery) only while a session has registered on them, or while
-- notify.always is true. Every other channel ALWAYS notifies and needs no registration: the
-- seed's token_insert (setting tokens.channel: a plain `LISTEN token_insert` hears every
-- statement that inserts tokens), mailroom_outbound, mailroom_expiry_schedule. The table of
-- channels and their rules: docs/architecture.md, "NOTIFY, channel by channel".
-- A listener's protocol on a registered channel, race-free (on an always channel, LISTEN and
-- the backlog scan are enough; registering there is harmless):
--   1. LISTEN channel;
--   2. SELECT mailroom.listen(ARRAY[channel]);     (committed: producers from now on notify)
--   3. SELECT mailroom.await_writers(timeout);     (transactions that may have read the registry
--                                                   before step 2 have ended)
--   4. look for work that arrived before (the backlog scan every worker does after a connect).
-- A producer reads the registry after its write, so a transaction that missed the registration
-- was already running at step 2 and has ended by step 4: its rows are in the backlog.

CREATE OR REPLACE FUNCTION mailroom.listen(p_channels text[])
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF coalesce(cardinality(p_channels), 0) NOT BETWEEN 1 AND 16 THEN
        RAISE EXCEPTION USING ERRCODE = 'MR016', MESSAGE = 'listen takes between 1 and 16 channels';
    END IF;
    IF EXISTS (
        SELECT FROM unnest(p_channels) AS c (name)
        WHERE c.name IS NULL OR char_length(c.name) NOT BETWEEN 1 AND 63
    ) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'a channel name has 1 to 63 characters';
    END IF;
    -- rows of sessions that ended (a pid reused meanwhile only costs a NOTIFY nobody hears)
    DELETE FROM mailroom.listeners AS l
    WHERE l.pid NOT IN (
        SELECT pg_stat_get_backend_pid(s.id) FROM pg_stat_get_backend_idset() AS s (id)
    );
    INSERT INTO mailroom.listeners (channel, pid)
    SELECT DISTINCT c.name, pg_backend_pid() FROM unnest(p_channels) AS c (name)
    ON CONFLICT (channel, pid) DO NOTHING;
END;
$$;

COMMENT ON FUNCTION mailroom.listen(text[]) IS
'Register this session as a listener of the channels (call after LISTEN, then mailroom.await_writers before looking for work): deliver_message NOTIFYs mailroom_inbox and mailroom_delivery only while someone is registered; other channels always notify. Errors: MR016 not 1 to 16 channels, 22023 a name not of 1 to 63 characters.';

GRANT EXECUTE ON FUNCTION mailroom.listen(text[])
TO mailroom_app, mailroom_collector, mailroom_sender, mailroom_inbound, mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.unlisten()
RETURNS void
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    DELETE FROM mailroom.listeners WHERE pid = pg_backend_pid();
$$;

COMMENT ON FUNCTION mailroom.unlisten() IS
'Remove this session''s registrations (a listener that stops; one that dies is pruned by the next mailroom.listen).';

GRANT EXECUTE ON FUNCTION mailroom.unlisten()
TO mailroom_app, mailroom_collector, mailroom_sender, mailroom_inbound, mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.await_writers(p_timeout interval DEFAULT '5 seconds')
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_deadline timestamptz;
    -- the transactions writing in this database now (each holds the lock on its own transaction
    -- id); those of other databases cannot be this one's producers and are not waited for
    v_writers xid[] := ARRAY(
        SELECT l.transactionid
        FROM pg_locks AS l
        INNER JOIN pg_stat_activity AS a ON l.pid = a.pid
        WHERE l.locktype = 'transactionid'
            AND l.mode = 'ExclusiveLock'
            AND l.granted
            AND l.pid <> pg_backend_pid()
            AND a.datname = current_database()
    );
BEGIN
    IF p_timeout IS NULL OR p_timeout < interval '0' OR p_timeout > interval '1 minute' THEN
        RAISE EXCEPTION USING ERRCODE = 'MR015', MESSAGE = 'await_writers: the timeout must be between 0 and 1 minute';
    END IF;
    v_deadline := clock_timestamp() + p_timeout;
    LOOP
        IF NOT EXISTS (
            SELECT FROM pg_locks AS l
            WHERE l.locktype = 'transactionid'
                AND l.mode = 'ExclusiveLock'
                AND l.transactionid = ANY(v_writers)
        ) THEN
            RETURN true;
        END IF;
        IF clock_timestamp() >= v_deadline THEN
            RETURN false;
        END IF;
        PERFORM pg_sleep(0.002);
    END LOOP;
END;
$$;

COMMENT ON FUNCTION mailroom.await_writers(interval) IS
'Wait until every transaction that was writing in this database when it was called has ended (at most p_timeout); false on timeout. Step 3 of the listener protocol (sql/08_notify.sql). Errors: MR015 timeout NULL or not between 0 and 1 minute.';

GRANT EXECUTE ON FUNCTION mailroom.await_writers(interval)
TO mailroom_app, mailroom_collector, mailroom_sender, mailroom_inbound, mailroom_http;

-- The registry's rule, once: of these channels, the ones a NOTIFY may be heard on (a session
-- registered with mailroom.listen, or notify.always), in the order given. One statement for any
-- number of channels (deliver_message asks for two; on Citus each statement that reads a reference
-- table is one of its own on the coordinator).
CREATE OR REPLACE FUNCTION mailroom_internal._listened_channels(p_channels text[])
RETURNS text[]
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_always text;
    v_heard text[];
BEGIN
    SELECT
        (SELECT t.value FROM mailroom.settings AS t WHERE t.name = 'notify.always'),
        ARRAY(
            SELECT c.channel FROM unnest(p_channels) WITH ORDINALITY AS c (channel, o)
            WHERE EXISTS (SELECT FROM mailroom.listeners AS l WHERE l.channel = c.channel)
            ORDER BY c.o
        )
    INTO v_always, v_heard;
    IF v_always IS NULL THEN
        -- the setting is gone: setting()'s MR001
        v_always := mailroom.setting('notify.always');
    END IF;
    RETURN CASE WHEN v_always::boolean THEN p_channels ELSE v_heard END;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._listened_channels(text[]) IS
'Internal: of these registered channels, the ones a NOTIFY may be heard on (a session registered with mailroom.listen, or notify.always), in the order given.';

CREATE OR REPLACE FUNCTION mailroom_internal._notify_each(p_channels text[], p_payload text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_channel text;
BEGIN
    FOREACH v_channel IN ARRAY mailroom_internal._listened_channels(p_channels) LOOP
        PERFORM pg_notify(v_channel, p_payload);
    END LOOP;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._notify_each(text[], text) IS
'Internal: pg_notify of one payload on each registered channel given (deliver_message''s, delete_mailbox''s) that someone may hear (_listened_channels), in the order given; the always channels call pg_notify.';
