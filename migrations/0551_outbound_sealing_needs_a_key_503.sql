-- Attacker review of issue 45: POST /api/v1/webhooks on an installation without a sender key answered
-- 500 "internal error" (MR313 is a configuration error, whose kind the HTTP face answers 500) and its
-- words spoke of SMTP passwords. The caller can do nothing about it and the operator can: 503 with
-- mailroom's own words, which name both secrets the sender key seals (sql/30_outbound_senders.sql).
UPDATE mailroom.error_codes
SET
    meaning = 'a secret (a relay password, a webhook secret) needs a sender key to be stored',
    http_status = 503
WHERE code = 'MR313';
