-- Issue 34 item 1: a pattern a caller supplies (extract_code's regular expression, the LIKE
-- patterns of extract_link and the subject filters of find/wait) is input, checked before it runs
-- by mailroom._caller_pattern (sql/09_patterns.sql): a length cap, no back-references, a bounded
-- count of quantifiers and wildcards, bounded repetition counts. Its refusals:
INSERT INTO mailroom.error_codes (code, area, kind, meaning, smtp_reply, verdict) VALUES
(
    'MR010', 'foundation', 'usage',
    'a regular expression refused before it runs: too long, a back-reference, too many quantifiers or a repetition count over the bound',
    null, null
),
(
    'MR011', 'foundation', 'usage',
    'a LIKE pattern refused before it runs: too long or too many % wildcards',
    null, null
)
ON CONFLICT (code) DO NOTHING;
