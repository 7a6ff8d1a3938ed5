-- Issue 44, item 5: a check that is off says how to turn it on (the spam tab showed only "off"):
-- MR280 and MR281's meanings name `mailroom run` too, and MR281 how to get a spamd.
UPDATE mailroom.error_codes
SET meaning = 'the link check is off on this server (--link-check: mailroom http serve, or mailroom run with --http-port)'
WHERE code = 'MR280';
UPDATE mailroom.error_codes
SET meaning = 'the spam check is off on this server (run SpamAssassin''s spamd, e.g. apt install spamd, then --spamd host:port: mailroom http serve, or mailroom run with --http-port)'
WHERE code = 'MR281';
