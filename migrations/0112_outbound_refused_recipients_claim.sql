-- Issue 22: when a relay refuses every recipient of a message at RCPT, finalize_messages decides
-- which refusal governs (retry or fail), from the refusals record_refused_recipients recorded for that
-- very attempt: each refusal row keeps the claim token it was recorded under.
ALTER TABLE mailroom.outbound_bounces ADD COLUMN claim_token bigint;

COMMENT ON COLUMN mailroom.outbound_bounces.claim_token IS
'For a recipient refused at RCPT (action refused): the claim token of the attempt, so finalize_messages finds that attempt''s refusals.';
