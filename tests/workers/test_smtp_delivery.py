"""`pytest tests/workers/test_smtp_delivery.py::test_successful_smtp_dispatch` and
`::test_mime_multipart_construction` (the seed's acceptance commands): tests/outbound/
test_smtp_delivery.py's tests, run here unchanged against `mailroom send` and a real SMTP server
on 127.0.0.1."""

from workers._outbound import suite

_delivery = suite("test_smtp_delivery")
test_successful_smtp_dispatch = _delivery.test_successful_smtp_dispatch
test_mime_multipart_construction = _delivery.test_mime_multipart_construction
