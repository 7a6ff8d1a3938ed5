-- Issue 43, item 3 (the faces' error slips): a caller's regular expression that does not compile
-- answered the compiler's 2201B, which no tool description or error table listed; _caller_pattern
-- (sql/09_patterns.sql) now names it.
INSERT INTO mailroom.error_codes (code, area, kind, meaning, smtp_reply, verdict) VALUES
('MR034', 'foundation', 'usage', 'a caller''s regular expression does not compile', null, null)
ON CONFLICT (code) DO NOTHING;
