-- Who listens: a NOTIFY costs every committing transaction a cluster-wide lock held through its
-- WAL flush (PreCommit_Notify), so producers of the hot channels notify only while a session has
-- said it listens on the channel (mailroom.listen, sql/08_notify.sql).
CREATE TABLE mailroom.listeners (
    channel text NOT NULL CHECK (char_length(channel) BETWEEN 1 AND 63),
    pid integer NOT NULL,
    since timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (channel, pid)
);

COMMENT ON TABLE mailroom.listeners IS
'Sessions that LISTEN on a channel (backend pid); a row of a session that ended is pruned by the next mailroom.listen call.';

-- An installation upgraded to this release may have listeners of its own (an application on
-- mailroom_inbox or mailroom_delivery) that do not register: it keeps notifying always until
-- its operator sets notify.always to false (docs/upgrading.md). A fresh install starts false.
INSERT INTO mailroom.settings (name, value, description, kind, min_value, max_value) VALUES
(
    'notify.always',
    CASE
        WHEN EXISTS (
            SELECT FROM mailroom.schema_migrations AS m
            WHERE m.applied_at < pg_catalog.now()
        ) THEN 'true'
        ELSE 'false'
    END,
    'NOTIFY mailroom_inbox, mailroom_delivery and tokens.channel even while no session has registered '
    || 'with mailroom.listen (for listeners of an older release or of your own that do not register).',
    'boolean', null, null
)
ON CONFLICT (name) DO NOTHING;
