"""The inboxes' HTTP face: `mailroom http serve` (REST API, web page, live events, SES hook)."""
