"""Resource package mailroom.db.migrations: the numbered migration files ship inside the wheel (pyproject.toml)."""
