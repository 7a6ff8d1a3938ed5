"""Checks of the mail itself (issue 35 item 3, docs/checks.md): the HTML compatibility check
(html.py, caniemail's data in data/), the link check (links.py) and the spam score (spam.py).

The HTTP face reads what a check needs in one SQL call (http_message_check) and runs the check
here, at its edge, within the bounds each module states.
"""
