-- Tokens by digest on Citus (issue 26; docs/scale.md). tokens are distributed by account
-- (sql/citus/10), and a link carries only its secret (the signed format is the seed's contract):
-- consume_token finds its token by sha256(secret), which is not the distribution column, so that
-- read ran on every shard. The lookup table token_digests, distributed by the digest, names the
-- token's account: consume reads one shard of it, then the token on the account's shard.
--
-- token_digests holds (secret_digest, account) for every token whose secret_digest is set, as
-- long as the token row exists:
-- - written where a digest is set: the dequeue's minting (_dequeue_tokens, sql/citus/12) and a
--   token email's link (sql/11's _mint_token, through _token_digest_replaced below: the previous digest's row goes);
-- - deleted where a token row goes: retention (_delete_tokens_past_retention, sql/citus/12, and
--   _forget_token_digests before a tokens partition is dropped), purge_tokens (its seam _delete_tokens_before, below) and erasure
--   (_erase_account_keys, sql/citus/12).
-- A consumed or revoked token keeps its row (its digest is kept too, as on one node): a used link
-- is then refused (MR114, MR117) after single-shard reads, and a consume writes on the account's
-- shard only (no two-phase commit with the lookup's shard).
-- A digest without a row (a link minted before this table, or a token gone) is looked up on every
-- shard, as before; the table is filled from the existing digests when it is created.

-- created and filled in the transaction that then replaces functions Citus copied to the workers
SELECT set_config('citus.multi_shard_modify_mode', 'sequential', true);

CREATE TABLE IF NOT EXISTS mailroom.token_digests (
    secret_digest bytea PRIMARY KEY,  -- tokens.secret_digest: sha256 of the link's secret
    account bigint NOT NULL
);

DO $digests$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_dist_partition AS p WHERE p.logicalrelid = 'mailroom.token_digests'::regclass
    ) THEN
        -- bytea: colocated with no other table (the lookups of sql/citus/12 are by text)
        PERFORM create_distributed_table('mailroom.token_digests', 'secret_digest', colocate_with => 'none');
        -- an installation upgraded: the digests of its tokens so far
        INSERT INTO mailroom.token_digests (secret_digest, account)
        SELECT t.secret_digest, t.account FROM mailroom.tokens AS t WHERE t.secret_digest IS NOT NULL
        ON CONFLICT (secret_digest) DO NOTHING;
    END IF;
END;
$digests$;

COMMENT ON TABLE mailroom.token_digests IS
'Citus only: the account of each token by its secret_digest (distributed by the digest), so consume_token reads one shard of tokens.';

-- consume_token's first read (sql/12 _consume_token): the account through token_digests (one
-- shard), then the token on the account's shard. No lookup row: every shard, as before.
CREATE OR REPLACE FUNCTION mailroom_internal._token_by_digest(p_digest bytea)
RETURNS TABLE (token_account bigint, token_id bigint, token_action mailroom.token_action)
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_account bigint;
BEGIN
    SELECT d.account INTO v_account FROM mailroom.token_digests AS d WHERE d.secret_digest = p_digest;
    IF FOUND THEN
        -- the account of a token never changes: not on its shard, the token is gone
        RETURN QUERY
        SELECT tk.account, tk.id, tk.action
        FROM mailroom.tokens AS tk
        WHERE tk.account = v_account AND tk.secret_digest = p_digest;
        RETURN;
    END IF;
    RETURN QUERY
    SELECT tk.account, tk.id, tk.action FROM mailroom.tokens AS tk WHERE tk.secret_digest = p_digest;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._token_by_digest(bytea) IS
'Internal (Citus): (account, id, action) of the token whose secret_digest is p_digest: through token_digests, '
'then the account''s shard; a digest with no lookup row is looked up on every shard.';

-- a new link's digest replaces its token's old one in the lookup table (sql/11's _mint_token
-- calls it with the token's row locked)
CREATE OR REPLACE FUNCTION mailroom_internal._token_digest_replaced(p_account bigint, p_old bytea, p_new bytea)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_old IS NOT NULL THEN
        DELETE FROM mailroom.token_digests AS d WHERE d.secret_digest = p_old;
    END IF;
    INSERT INTO mailroom.token_digests (secret_digest, account) VALUES (p_new, p_account);
END;
$$;

COMMENT ON FUNCTION mailroom_internal._token_digest_replaced(bigint, bytea, bytea) IS
'Internal (Citus): the token_digests row of p_old (if any) deleted, p_new''s written for p_account.';

-- sql/14's seam of purge_tokens: the deleted tokens' lookup rows go with them
CREATE OR REPLACE FUNCTION mailroom_internal._delete_tokens_before(p_cutoff timestamptz)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_count bigint := 0;
    v_digests bytea[] := '{}';
    v_digest bytea;
BEGIN
    FOR v_digest IN
        DELETE FROM mailroom.tokens AS t
        WHERE t.expires_at < p_cutoff
            AND t.created_at < p_cutoff
        RETURNING t.secret_digest
    LOOP
        v_count := v_count + 1;
        IF v_digest IS NOT NULL THEN
            v_digests := v_digests || v_digest;
        END IF;
    END LOOP;
    PERFORM mailroom_internal._forget_digests(v_digests);
    RETURN v_count;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._delete_tokens_before(timestamptz) IS
'Internal (Citus): delete the tokens created and expired before p_cutoff and their token_digests rows; returns how many.';

CREATE OR REPLACE FUNCTION mailroom_internal._forget_digests(p_digests bytea[])
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF cardinality(p_digests) > 0 THEN
        DELETE FROM mailroom.token_digests AS d WHERE d.secret_digest = ANY (p_digests);
    END IF;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._forget_digests(bytea[]) IS
'Internal (Citus): delete the token_digests rows of these digests (their tokens were deleted).';

-- sql/05's seam, before _maintain_partitions drops a tokens partition: its digests' rows go
CREATE OR REPLACE FUNCTION mailroom_internal._forget_token_digests(p_partition text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_digests bytea[];
BEGIN
    EXECUTE format(
        'SELECT coalesce(array_agg(t.secret_digest), ''{}'') FROM mailroom.%I AS t WHERE t.secret_digest IS NOT NULL',
        p_partition
    ) INTO v_digests;
    PERFORM mailroom_internal._forget_digests(v_digests);
END;
$$;

COMMENT ON FUNCTION mailroom_internal._forget_token_digests(text) IS
'Internal (Citus): before a tokens partition is dropped, delete the token_digests rows of its tokens'' digests.';
