-- Issue 45, item 2: a fault harms only its owner. deliver_messages answers one more column,
-- faults_skipped: the DATA-stage faults (data, after_data) it did not apply to a message because not
-- every recipient belongs to the fault's owner (sql/24_faults.sql, _transaction_fault). A result's
-- columns cannot change in place: dropped here, re-created by sql/21_delivery.sql in the same
-- transaction, with its grant. The columns it answered keep their names, types and order, so the
-- previous release's server (which selects them by name) keeps working.
DROP FUNCTION IF EXISTS mailroom.deliver_messages(integer[], text[], bytea[], text[], jsonb[], uuid);
