-- Fault injection per inbox (Mailpit calls it chaos; docs/inboxes.md, "Fault injection"): an inbox,
-- or a catch-all domain, answers an SMTP error of its owner's choice, so an application's retries and
-- bounce handling can be tested against the real inbound server. Stages:
--   rcpt        the RCPT of the recipient is answered the reply (check_bounce_recipient, through
--               _check_recipient_fault below);
--   data        at the end of DATA the message is answered the reply and stored for none of its
--               recipients (deliver_messages, before it stores);
--   after_data  the message is stored, then answered the reply (deliver_messages, after it stored):
--               what a client sees when the server's acknowledgement is lost, so a retry duplicates.
-- Every message, a share of them (random() per message: share 50 fails about one in two), or the
-- next N (a counter decremented under the fault's row lock, so concurrent sessions never take more
-- than N). An inbox's own fault replaces its catch-all domain's. Faults apply to the inbound SMTP
-- server only: mailbox_accepts, check_recipient and the SES hook never see them.
-- A fault harms only its owner (docs/architecture.md, agreed for issues 43-47): an inbox's fault
-- belongs to its inbox's owner (one api or mcp owner; an anonymous inbox is its own owner), a
-- catch-all domain's to the catch-all's owner (and is in force only for that owner's inboxes of the
-- domain). A RCPT fault answers its own recipient's RCPT alone; a DATA-stage fault answers a
-- message only when every recipient belongs to the fault's owner, else it is skipped and counted
-- (_transaction_fault; deliver_messages' faults_skipped).
-- Errors: MR230 bad stage, MR231 bad reply, MR232 bad share or count, MR233 not a catch-all domain,
-- MR295 a sink inbox (its token is the sink listing's: no fault through it), MR296 a subdomain pattern,
-- and those of _authorize_mailbox (MR203-MR206).

-- record, not mailroom.inbox_faults, wherever a row is held: sql/ also compiles where migration 0225
-- is not applied yet (tests/db/test_partitions.py applies it over older migrations)

CREATE OR REPLACE FUNCTION mailroom_internal._fault_stage(p_stage text)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_stage text := replace(lower(btrim(p_stage)), '-', '_');
BEGIN
    IF v_stage IS NULL OR v_stage NOT IN ('rcpt', 'data', 'after_data') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR230',
            MESSAGE = format('a fault''s stage must be rcpt, data or after_data, got %L', p_stage);
    END IF;
    RETURN v_stage;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._fault_stage(text) IS
'Internal: a fault stage in its stored form (rcpt, data, after_data; after-data and any case accepted), MR230 otherwise.';

CREATE OR REPLACE FUNCTION mailroom_internal._fault_reply(p_reply text)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_reply text := btrim(p_reply, ' ');
    v_problem text;
BEGIN
    -- the reply line the server sends, checked piece by piece so the error says what is wrong (the
    -- table's CHECK inbox_faults_reply is the same rule)
    v_problem := CASE
        WHEN v_reply IS NULL OR v_reply = '' THEN 'a fault needs a reply, e.g. ''451 4.7.1 Try again later'''
        WHEN v_reply ~ '[^ -~]' THEN 'a fault''s reply is one line of printable ASCII (no CR, LF, tab or other control character)'
        WHEN length(v_reply) > 200 THEN 'a fault''s reply is at most 200 characters'
        WHEN substr(v_reply, 1, 4) NOT IN ('421 ', '450 ', '451 ', '452 ', '550 ', '551 ', '552 ', '553 ', '554 ')
            THEN 'a fault''s reply starts with 421, 450, 451, 452, 550, 551, 552, 553 or 554 and a space'
        WHEN v_reply !~ '^[0-9]{3} [45][.][0-9]{1,3}[.][0-9]{1,3} [!-~]'
            THEN 'the reply code is followed by an enhanced status code and text (451 4.7.1 Try again later)'
        WHEN substr(v_reply, 1, 1) <> substr(v_reply, 5, 1)
            THEN 'the enhanced status code is of the reply''s class (4xx 4.x.x, 5xx 5.x.x)'
    END;
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MR231', MESSAGE = v_problem;
    END IF;
    RETURN v_reply;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._fault_reply(text) IS
'Internal: a fault''s SMTP reply, trimmed, if it is one printable line: 421/450/451/452/550-554, an enhanced status of the same class, text (MR231 otherwise).';

CREATE OR REPLACE FUNCTION mailroom_internal._fault_json(p_mailbox_id bigint, p_address text, p_domain text)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- the fault in force: the inbox's own (p_mailbox_id at p_address), else the catch-all domain's
    -- (p_domain); NULL when none. remaining NULL: every message until cleared; active: it can still
    -- answer.
    RETURN (
        SELECT jsonb_build_object(
            'scope', CASE WHEN f.address IS NOT NULL THEN 'inbox' ELSE 'catchall_domain' END,
            'stage', f.stage,
            'reply', f.reply,
            'share', f.share,
            'remaining', f.remaining,
            'fired', f.fired,
            'active', f.share > 0 AND coalesce(f.remaining, 1) > 0,
            'set_at', f.set_at
        )
        FROM mailroom.inbox_faults AS f
        WHERE
            (f.address = p_address AND f.mailbox_id = p_mailbox_id)
            OR (
                f.catchall_domain = lower(p_domain)
                -- a catch-all domain's fault is in force only for an inbox of the catch-all's owner
                AND (
                    p_mailbox_id IS NULL
                    OR mailroom_internal._mailbox_owner(p_mailbox_id) = (
                        SELECT 'api:' || d.owner_id FROM mailroom.catchall_domains AS d WHERE d.domain = f.catchall_domain
                    )
                )
            )
        ORDER BY f.address IS NULL
        LIMIT 1
    );
END;
$$;

COMMENT ON FUNCTION mailroom_internal._fault_json(bigint, text, text) IS
'Internal: the fault in force for an inbox (its own, else its catch-all domain''s) or a domain as JSON: scope, stage, reply, share, remaining, fired, active, set_at; NULL when none.';

CREATE OR REPLACE FUNCTION mailroom_internal._set_fault(
    p_mailbox_id bigint,
    p_address text,
    p_domain text,
    p_stage text,
    p_reply text,
    p_share numeric,
    p_count integer
)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_stage text := mailroom_internal._fault_stage(p_stage);
    v_reply text := mailroom_internal._fault_reply(p_reply);
BEGIN
    -- one fault per inbox (p_mailbox_id, at p_address) or catch-all domain (p_domain): a new one
    -- replaces it (and a purged inbox's left at the address), its count of answers (fired) anew
    -- a sink inbox's token is handed out to whoever reaches the sink listing: no fault through it
    IF EXISTS (SELECT 1 FROM mailroom.mailboxes AS m WHERE m.id = p_mailbox_id AND m.catchall_domain = '*') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR295',
            MESSAGE = 'a sink inbox takes no injected fault (fault injection needs an API key''s inbox)';
    END IF;
    IF p_share IS NULL OR p_share < 0 OR p_share > 100 OR round(p_share, 2) <> p_share THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR232',
            MESSAGE = format('a fault''s share is a percentage from 0 to 100 (two decimals at most), got %s',
                coalesce(p_share::text, 'NULL'));
    END IF;
    IF p_count IS NOT NULL AND p_count <= 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR232',
            MESSAGE = format('a fault''s count is a positive number of messages (or none: every one), got %s', p_count);
    END IF;
    IF p_mailbox_id IS NOT NULL THEN
        INSERT INTO mailroom.inbox_faults AS f (mailbox_id, address, stage, reply, share, remaining, set_at)
        VALUES (p_mailbox_id, p_address, v_stage, v_reply, p_share, p_count, mailroom.clock())
        ON CONFLICT (address) DO UPDATE
        SET
            mailbox_id = excluded.mailbox_id, stage = excluded.stage, reply = excluded.reply, share = excluded.share,
            remaining = excluded.remaining, fired = 0, set_at = excluded.set_at;
    ELSE
        INSERT INTO mailroom.inbox_faults AS f (catchall_domain, stage, reply, share, remaining, set_at)
        VALUES (p_domain, v_stage, v_reply, p_share, p_count, mailroom.clock())
        ON CONFLICT (catchall_domain) DO UPDATE
        SET stage = excluded.stage, reply = excluded.reply, share = excluded.share,
            remaining = excluded.remaining, fired = 0, set_at = excluded.set_at;
    END IF;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._set_fault(bigint, text, text, text, text, numeric, integer) IS
'Internal: set (or replace) the fault of an inbox (id and address), or of a catch-all domain; MR230 stage, MR231 reply, MR232 share or count, MR295 a sink inbox.';

CREATE OR REPLACE FUNCTION mailroom_internal._mailbox_owner(p_mailbox_id bigint)
RETURNS text
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- whom a fault may harm, as one key: api:<owner id> or mcp:<owner id> for an owned inbox (all of
    -- that owner's inboxes are one owner), anonymous:<mailbox id> for an anonymous one (each is its
    -- own owner: its token holder owns nothing else); NULL when no such mailbox
    RETURN (
        SELECT CASE
            WHEN m.owner_type = 'anonymous' THEN 'anonymous:' || m.id::text
            ELSE m.owner_type::text || ':' || m.owner_id
        END
        FROM mailroom.mailboxes AS m
        WHERE m.id = p_mailbox_id
    );
END;
$$;

COMMENT ON FUNCTION mailroom_internal._mailbox_owner(bigint) IS
'Internal: the owner key of a mailbox for fault injection (api:<id>, mcp:<id>, or anonymous:<mailbox id>: an anonymous inbox is its own owner), NULL if none.';

CREATE OR REPLACE FUNCTION mailroom_internal._address_owner(p_address text)
RETURNS text
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_address text := mailroom_internal._normalize_address(p_address);
BEGIN
    -- a plus address belongs to its box (box+tag@domain: box@domain)
    IF strpos(v_address, '+') > 0 THEN
        v_address := mailroom_internal._address_base(v_address);
    END IF;
    RETURN mailroom_internal._mailbox_owner(mailroom_internal._mailbox_id(v_address));
END;
$$;

COMMENT ON FUNCTION mailroom_internal._address_owner(text) IS
'Internal: the owner key (_mailbox_owner) of the mailbox a recipient address names now, NULL if none.';

CREATE OR REPLACE FUNCTION mailroom_internal._fault_in_force(p_address text)
RETURNS TABLE (id bigint, stage text, active boolean, owner text, recipient_owner text)
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_address text := mailroom_internal._normalize_address(p_address);
    v_domain text;
    v_fault record;
BEGIN
    -- a plus address meets its box's fault (box+tag@domain: box@domain)
    IF strpos(v_address, '+') > 0 THEN
        v_address := mailroom_internal._address_base(v_address);
    END IF;
    v_domain := split_part(v_address, '@', 2);
    -- The fault found for this recipient, no row when none: the inbox's own fault first, then its
    -- catch-all domain's. A recipient without a fault costs this one probe of inbox_faults.
    SELECT f.id, f.stage, f.mailbox_id, f.share, f.remaining INTO v_fault
    FROM mailroom.inbox_faults AS f
    WHERE f.address = v_address OR f.catchall_domain = v_domain
    ORDER BY f.address IS NULL
    LIMIT 1;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF v_fault.mailbox_id IS NOT NULL AND v_fault.mailbox_id IS DISTINCT FROM mailroom_internal._mailbox_id(v_address) THEN
        -- left by a purged inbox whose address a new one has now (a catch-all address): gone
        DELETE FROM mailroom.inbox_faults AS f WHERE f.id = v_fault.id;
        SELECT f.id, f.stage, f.mailbox_id, f.share, f.remaining INTO v_fault
        FROM mailroom.inbox_faults AS f WHERE f.catchall_domain = v_domain;
        IF NOT FOUND THEN
            RETURN;
        END IF;
    END IF;
    id := v_fault.id;
    stage := v_fault.stage;
    active := v_fault.share > 0 AND coalesce(v_fault.remaining, 1) > 0;
    -- whom it may harm: an inbox's fault, its inbox's owner (the recipient's own inbox: found by its
    -- id above); a catch-all domain's, the catch-all's owner (owner type api, as its inboxes)
    recipient_owner := mailroom_internal._address_owner(v_address);
    IF v_fault.mailbox_id IS NOT NULL THEN
        owner := recipient_owner;
    ELSE
        owner := (SELECT 'api:' || d.owner_id FROM mailroom.catchall_domains AS d WHERE d.domain = v_domain);
    END IF;
    RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._fault_in_force(text) IS
'Internal: the fault found for a recipient (its inbox''s own, else its catch-all domain''s; a purged inbox''s removed): id, stage, active, the owner it belongs to and the recipient''s owner (_mailbox_owner keys); no row when none.';

CREATE OR REPLACE FUNCTION mailroom_internal._fire_fault(p_id bigint)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_reply text;
BEGIN
    -- the fault's reply if it answers this time (its share drawn with random(), its count taken),
    -- else NULL; under the row lock: a concurrent answer is re-checked against the count it left
    UPDATE mailroom.inbox_faults AS f
    SET remaining = f.remaining - 1, fired = f.fired + 1
    WHERE
        f.id = p_id
        AND (f.remaining IS NULL OR f.remaining > 0)
        AND pg_catalog.random() * 100 < f.share
    RETURNING f.reply INTO v_reply;
    RETURN v_reply;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._fire_fault(bigint) IS
'Internal: a fault''s SMTP reply if it answers this time (share drawn, count taken under its row lock), else NULL.';

CREATE OR REPLACE FUNCTION mailroom_internal._recipient_fault(p_address text, p_stage text)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_fault record;
BEGIN
    -- The reply of the fault in force for this one recipient at this stage when it answers this
    -- time, else NULL. A fault harms only its owner: a catch-all domain's fault is not in force for
    -- an inbox of that domain another owner has.
    SELECT f.* INTO v_fault FROM mailroom_internal._fault_in_force(p_address) AS f;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF v_fault.stage <> p_stage OR v_fault.owner IS DISTINCT FROM v_fault.recipient_owner THEN
        RETURN NULL;
    END IF;
    RETURN mailroom_internal._fire_fault(v_fault.id);
END;
$$;

COMMENT ON FUNCTION mailroom_internal._recipient_fault(text, text) IS
'Internal: the SMTP reply of the fault in force for a recipient at a stage (rcpt, data, after_data) if it answers this time (share drawn, count taken), else NULL; a catch-all domain''s fault only for an inbox of the catch-all''s owner.';

CREATE OR REPLACE FUNCTION mailroom_internal._transaction_fault(
    p_addresses text[],
    p_stage text,
    OUT reply text,
    OUT skipped integer
)
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_address text;
    v_fault record;
    v_owners text[];
    v_seen bigint[] := '{}';
BEGIN
    -- A DATA-stage fault (data, after_data) answers a message only when every recipient of it
    -- belongs to the fault's owner (_mailbox_owner: one api or mcp owner, or that very anonymous
    -- inbox; a catch-all domain's fault belongs to the catch-all's owner): one owner's fault never
    -- refuses, nor has retried (so doubled), another owner's copy. reply: the first fault that
    -- answers, else NULL; skipped: the active faults at this stage not applied for another owner's
    -- recipient (each fault once), counted whether or not its share would have drawn it, and its
    -- count not taken. The recipients' owners are looked up only when a fault at this stage is found.
    skipped := 0;
    FOREACH v_address IN ARRAY coalesce(p_addresses, '{}') LOOP
        SELECT f.* INTO v_fault FROM mailroom_internal._fault_in_force(v_address) AS f;
        CONTINUE WHEN NOT FOUND;
        CONTINUE WHEN v_fault.stage <> p_stage OR v_fault.id = ANY(v_seen);
        v_seen := v_seen || v_fault.id;
        IF v_owners IS NULL THEN
            v_owners := CASE
                WHEN cardinality(p_addresses) = 1 THEN ARRAY[v_fault.recipient_owner]
                ELSE ARRAY(SELECT mailroom_internal._address_owner(a.address) FROM unnest(p_addresses) AS a (address))
            END;
        END IF;
        IF v_fault.owner IS NULL
            OR EXISTS (SELECT 1 FROM unnest(v_owners) AS o (owner) WHERE o.owner IS DISTINCT FROM v_fault.owner) THEN
            skipped := skipped + CASE WHEN v_fault.active THEN 1 ELSE 0 END;
            CONTINUE;
        END IF;
        reply := mailroom_internal._fire_fault(v_fault.id);
        EXIT WHEN reply IS NOT NULL;
    END LOOP;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._transaction_fault(text[], text) IS
'Internal: the reply of the first DATA-stage fault (p_stage data or after_data) that answers a message of these recipients, applied only when every recipient belongs to the fault''s owner; skipped: the active faults left unapplied for that reason.';

CREATE OR REPLACE FUNCTION mailroom_internal._check_recipient_fault(
    p_address text,
    p_size bigint DEFAULT null,
    p_sink boolean DEFAULT false
)
RETURNS TABLE (verdict text, address text, reply text)
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    -- _check_recipient_or_claim's verdict; a recipient it accepts may then meet its inbox's fault at
    -- RCPT: verdict 'fault' with the fault's reply. reply is NULL otherwise (the caller answers a
    -- refusing verdict's reply from mailroom.error_codes).
    SELECT c.verdict, c.address INTO verdict, address
    FROM mailroom_internal._check_recipient_or_claim(p_address, p_size, p_sink) AS c;
    reply := NULL;
    -- one probe of an (almost always) empty table spares every RCPT the fault look-up's calls
    IF verdict = 'ok' AND EXISTS (SELECT FROM mailroom.inbox_faults) THEN
        reply := mailroom_internal._recipient_fault(address, 'rcpt');
        IF reply IS NOT NULL THEN
            verdict := 'fault';
        END IF;
    END IF;
    RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._check_recipient_fault(text, bigint, boolean) IS
'Internal: the inbound RCPT verdict of an inbox address (_check_recipient_or_claim), or fault with its reply when the inbox''s RCPT fault answers.';

CREATE OR REPLACE FUNCTION mailroom.set_inbox_fault(
    p_address text,
    p_session_token text,
    p_stage text,
    p_reply text,
    p_share numeric DEFAULT 100,
    p_count integer DEFAULT null,
    p_owner_type text DEFAULT null,
    p_owner_id text DEFAULT null
)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_box record;
BEGIN
    v_box := mailroom_internal._authorize_mailbox(p_address, p_session_token, p_owner_type, p_owner_id);
    PERFORM mailroom_internal._set_fault(v_box.id, v_box.address, NULL, p_stage, p_reply, p_share, p_count);
    RETURN mailroom_internal._fault_json(v_box.id, v_box.address, split_part(v_box.address, '@', 2));
END;
$$;

COMMENT ON FUNCTION mailroom.set_inbox_fault(text, text, text, text, numeric, integer, text, text) IS
'Fault injection: make an open inbox answer p_reply (4xx/5xx) at p_stage (rcpt, data, after_data) for p_share % of messages, the next p_count only if given; replaces its fault; returns it as inbox_fault does. Errors: MR230-MR232, MR295 a sink inbox, MR203-MR206.';

GRANT EXECUTE ON FUNCTION mailroom.set_inbox_fault(text, text, text, text, numeric, integer, text, text)
TO mailroom_app;

CREATE OR REPLACE FUNCTION mailroom.clear_inbox_fault(
    p_address text,
    p_session_token text,
    p_owner_type text DEFAULT null,
    p_owner_id text DEFAULT null
)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_box record;
BEGIN
    -- a closed inbox too (it may be cleared on its way out); its catch-all domain's fault stays
    v_box := mailroom_internal._authorize_mailbox(
        p_address, p_session_token, p_owner_type, p_owner_id, p_require_open => false
    );
    DELETE FROM mailroom.inbox_faults AS f WHERE f.address = v_box.address AND f.mailbox_id = v_box.id;
    RETURN FOUND;
END;
$$;

COMMENT ON FUNCTION mailroom.clear_inbox_fault(text, text, text, text) IS
'Fault injection: remove an inbox''s own fault (its catch-all domain''s stays); false if it had none. Errors: MR203/MR204.';

GRANT EXECUTE ON FUNCTION mailroom.clear_inbox_fault(text, text, text, text) TO mailroom_app;

CREATE OR REPLACE FUNCTION mailroom.inbox_fault(
    p_address text,
    p_session_token text,
    p_owner_type text DEFAULT null,
    p_owner_id text DEFAULT null
)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_box record;
BEGIN
    v_box := mailroom_internal._authorize_mailbox(
        p_address, p_session_token, p_owner_type, p_owner_id, p_require_open => false
    );
    RETURN mailroom_internal._fault_json(v_box.id, v_box.address, split_part(v_box.address, '@', 2));
END;
$$;

COMMENT ON FUNCTION mailroom.inbox_fault(text, text, text, text) IS
'Fault injection: the fault in force for an inbox (its own, else its catch-all domain''s) as JSON {scope, stage, reply, share, remaining, fired, active, set_at}, NULL when none. Errors: MR203/MR204.';

GRANT EXECUTE ON FUNCTION mailroom.inbox_fault(text, text, text, text) TO mailroom_app;

CREATE OR REPLACE FUNCTION mailroom_internal._catchall_domain_name(p_domain text)
RETURNS text
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_domain text := lower(btrim(p_domain));
BEGIN
    IF NOT EXISTS (SELECT 1 FROM mailroom.catchall_domains AS d WHERE d.domain = v_domain) THEN
        RAISE EXCEPTION USING ERRCODE = 'MR233', MESSAGE = 'not a catch-all domain (mailroom catchall list)';
    END IF;
    RETURN v_domain;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._catchall_domain_name(text) IS
'Internal: a catch-all domain in its stored form (lower case), MR233 when it is not one.';

CREATE OR REPLACE FUNCTION mailroom.set_catchall_fault(
    p_domain text,
    p_stage text,
    p_reply text,
    p_share numeric DEFAULT 100,
    p_count integer DEFAULT null
)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_domain text := mailroom_internal._catchall_domain_name(p_domain);
BEGIN
    -- a fault is found by the recipient's own domain (_fault_in_force): a pattern's would never answer
    IF v_domain LIKE '*.%' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR296',
            MESSAGE = 'a catch-all subdomain pattern carries no fault (set it on a domain or on an inbox)';
    END IF;
    -- every inbox of the domain without a fault of its own; kept until cleared or the domain removed
    PERFORM mailroom_internal._set_fault(NULL, NULL, v_domain, p_stage, p_reply, p_share, p_count);
    RETURN mailroom_internal._fault_json(NULL, NULL, v_domain);
END;
$$;

COMMENT ON FUNCTION mailroom.set_catchall_fault(text, text, text, numeric, integer) IS
'Fault injection for a catch-all domain: its inboxes (those without a fault of their own) answer p_reply at p_stage for p_share % of messages, the next p_count only if given; returns it as JSON. Errors: MR233, MR296 a subdomain pattern, MR230-MR232.';

GRANT EXECUTE ON FUNCTION mailroom.set_catchall_fault(text, text, text, numeric, integer) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.clear_catchall_fault(p_domain text)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM mailroom.inbox_faults AS f WHERE f.catchall_domain = lower(btrim(p_domain));
    RETURN FOUND;
END;
$$;

COMMENT ON FUNCTION mailroom.clear_catchall_fault(text) IS
'Fault injection: remove a catch-all domain''s fault (its inboxes'' own faults stay); false if it had none.';

GRANT EXECUTE ON FUNCTION mailroom.clear_catchall_fault(text) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.catchall_fault(p_domain text)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN mailroom_internal._fault_json(NULL, NULL, mailroom_internal._catchall_domain_name(p_domain));
END;
$$;

COMMENT ON FUNCTION mailroom.catchall_fault(text) IS
'Fault injection: a catch-all domain''s fault as JSON (as inbox_fault), NULL when none. Errors: MR233.';

GRANT EXECUTE ON FUNCTION mailroom.catchall_fault(text) TO mailroom_admin;
