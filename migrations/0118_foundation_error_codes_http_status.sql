-- The HTTP face answers each code with a status; where the status says more than the code's kind
-- (mailroom.core.errors' kind → status map), the row says which (issue 22: no MR code in Python).
ALTER TABLE mailroom.error_codes
ADD COLUMN http_status smallint CHECK (http_status BETWEEN 400 AND 599);

COMMENT ON COLUMN mailroom.error_codes.http_status IS
'The HTTP status mailroom http serve answers for the code when its kind''s status says less (NULL: the kind''s).';

UPDATE mailroom.error_codes AS e
SET http_status = v.status
FROM (VALUES ('MR240', 401), ('MR241', 401), ('MR207', 413), ('MR243', 429), ('MR212', 408)) AS v (code, status)
WHERE e.code = v.code;

-- error_codes() returns the column too; http_check_message takes p_last (the long poll's last look
-- raises MR212 instead of returning NULL): sql/ re-creates both
DROP FUNCTION IF EXISTS mailroom.error_codes();
DROP FUNCTION IF EXISTS mailroom.http_check_message(text, text, bytea, text);
