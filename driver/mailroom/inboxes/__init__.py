"""Expiring inboxes: the inbound SMTP server, MIME parsing, expiry and the inbox commands."""
