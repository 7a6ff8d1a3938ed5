"""Resource package mailroom.db.pgtap: the pgTAP suite ships inside the wheel for `mailroom db verify` (pyproject.toml)."""
