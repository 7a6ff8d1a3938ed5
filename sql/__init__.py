"""Resource package mailroom.db.sql: the function files ship inside the wheel (pyproject.toml)."""
