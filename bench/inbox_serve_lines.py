"""`python -m bench.inbox_serve_lines inbox serve ...`: `mailroom inbox serve` reading DATA line by
line (InboundSMTP.bulk_data = False, the reader before the block reader), for the A/B rows of
bench_inboxes (same server, same run)."""

from mailroom.cli import main
from mailroom.inboxes.smtp import InboundSMTP

InboundSMTP.bulk_data = False
main()
