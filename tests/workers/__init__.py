"""The seed's acceptance commands (outbound_worker.txt), as written: thin aliases of tests/outbound.

A package, so that its test_queue.py, test_smtp_delivery.py and test_backoff.py are the modules
workers.test_* and never collide with tests/outbound's of the same names in one pytest run.
"""
