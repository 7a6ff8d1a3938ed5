"""Resource package mailroom.db.sql.citus: the distributed layout a Citus coordinator gets (docs/scale.md)."""
