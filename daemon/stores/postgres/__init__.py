"""The PostgreSQL store: one archive shared by several daemons (the `postgres` extra).

Nothing here is imported on the embedded (SQLite) path, so a default install neither
needs psycopg nor pays for it.
"""
