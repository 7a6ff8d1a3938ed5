"""mailroom: a PostgreSQL-native mail lifecycle engine (thin Python driver)."""

__version__ = "0.2.0.dev0"
