"""`pytest tests/workers/test_backoff.py::test_failed_smtp_call_updates_next_retry` (the seed's
acceptance command): tests/outbound/test_backoff.py's test, run here unchanged: a 4xx reply queues
the message again with next_retry_at = now + attempts² minutes (1, 4, 9 …), address-free error_log."""

from workers._outbound import suite

test_failed_smtp_call_updates_next_retry = suite("test_backoff").test_failed_smtp_call_updates_next_retry
