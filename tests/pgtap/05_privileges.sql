-- The privilege model: every function pins its search_path, nothing in schema mailroom is
-- reachable by PUBLIC, the API a runtime role calls runs as its owner (SECURITY DEFINER), and
-- each runtime role may execute exactly its part of the API, read no table and use the schema.
--
-- Functions of sql/2x-4x (inboxes, outbound, collector) adopt the model on their own branch.
-- Until they have (none of their API is SECURITY DEFINER yet), their checks run as TODO: they
-- report without failing. Once any of them is SECURITY DEFINER, every check is strict.
BEGIN;

-- who calls what (the matrix); mailroom_admin is a member of mailroom_monitor and inherits its rights
CREATE TEMP TABLE matrix (role name NOT NULL, fn name NOT NULL, PRIMARY KEY (role, fn));
INSERT INTO matrix (role, fn)
SELECT 'mailroom_app', unnest(ARRAY[
    'listen', 'unlisten', 'await_writers',
    'create_account', 'suspend_account', 'unsuspend_account', 'request_password_recovery', 'consume_token',
    'verify_token', 'create_mailbox', 'extend_mailbox', 'delete_mailbox', 'list_mailboxes', 'list_messages',
    'read_message', 'mailbox_accepts', 'enqueue_message', 'wait_for_message', 'extract_link', 'extract_code',
    'find_message', 'await_message', 'is_suppressed', 'search_messages', 'clock', 'setting', 'interval_setting',
    'account_status', 'list_migrations', 'schema_version', 'error_codes', 'token_actions', 'list_settings', 'list_plans',
    'enqueue_bulk_message', 'enqueue_message_with_attachments',
    'set_inbox_fault', 'clear_inbox_fault', 'inbox_fault', 'mark_message', 'delete_inbox_messages', 'release_message',
    'release_options'
])
UNION ALL
SELECT 'mailroom_http', unnest(ARRAY[
    'listen', 'unlisten', 'await_writers',
    'http_create_mailbox', 'http_get_mailbox', 'http_list_mailboxes', 'http_list_messages', 'http_mailbox_view',
    'http_read_message', 'http_message_raw', 'http_message_check',
    'http_message_attachment', 'http_delete_mailbox', 'http_delete_message', 'http_extract_link', 'http_extract_code',
    'http_check_message', 'http_search_messages', 'index_messages', 'reindex_messages', 'deliver_ses_message', 'clock', 'setting',
    'list_migrations', 'schema_version', 'error_codes', 'unsubscribe', 'worker_heartbeat', 'worker_stopped',
    'mcp_create_mailbox', 'mcp_list_mailboxes', 'mcp_list_messages', 'mcp_read_message', 'mcp_check_message',
    'mcp_extract_link', 'mcp_extract_code', 'mcp_delete_mailbox', 'mcp_error_codes',
    'http_update_message', 'http_delete_messages', 'http_clear_messages', 'http_extend_mailbox', 'http_list_all_messages',
    'mcp_mark_message', 'mcp_clear_messages', 'mcp_extend_mailbox',
    'http_set_inbox_fault', 'http_clear_inbox_fault', 'http_inbox_fault', 'mcp_set_inbox_fault', 'mcp_clear_inbox_fault',
    'http_release_message', 'release_options'
])
UNION ALL
SELECT 'mailroom_collector', unnest(ARRAY[
    'listen', 'unlisten', 'await_writers',
    'dequeue_tokens', 'enqueue_token_emails', 'render_token_email', 'worker_heartbeat', 'worker_stopped', 'clock',
    'setting', 'interval_setting', 'list_migrations', 'schema_version', 'error_codes', 'token_actions', 'list_settings',
    'signing_key_state_of'
])
UNION ALL
SELECT 'mailroom_sender', unnest(ARRAY[
    'listen', 'unlisten', 'await_writers',
    'claim_messages', 'finalize_messages', 'release_messages', 'reap_stuck_messages', 'worker_heartbeat',
    'worker_stopped', 'queue_health', 'record_refused_recipients', 'clock', 'setting', 'interval_setting',
    'outbound_stats', 'list_migrations', 'schema_version', 'error_codes', 'list_settings', 'list_dkim_keys',
    'signing_key_state_of'
])
UNION ALL
SELECT 'mailroom_inbound', unnest(ARRAY[
    'listen', 'unlisten', 'await_writers',
    'check_recipient', 'deliver_message', 'max_inbound_message_bytes', 'expire_mailboxes', 'purge_mailboxes',
    'seconds_until_next_expiry', 'run_expiry', 'worker_heartbeat', 'worker_stopped', 'check_bounce_recipient',
    'record_bounce', 'maintain_partitions', 'clock', 'setting', 'interval_setting', 'deliver_messages',
    'check_message_size', 'index_messages', 'reindex_messages', 'list_migrations', 'schema_version', 'error_codes', 'list_settings'
])
UNION ALL
SELECT 'mailroom_monitor', unnest(ARRAY[
    'list_outbound_messages', 'queue_health', 'worker_health', 'list_domain_limits', 'domain_status', 'clock',
    'setting', 'interval_setting', 'outbound_stats', 'list_migrations', 'schema_version', 'error_codes',
    'list_settings', 'list_plans', 'outbound_queue', 'job_runs', 'partition_status', 'list_worker_kinds', 'inbox_stats',
    'list_dkim_keys', 'upgrade_steps'
])
UNION ALL
SELECT 'mailroom_admin', unnest(ARRAY[
    'set_setting', 'upsert_sender', 'show_outbound_message', 'retry_message', 'retry_failed_messages',
    'purge_sent_messages', 'purge_tokens', 'sign_token', 'list_outbound_messages', 'reap_stuck_messages', 'queue_health',
    'worker_health', 'suppress', 'unsuppress', 'list_suppressions', 'is_suppressed', 'set_sender_bounce_domain',
    'maintain_partitions', 'reindex_messages', 'clock', 'setting', 'interval_setting', 'outbound_stats', 'error_codes',
    'set_domain_limit', 'delete_domain_limit', 'list_domain_limits', 'domain_status', 'clear_domain_backoff',
    'create_api_key', 'list_api_keys', 'revoke_api_key', 'set_catchall_domain', 'remove_catchall_domain',
    'list_catchall_domains', 'set_catchall_fault', 'clear_catchall_fault', 'catchall_fault', 'erase_address',
    'list_migrations', 'schema_version',
    'rotate_signing_key', 'retire_signing_key', 'export_signing_key', 'import_signing_key', 'list_signing_keys',
    'signing_key_state_of', 'upgrade_steps', 'list_accounts',
    'set_sender_public_key', 'sender_public_key', 'convert_sender_passwords',
    'list_settings', 'list_plans', 'list_senders', 'hold_messages', 'release_held_messages', 'cancel_messages',
    'delete_messages', 'run_messages_now', 'retry_messages', 'outbound_queue', 'job_runs', 'partition_status',
    'list_worker_kinds', 'worker_heartbeat', 'worker_stopped', 'inbox_stats',
    'set_dkim_key', 'list_dkim_keys', 'delete_dkim_key', 'import_seed_accounts'
])
UNION ALL
SELECT 'mailroom_timekeeper', unnest(ARRAY['pin_clock', 'unpin_clock']);

CREATE TEMP TABLE runtime_roles (role name PRIMARY KEY);
INSERT INTO runtime_roles VALUES
('mailroom_app'), ('mailroom_collector'), ('mailroom_sender'), ('mailroom_inbound'),
('mailroom_monitor'), ('mailroom_admin'), ('mailroom_timekeeper'), ('mailroom_http');

-- the functions of sql/00-14 (foundation, accounts and tokens); everything else is "other"
CREATE TEMP TABLE accounts_area (fn name PRIMARY KEY);
INSERT INTO accounts_area
SELECT unnest(ARRAY[
    'clock', '_may_pin_clock', 'pin_clock', 'unpin_clock', 'setting', 'set_setting', '_check_setting_value',
    'interval_setting', 'account_status', 'error_codes', '_verdict_reply', '_code_reply', '_token_action', 'token_actions', 'list_settings',
    '_is_valid_address', '_is_domain_name', '_random_bytes', '_digest', '_hmac', '_hmac_many', '_pgp_sym_encrypt', '_pgp_sym_decrypt',
    '_valid_email', '_check_account_identity', 'trg_before_account_insert', 'trg_before_account_identity_change',
    'trg_before_account_status_change', 'create_account', '_lock_account', 'suspend_account', 'list_accounts',
    'unsuspend_account', '_random_code', '_b64url_encode', '_b64url_encode_many', '_b64url_decode', '_check_key',
    '_token_mac', '_token_macs', '_signed_values',
    'sign_token', 'trg_before_token_insert', 'trg_before_token_close', 'trg_after_token_consumed',
    '_announce_tokens', 'trg_after_tokens_inserted', 'trg_after_accounts_inserted', '_token_eligible',
    '_dequeue_tokens_sql', 'dequeue_tokens', '_ct_equal', '_mac_key_index', '_signing_keys', '_split_signed',
    'verify_token', '_raise_token_state', '_token_by_digest', 'consume_token', 'request_password_recovery', '_recovery_allowed',
    '_issue_requested_recoveries', 'purge_tokens',
    '_pgp_pub_encrypt', '_pgp_key_id', '_dequeue_tokens', '_mint_token', '_signed_value', '_verify_token', '_consume_token',
    '_active_signing_key', '_verifying_keys', '_lock_keyring', 'rotate_signing_key', 'retire_signing_key',
    'export_signing_key', 'import_signing_key', 'list_signing_keys', '_key_fingerprint', 'signing_key_state_of',
    'upgrade_steps',
    'listen', 'unlisten', 'await_writers', '_listened', '_notify'
]);

-- every function and procedure in the schema, with its area
CREATE TEMP TABLE fns AS
SELECT
    p.oid,
    p.oid::regprocedure::text AS sig,
    p.proname AS fn,
    ARRAY(SELECT format_type(t, NULL) FROM unnest(p.proargtypes::oid []) AS t)::name [] AS args,
    EXISTS (SELECT 1 FROM accounts_area AS a WHERE a.fn = p.proname) AS accounts,
    p.prosecdef,
    p.proconfig,
    p.prokind,
    p.proowner
FROM pg_proc AS p
WHERE p.pronamespace = 'mailroom'::regnamespace;

-- whether sql/2x-4x follow the model yet (see the top of this file)
CREATE TEMP TABLE other_area AS
SELECT EXISTS (SELECT 1 FROM fns WHERE NOT accounts AND prosecdef AND fn !~ '^_') AS ready;

SELECT plan(
    18 + (SELECT count(*)::int FROM runtime_roles)  -- (f) one schema check per role
    + (SELECT count(*)::int FROM fns WHERE fn IN (SELECT fn FROM matrix)) * (SELECT count(*)::int FROM runtime_roles)
    + (SELECT count(*)::int FROM pg_class
       WHERE relnamespace = 'mailroom'::regnamespace AND relkind IN ('r', 'p', 'v', 'm', 'S'))
    * (SELECT count(*)::int FROM runtime_roles)
);

-- ---------------------------------------------------------------- functions of the accounts area
SELECT is(
    (SELECT coalesce(string_agg(sig, ', ' ORDER BY sig), '') FROM fns
     WHERE accounts AND NOT coalesce('search_path=pg_catalog, pg_temp' = ANY(proconfig), false)),
    '', '(a) every accounts-area function pins search_path = pg_catalog, pg_temp'
);
SELECT is(
    (SELECT coalesce(string_agg(f.sig, ', ' ORDER BY f.sig), '') FROM fns AS f INNER JOIN pg_proc AS p ON f.oid = p.oid
     WHERE f.accounts
         AND p.prosrc ~ '(?<![._a-z])(gen_random_bytes|digest|hmac|pgp_sym_encrypt|pgp_sym_decrypt|pgp_pub_encrypt|pgp_key_id)\('
         AND f.fn NOT IN ('_random_bytes', '_digest', '_hmac', '_hmac_many', '_pgp_sym_encrypt', '_pgp_sym_decrypt',
             '_pgp_pub_encrypt', '_pgp_key_id')),
    '', 'pgcrypto is called only through the mailroom._* wrappers'
);
SELECT is(
    (SELECT coalesce(string_agg(sig, ', ' ORDER BY sig), '') FROM fns
     WHERE accounts AND prosecdef <> (fn IN (SELECT fn FROM matrix))),
    '', 'the accounts API a runtime role calls is SECURITY DEFINER; its helpers and triggers are not'
);
SELECT function_privs_are(
    'mailroom', m.fn, f.args, m.role, ARRAY['EXECUTE'], format('(d) %s executes %s', m.role, f.sig)
)
FROM matrix AS m INNER JOIN fns AS f ON m.fn = f.fn
WHERE f.accounts
ORDER BY f.sig, m.role;

-- ---------------------------------------------------------------- the whole schema
SELECT is(
    (SELECT coalesce(string_agg(m.role || ' ' || m.fn, ', ' ORDER BY m.role, m.fn), '') FROM matrix AS m
     WHERE NOT EXISTS (SELECT 1 FROM fns AS f WHERE f.fn = m.fn)),
    '', 'every function of the matrix exists'
);
-- (d) no runtime role outside the matrix may execute an API function, whatever its area
SELECT function_privs_are(
    'mailroom', f.fn, f.args, r.role, ARRAY[]::name [], format('(d) %s may not execute %s', r.role, f.sig)
)
FROM fns AS f CROSS JOIN runtime_roles AS r
WHERE f.fn IN (SELECT fn FROM matrix)
    AND NOT EXISTS (SELECT 1 FROM matrix AS m WHERE m.role = r.role AND m.fn = f.fn)
ORDER BY f.sig, r.role;
SELECT is(
    (SELECT coalesce(string_agg(f.sig, ', ' ORDER BY f.sig), '')
     FROM fns AS f, aclexplode(coalesce(
         (SELECT p.proacl FROM pg_proc AS p WHERE p.oid = f.oid), acldefault('f', f.proowner)
     )) AS a
     WHERE f.prosecdef AND a.grantee = 0),
    '', '(b) no SECURITY DEFINER function is executable by PUBLIC'
);
SELECT is(
    (SELECT coalesce(string_agg(f.sig, ', ' ORDER BY f.sig), '')
     FROM fns AS f, aclexplode(coalesce(
         (SELECT p.proacl FROM pg_proc AS p WHERE p.oid = f.oid), acldefault('f', f.proowner)
     )) AS a
     WHERE a.grantee = 0),
    '', '(c) no function or procedure in schema mailroom is executable by PUBLIC'
);
SELECT is(
    (SELECT coalesce(string_agg(r.role || ' ' || f.sig, ', ' ORDER BY f.sig, r.role), '')
     FROM fns AS f CROSS JOIN runtime_roles AS r
     WHERE f.fn ~ '^(_|trg_)' AND has_function_privilege(r.role, f.oid, 'EXECUTE')),
    '', 'no runtime role may execute an internal helper (_*) or a trigger function (trg_*)'
);
SELECT is(
    (SELECT coalesce(string_agg(sig, ', ' ORDER BY sig), '') FROM fns WHERE proowner <> 'mailroom_owner'::regrole),
    '', 'every function belongs to mailroom_owner'
);
SELECT is(
    (SELECT coalesce(string_agg(c.oid::regclass::text, ', ' ORDER BY c.oid::regclass::text), '')
     FROM pg_class AS c
     WHERE c.relnamespace = 'mailroom'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
         AND c.relowner <> 'mailroom_owner'::regrole),
    '', 'every table, view and sequence belongs to mailroom_owner'
);
SELECT is(
    (SELECT coalesce(string_agg(c.relname || '.' || a.attname, ', '), '')
     FROM pg_attribute AS a INNER JOIN pg_class AS c ON a.attrelid = c.oid
     WHERE c.relnamespace = 'mailroom'::regnamespace AND a.attacl IS NOT NULL),
    '', 'no column-level grants in schema mailroom'
);

-- (e) no runtime role has any privilege on a table or a sequence; of the views only
-- outbound_stats is read, by mailroom_monitor (and so mailroom_admin) and mailroom_sender
SELECT table_privs_are(
    'mailroom', c.relname, r.role, ARRAY[]::name [],
    format('(e) %s has no privilege on table mailroom.%s', r.role, c.relname)
)
FROM pg_class AS c CROSS JOIN runtime_roles AS r
WHERE c.relnamespace = 'mailroom'::regnamespace AND c.relkind IN ('r', 'p')
ORDER BY c.relname, r.role;
SELECT table_privs_are(
    'mailroom', c.relname, r.role, ARRAY[]::name [],
    format('(e) %s has no privilege on view mailroom.%s', r.role, c.relname)
)
FROM pg_class AS c CROSS JOIN runtime_roles AS r
WHERE c.relnamespace = 'mailroom'::regnamespace AND c.relkind IN ('v', 'm')
    AND NOT (c.relname = 'outbound_stats' AND r.role IN ('mailroom_monitor', 'mailroom_admin', 'mailroom_sender'))
ORDER BY c.relname, r.role;
SELECT sequence_privs_are(
    'mailroom', c.relname, r.role, ARRAY[]::name [],
    format('(e) %s has no privilege on sequence mailroom.%s', r.role, c.relname)
)
FROM pg_class AS c CROSS JOIN runtime_roles AS r
WHERE c.relnamespace = 'mailroom'::regnamespace AND c.relkind = 'S'
ORDER BY c.relname, r.role;

-- (f) the schema: USAGE, nothing else (no CREATE)
SELECT schema_privs_are(
    'mailroom', r.role, ARRAY['USAGE'], format('(f) %s has USAGE on schema mailroom, no CREATE', r.role)
)
FROM runtime_roles AS r
ORDER BY r.role;

-- (g) what the application role cannot do
CREATE FUNCTION pg_temp.sqlstate_of(p_sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE p_sql;
    RETURN 'no error';
EXCEPTION
    WHEN OTHERS THEN
        RETURN SQLSTATE;
END;
$$;
SET LOCAL ROLE mailroom_app;
SELECT throws_ok($$SELECT * FROM mailroom.tokens$$, '42501', NULL, '(g) mailroom_app cannot read mailroom.tokens');
SELECT throws_ok(
    $$UPDATE mailroom.accounts SET status = 'active'$$, '42501', NULL, '(g) mailroom_app cannot update mailroom.accounts'
);
SELECT throws_ok(
    $$SELECT mailroom._hmac('\x00', '\x00', 'sha256')$$, '42501', NULL, '(g) mailroom_app cannot call mailroom._hmac'
);
SELECT ok(
    pg_temp.sqlstate_of($$SELECT * FROM public.dblink('dbname=postgres', 'SELECT 1') AS t (x integer)$$)
    IN ('42883', '42501', '2F003'),
    '(g) mailroom_app cannot open a dblink connection (no dblink, or dblink refuses a role without password)'
);
SELECT throws_ok($$SELECT mailroom.set_setting('tokens.ttl', '1 hour')$$, '42501', NULL,
    '(g) mailroom_app cannot change a setting');
RESET ROLE;
SELECT ok(
    NOT has_function_privilege('mailroom_app', 'mailroom.dequeue_tokens(integer)', 'EXECUTE')
    AND NOT has_function_privilege('mailroom_app', 'mailroom.set_setting(text, text)', 'EXECUTE')
    AND NOT has_function_privilege('mailroom_app', 'mailroom.pin_clock(timestamptz, boolean)', 'EXECUTE')
    AND NOT (to_regproc('mailroom.claim_messages') IS NOT NULL
        AND has_function_privilege('mailroom_app', to_regproc('mailroom.claim_messages'), 'EXECUTE'))
    AND NOT (to_regproc('mailroom._redaction_tag') IS NOT NULL
        AND has_function_privilege('mailroom_app', to_regproc('mailroom._redaction_tag'), 'EXECUTE')),
    '(d) mailroom_app cannot execute dequeue_tokens, claim_messages, set_setting, _redaction_tag, pin_clock'
);

-- ---------------------------------------------------------------- functions of the other areas
SELECT todo_start('sql/2x-4x have not adopted the privilege model on this branch yet')
FROM other_area WHERE NOT ready;
SELECT is(
    (SELECT coalesce(string_agg(sig, ', ' ORDER BY sig), '') FROM fns
     WHERE NOT accounts AND prokind <> 'p'
         AND NOT coalesce('search_path=pg_catalog, pg_temp' = ANY(proconfig), false)),
    '', '(a) every other function pins search_path = pg_catalog, pg_temp (a procedure that COMMITs cannot carry SET)'
);
SELECT is(
    (SELECT coalesce(string_agg(sig, ', ' ORDER BY sig), '') FROM fns
     WHERE NOT accounts AND prosecdef <> (fn IN (SELECT fn FROM matrix) AND prokind <> 'p')),
    '', 'the other API a runtime role calls is SECURITY DEFINER (run_expiry, a procedure with COMMIT, is not)'
);
SELECT function_privs_are(
    'mailroom', m.fn, f.args, m.role, ARRAY['EXECUTE'], format('(d) %s executes %s', m.role, f.sig)
)
FROM matrix AS m INNER JOIN fns AS f ON m.fn = f.fn
WHERE NOT f.accounts
ORDER BY f.sig, m.role;
SELECT table_privs_are(
    'mailroom', c.relname, r.role, ARRAY['SELECT'], format('(e) %s reads view mailroom.%s', r.role, c.relname)
)
FROM pg_class AS c CROSS JOIN runtime_roles AS r
WHERE c.relnamespace = 'mailroom'::regnamespace AND c.relname = 'outbound_stats'
    AND r.role IN ('mailroom_monitor', 'mailroom_admin', 'mailroom_sender')
ORDER BY r.role;
SELECT todo_end() FROM other_area WHERE NOT ready;

SELECT * FROM finish();
ROLLBACK;
