-- Issue 45: the checks of a message (http_message_check, sql/29_checks.sql) take one from the API
-- key's and one from the inbox's rate (sql/09_rates.sql); over either, MR020 (HTTP 429).
INSERT INTO mailroom.settings (name, value, description, kind, min_value, max_value)
VALUES
(
    'checks.rate_per_key', '60/min',
    'checks (html, links, spam) an API key may ask for: "N/min" or "N/h"; over it MR020 (HTTP 429)',
    'rate', null, '1000000'
),
(
    'checks.rate_per_inbox', '20/min',
    'checks of the messages of one inbox: "N/min" or "N/h"; over it MR020 (HTTP 429)',
    'rate', null, '1000000'
)
ON CONFLICT (name) DO NOTHING;
