-- Issue 36, item 3: the operator's queue verbs as data, one row each, read by _queue_verb
-- (sql/37_outbound_queue.sql: which statuses a verb changes, what it sets, its log line, whether
-- it wakes the senders), by the CLI (its declaration in outbound/sqlapi.py, QUEUE_VERBS, is
-- checked against these rows by tests/outbound/test_queue_verbs.py) and by the docs (the table
-- of docs/outbound.md, checked by the same test). Each verb keeps its own public function and
-- its own grant (least privilege): a new verb is a row here, its function in sql/37, its
-- declaration, its grant in the privilege matrix, its docs row (CONTRIBUTING.md, "Adding a queue
-- verb"). Statuses are text (cast where used): 'held' and 'cancelled' came by ALTER TYPE … ADD
-- VALUE in migration 0160, which a fresh install runs in this same transaction.
CREATE TABLE mailroom.queue_verbs (
    verb text PRIMARY KEY CHECK (verb ~ '^[a-z][a-z_]*$'),
    function_name text NOT NULL UNIQUE CHECK (function_name ~ '^[a-z][a-z_]*$'),
    command text NOT NULL UNIQUE CHECK (command ~ '^[a-z][a-z-]*$'),
    from_statuses text[] NOT NULL CHECK (cardinality(from_statuses) > 0 AND NOT 'processing' = any(from_statuses)),
    to_status text CHECK (to_status IN ('queued', 'held', 'cancelled')),
    deletes boolean NOT NULL DEFAULT false,
    due text NOT NULL DEFAULT 'keep' CHECK (due IN ('keep', 'clear', 'now')),
    fresh_attempts boolean NOT NULL DEFAULT false,
    checks_suppressed boolean NOT NULL DEFAULT false,
    wakes_senders boolean NOT NULL DEFAULT false,
    destructive boolean NOT NULL DEFAULT false,
    log_line text NOT NULL CHECK (log_line ~ '^[a-z][a-z ]*$'),
    past_tense text NOT NULL,
    description text NOT NULL,
    CHECK (NOT deletes OR (to_status IS null AND due = 'keep' AND NOT fresh_attempts))
);

COMMENT ON TABLE mailroom.queue_verbs IS
'The operator''s verbs on queued mail: the statuses each changes, what it sets (to_status; due: keep, clear the retry time, or '
'now: only what is not due yet, made due, its domains'' backoff lifted; fresh_attempts: attempts 0, claim cleared), its error_log '
'line, whether it wakes the senders, and its CLI command, wording and help.';

INSERT INTO mailroom.queue_verbs (
    verb, function_name, command, from_statuses, to_status, deletes, due, fresh_attempts, checks_suppressed,
    wakes_senders, destructive, log_line, past_tense, description
) VALUES
(
    'hold', 'hold_messages', 'hold', '{queued}', 'held', false, 'keep', false, false, false, false,
    'held by operator', 'held',
    'Put queued messages on hold: no sender takes them until released (postsuper -h).'
),
(
    'release', 'release_held_messages', 'release', '{held}', 'queued', false, 'keep', false, false, true, false,
    'released by operator', 'released',
    'Release held messages back to the queue, due when they were (postsuper -H).'
),
(
    'cancel', 'cancel_messages', 'cancel', '{queued,held}', 'cancelled', false, 'clear', false, false, false, true,
    'cancelled by operator', 'cancelled',
    'Cancel queued or held messages: never sent, kept as cancelled until retention (retry brings them back).'
),
(
    'delete', 'delete_messages', 'delete', '{queued,held,sent,failed,cancelled}', null, true, 'keep', false, false,
    false, true, 'deleted by operator', 'deleted',
    'Delete messages of any status but processing, with their idempotency keys, for good (postsuper -d).'
),
(
    'run_now', 'run_messages_now', 'run-now', '{queued}', null, false, 'now', false, false, true, false,
    'made due now by operator', 'made due now',
    'Make queued messages due now (a deferred retry, a later send_after) and lift their domains'' backoff; '
    'the senders are woken (postqueue -f, postqueue -s DOMAIN).'
),
(
    'retry', 'retry_messages', 'retry', '{failed,cancelled,held}', 'queued', false, 'clear', true, true, true, true,
    'retried by operator', 'queued again',
    'Queue failed, cancelled or held messages again, due now with a fresh attempt budget (postsuper -r); '
    'messages with a recipient suppressed since are left alone, with a warning, unless --include-suppressed.'
);
