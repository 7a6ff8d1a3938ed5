"""The database: the embedded cluster, migrations, where to connect, connections and LISTEN."""
