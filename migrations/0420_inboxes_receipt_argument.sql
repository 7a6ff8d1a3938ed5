-- Issue 37, item 3: the inbound server's DATA step is ONE autocommit statement, one round trip.
-- deliver_messages takes the delivery receipt's key as its last argument (p_receipt, default
-- null) and records the receipt itself, in the statement's own transaction; before, the server
-- sent set_delivery_receipt(key) and deliver_messages in a pipeline (its Flush, then its Sync: two
-- round trips). deliver_messages(..., p_parsed jsonb[]) is new since 0.1.0 (migration 0410,
-- unreleased), so it changes in place: no deprecated form. Calls without the key resolve to the
-- new function (set_delivery_receipt still works for them).
DROP FUNCTION IF EXISTS mailroom.deliver_messages(integer[], text[], bytea[], text[], jsonb[]);
-- the receipt's writer takes the key as an argument (the setting of set_delivery_receipt when null)
DROP FUNCTION IF EXISTS mailroom_internal._record_delivery_receipt(text[]);
