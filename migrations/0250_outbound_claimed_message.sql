-- Issue 36, item 3: the claim's row, one definition. The 31 columns claim_messages has returned
-- since 0.2.0, in the same order and with the same types, become the composite type
-- mailroom.claimed_message; every form of the claim (_claim of sql/33, its Citus form in
-- sql/citus/20_queue.sql, claim_messages, finalize_and_claim) returns it, and the driver's
-- declaration (outbound/sqlapi.py) is checked against its attributes (tests/db/test_contract.py).
-- A column added later is added here by a migration (ALTER TYPE … ADD ATTRIBUTE, at the end).
--
-- CREATE OR REPLACE cannot change a result type: the functions that spelled the row are dropped
-- and re-created by sql/33 in this same transaction (db migrate is one), so no caller finds them
-- missing; the columns and their order are unchanged, so the previous release's sender reads
-- the same row (tests/db/test_upgrade.py).
CREATE TYPE mailroom.claimed_message AS (
    id bigint,
    claim_token bigint,
    attempts integer,
    message_id text,
    sender_name text,
    from_address text,
    to_addrs text [],
    cc_addrs text [],
    bcc_addrs text [],
    subject text,
    text_body text,
    html_body text,
    headers jsonb,
    created_at timestamptz,
    possibly_sent boolean,
    smtp_host text,
    smtp_port integer,
    smtp_security text,
    smtp_username text,
    smtp_password_sealed bytea,
    smtp_password_set boolean,
    smtp_allow_cleartext boolean,
    return_path text,
    recipients text [],
    return_paths text [],
    list_unsubscribe text [],
    dkim_domain text,
    dkim_selector text,
    dkim_public_key text,
    dkim_algorithm text,
    attachments jsonb
);

COMMENT ON TYPE mailroom.claimed_message IS
'One claimed outbound message as every form of the claim returns it (claim_messages, finalize_and_claim): the columns the sender reads.';

DROP FUNCTION IF EXISTS mailroom.claim_messages(integer, text, interval);
DROP FUNCTION IF EXISTS mailroom._claim(timestamptz, integer, text, interval, boolean);
