"""`pytest tests/workers/test_queue.py::test_select_for_update_skip_locked` (the seed's acceptance
command): tests/outbound/test_queue.py's test, run here unchanged. Concurrent claims take disjoint
rows without waiting on each other's locks; a row locked by anyone else is skipped."""

from workers._outbound import suite

test_select_for_update_skip_locked = suite("test_queue").test_select_for_update_skip_locked
