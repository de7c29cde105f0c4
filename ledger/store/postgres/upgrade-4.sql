-- Format 4 -> 5, in the transaction that then runs schema.sql again (idempotent) and roles.sql.
-- Format 4 notified `<schema>_appended` from a row trigger on head; format 5's append
-- functions (append_one, append_batches) and import's move_head NOTIFY themselves, which
-- spares every append a trigger call. schema.sql then adds append_one and event_hash and
-- replaces append_batches and check_growth. No event is touched.
DROP TRIGGER IF EXISTS head_notify ON {s}.head;
DROP FUNCTION IF EXISTS {s}.notify_append();
