-- Marks on an inbox's messages (issue 35 item 1): read/unread, a tag set, and deleting selected or
-- all messages, for an inbox's session token or owner (the CLI and psql as mailroom_app; the HTTP
-- face and MCP through sql/29_http.sql). Tags also come by plus-addressing (sql/02_addresses.sql,
-- sql/21_delivery.sql). A tag set is sorted, lower-case and distinct: at most 20 tags of 1-64
-- characters [a-z0-9._-]. Errors: MR260 a bad tag, MR261 too many tags, MR262 a list of ids that
-- is empty or over 500, MR209 no such message, MR203-MR206 (authorization, as for reading).

CREATE OR REPLACE FUNCTION mailroom_internal._message_tags(p_tags text[])
RETURNS text[]
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tags text[];
    v_bad text;
BEGIN
    -- the stored form of a tag set: trimmed, lower case, distinct, sorted; NULL elements refused
    IF p_tags IS NULL THEN
        RETURN '{}';
    END IF;
    IF cardinality(p_tags) > 200 THEN
        RAISE EXCEPTION USING ERRCODE = 'MR261', MESSAGE = 'a message has at most 20 tags';
    END IF;
    v_tags := ARRAY(SELECT DISTINCT lower(btrim(t.tag)) FROM unnest(p_tags) AS t (tag) ORDER BY 1);
    SELECT t.tag INTO v_bad FROM unnest(v_tags) AS t (tag)
    WHERE t.tag IS NULL OR t.tag !~ '^[a-z0-9._-]{1,64}$'
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR260',
            MESSAGE = format('a tag is 1 to 64 characters of a-z, 0-9, ".", "_" and "-", got %s',
                coalesce(quote_literal(left(v_bad, 70)), 'NULL'));
    END IF;
    IF cardinality(v_tags) > 20 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR261',
            MESSAGE = format('a message has at most 20 tags, got %s', cardinality(v_tags));
    END IF;
    RETURN v_tags;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._message_tags(text[]) IS
'Internal: a tag set in its stored form (trimmed, lower case, distinct, sorted); MR260 a bad tag, MR261 more than 20.';

CREATE OR REPLACE FUNCTION mailroom_internal._mark_message(
    p_box mailroom.mailboxes,
    p_message_id bigint,
    p_is_read boolean,
    p_tags text[]
)
RETURNS mailroom.messages
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tags text[] := CASE WHEN p_tags IS NOT NULL THEN mailroom_internal._message_tags(p_tags) END;
    v_message mailroom.messages;
BEGIN
    -- NULL leaves a mark as it is; the tag set given replaces the message's
    UPDATE mailroom.messages AS g
    SET
        is_read = coalesce(p_is_read, g.is_read),
        tags = coalesce(v_tags, g.tags)
    WHERE g.id = p_message_id AND g.mailbox_id = p_box.id
    RETURNING g.* INTO v_message;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR209',
            MESSAGE = format('message %s not found in this mailbox', coalesce(p_message_id::text, 'NULL'));
    END IF;
    RETURN v_message;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._mark_message(mailroom.mailboxes, bigint, boolean, text[]) IS
'Internal: set a message''s read mark and/or replace its tag set (NULL: unchanged); the row after; MR209 if not in the mailbox, MR260/MR261 bad tags.';

CREATE OR REPLACE FUNCTION mailroom_internal._delete_inbox_messages(p_box mailroom.mailboxes, p_message_ids bigint[], p_all boolean)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_n integer;
    v_bytes bigint;
BEGIN
    -- the ids given (ids of another inbox, or gone already, are not counted), or every message
    IF NOT p_all AND (p_message_ids IS NULL OR cardinality(p_message_ids) NOT BETWEEN 1 AND 500) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR262',
            MESSAGE = format('a list of message ids must hold 1 to 500 ids, got %s',
                coalesce(cardinality(p_message_ids)::text, 'none'));
    END IF;
    WITH gone AS (
        DELETE FROM mailroom.messages AS g
        WHERE g.mailbox_id = p_box.id AND (p_all OR g.id = ANY(p_message_ids))
        RETURNING g.size_bytes
    )
    SELECT count(*), coalesce(sum(gone.size_bytes), 0) INTO v_n, v_bytes FROM gone;
    -- the deleted messages free their places under the plan's message count, and their bytes
    IF v_n > 0 THEN
        UPDATE mailroom.mailboxes AS m
        SET message_count = greatest(m.message_count - v_n, 0), stored_bytes = greatest(m.stored_bytes - v_bytes, 0)
        WHERE m.id = p_box.id;
    END IF;
    RETURN v_n;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._delete_inbox_messages(mailroom.mailboxes, bigint[], boolean) IS
'Internal: delete these messages of a mailbox (1-500 ids, MR262), or all of them (p_all); frees their places under the plan''s count; how many were deleted.';

CREATE OR REPLACE FUNCTION mailroom.mark_message(
    p_address text,
    p_session_token text,
    p_message_id bigint,
    p_is_read boolean DEFAULT null,
    p_tags text[] DEFAULT null,
    p_owner_type text DEFAULT null,
    p_owner_id text DEFAULT null
)
RETURNS TABLE (message_id bigint, is_read boolean, tags text[])
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_message mailroom.messages;
BEGIN
    v_message := mailroom_internal._mark_message(
        mailroom_internal._authorize_mailbox(p_address, p_session_token, p_owner_type, p_owner_id),
        p_message_id, p_is_read, p_tags
    );
    message_id := v_message.id;
    is_read := v_message.is_read;
    tags := v_message.tags;
    RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION mailroom.mark_message(text, text, bigint, boolean, text[], text, text) IS
'Mark a message of an open mailbox read or unread and/or replace its tag set (NULL: unchanged); its id, mark and tags. Errors: MR209, MR260 bad tag, MR261 over 20 tags, MR203-MR206.';

GRANT EXECUTE ON FUNCTION mailroom.mark_message(text, text, bigint, boolean, text[], text, text) TO mailroom_app;

CREATE OR REPLACE FUNCTION mailroom.delete_inbox_messages(
    p_address text,
    p_session_token text,
    p_message_ids bigint[] DEFAULT null,
    p_owner_type text DEFAULT null,
    p_owner_id text DEFAULT null
)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- NULL ids: every message of the inbox (the inbox stays)
    RETURN mailroom_internal._delete_inbox_messages(
        mailroom_internal._authorize_mailbox(p_address, p_session_token, p_owner_type, p_owner_id),
        p_message_ids, p_message_ids IS NULL
    );
END;
$$;

COMMENT ON FUNCTION mailroom.delete_inbox_messages(text, text, bigint[], text, text) IS
'Delete these messages (1-500 ids; NULL: all) of an open mailbox, which stays; how many were deleted. Errors: MR262, MR203-MR206.';

GRANT EXECUTE ON FUNCTION mailroom.delete_inbox_messages(text, text, bigint[], text, text) TO mailroom_app;
