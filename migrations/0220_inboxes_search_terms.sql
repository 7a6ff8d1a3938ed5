-- Issue 35 item 2: search a user can guess (sql/27_search.sql). The vector's definition changes
-- (the recipient as weight D, addresses also by their parts: local part, domain, each parent
-- domain), so a stored vector says which definition made it, and mailroom.reindex_messages
-- rebuilds the stale ones in the background, in batches, walking the ids from a cursor kept here.
-- Until a row is rebuilt, a search computes its vector on the fly (as for a row never filled).
ALTER TABLE mailroom.messages ADD COLUMN search_version smallint;

COMMENT ON COLUMN mailroom.messages.search_version IS
'The definition of search_vector that filled it (mailroom._search_vector_version()); NULL: the first one, or not filled.';

CREATE TABLE mailroom.search_reindex (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    version smallint NOT NULL,
    after_id bigint NOT NULL
);

COMMENT ON TABLE mailroom.search_reindex IS
'reindex_messages'' cursor: the vector definition it rebuilds for and the last message id it walked past.';

INSERT INTO mailroom.search_reindex (only_row, version, after_id) VALUES (true, 0, 0)
ON CONFLICT (only_row) DO NOTHING;

-- one term of a parsed query (mailroom._search_terms): terms of one grp are OR-ed, groups AND-ed
CREATE TYPE mailroom.search_term AS (
    grp integer,
    negated boolean,
    kind text,
    weights text,
    lexemes text [],
    prefix boolean,
    phrase tsquery,
    at timestamptz
);

COMMENT ON TYPE mailroom.search_term IS
'A parsed search term: kind word (lexemes matched in the weights'' lexemes, as prefix or substring), phrase, read, unread, attachment, tag, before, after.';

-- the vector function takes the recipient too: sql/ re-creates it
DROP FUNCTION IF EXISTS mailroom._message_search_vector(text, text, text, text, text);

INSERT INTO mailroom.error_codes (code, area, kind, meaning, smtp_reply, verdict) VALUES
('MR225', 'inboxes', 'usage', 'a search query is at most 1000 characters', null, null),
('MR226', 'inboxes', 'usage', 'a search query has at most 16 terms', null, null),
(
    'MR227', 'inboxes', 'usage',
    'a search qualifier with a value it does not take (is:read|unread, has:attachment, before:/after: YYYY-MM-DD)',
    null, null
)
ON CONFLICT (code) DO NOTHING;
