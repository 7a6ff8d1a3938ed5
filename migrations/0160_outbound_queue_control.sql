-- Issue 23, item 1: an operator controls the outbound queue (sql/37_outbound_queue.sql).
--
-- - Two statuses: 'held' (queued mail an operator put aside: the claim never takes it until
--   released; Postfix's hold queue) and 'cancelled' (will not be sent; kept like sent and failed
--   mail until retention, and may be retried).
-- - A priority per message, -10 (last) to 10 (first), 0 by default: the claim takes higher
--   priorities first and, within one priority, in due order. The due index leads with it, so the
--   claim stays an ordered scan of outbound_messages_due_idx that stops after LIMIT rows.
--
-- The new enum values cannot be used in the transaction that adds them ("unsafe use of new value"):
-- functions of sql/ name them only in PL/pgSQL bodies (checked when they run, not when they are
-- created), and the partial index of the held rows is built by 0161, outside this transaction.

ALTER TYPE mailroom.outbound_status ADD VALUE IF NOT EXISTS 'held' AFTER 'queued';
ALTER TYPE mailroom.outbound_status ADD VALUE IF NOT EXISTS 'cancelled' AFTER 'failed';

-- A constant default adds the column without rewriting the table. The CHECK is added NOT VALID:
-- every existing row holds the default 0, and validating would scan the whole table under the
-- ACCESS EXCLUSIVE lock of this ALTER; new and updated rows are checked all the same.
ALTER TABLE mailroom.outbound_messages
ADD COLUMN priority smallint NOT NULL DEFAULT 0;

ALTER TABLE mailroom.outbound_messages
ADD CONSTRAINT outbound_messages_priority_check CHECK (priority BETWEEN -10 AND 10) NOT VALID;

COMMENT ON COLUMN mailroom.outbound_messages.priority IS
'-10 (last) to 10 (first), 0 by default: claim_messages takes due messages of a higher priority first.';

-- The due index, priority first. Building it reads every partition under a SHARE lock (enqueue
-- waits meanwhile; nothing fails); its rows are only the queued ones.
DROP INDEX IF EXISTS mailroom.outbound_messages_due_idx;

CREATE INDEX outbound_messages_due_idx
ON mailroom.outbound_messages (
    priority DESC, (coalesce(next_retry_at, '-infinity'::timestamptz)), id
)
WHERE status = 'queued';

-- The partitions' copies of the index get PostgreSQL's names: give them the house's
-- (<partition>_due_idx, as sql/05_partitions.sql names them), so a plan names the index it uses.
DO $rename$
DECLARE
    v_r record;
BEGIN
    FOR v_r IN
        SELECT ci.relname AS child, c.relname || '_due_idx' AS wanted
        FROM pg_catalog.pg_inherits AS i
        INNER JOIN pg_catalog.pg_class AS c ON i.inhrelid = c.oid
        INNER JOIN pg_catalog.pg_index AS x ON c.oid = x.indrelid
        INNER JOIN pg_catalog.pg_class AS ci ON x.indexrelid = ci.oid
        INNER JOIN pg_catalog.pg_inherits AS ii ON x.indexrelid = ii.inhrelid
        WHERE
            i.inhparent = 'mailroom.outbound_messages'::pg_catalog.regclass
            AND ii.inhparent = 'mailroom.outbound_messages_due_idx'::pg_catalog.regclass
            AND ci.relname <> c.relname || '_due_idx'
    LOOP
        EXECUTE format('ALTER INDEX mailroom.%I RENAME TO %I', v_r.child, v_r.wanted);
    END LOOP;
END;
$rename$;

INSERT INTO mailroom.settings (name, value, description, kind, min_value, max_value) VALUES
(
    'collector.priority', '5',
    'Priority of activation and recovery emails in the outbound queue (-10 last to 10 first; messages default to 0).',
    'integer', '-10', '10'
)
ON CONFLICT (name) DO NOTHING;

-- The codes of the queue verbs and priorities, as rows of the vocabulary (migration 0110).
INSERT INTO mailroom.error_codes (code, area, kind, meaning, smtp_reply, verdict) VALUES
('MR326', 'outbound', 'usage', 'priority not between -10 (last) and 10 (first)', null, null),
('MR344', 'outbound', 'usage', 'a queue verb needs exactly one selection: ids, a recipient domain or all', null, null)
ON CONFLICT (code) DO NOTHING;

-- Signatures and results that change (sql/ re-creates them with their comments and grants; the
-- calls of earlier releases, by name or by position, still resolve: every new argument has a default).
DROP FUNCTION IF EXISTS mailroom.enqueue_message(text, text[], text, text, text, text[], text[], jsonb, text, timestamptz);
DROP FUNCTION IF EXISTS mailroom._enqueue_message(
    text, text, text[], text, text, text, text[], text[], jsonb, text, timestamptz
);
DROP FUNCTION IF EXISTS mailroom._enqueue_message(
    text, text, text[], text, text, text, text[], text[], jsonb, text, timestamptz, bigint
);
DROP FUNCTION IF EXISTS mailroom.outbound_stats();
DROP FUNCTION IF EXISTS mailroom.list_outbound_messages(text, integer);
DROP FUNCTION IF EXISTS mailroom.show_outbound_message(bigint);
DROP FUNCTION IF EXISTS mailroom.purge_sent_messages(timestamptz, integer);
-- retry moves to sql/37_outbound_queue.sql (held and cancelled messages too, suppressed recipients)
DROP FUNCTION IF EXISTS mailroom._requeue_failed(bigint);
