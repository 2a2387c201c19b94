"""The embedded SQLite store (the default): `store.SqliteStore` over one APSW connection.

`archive` (with `archive_search`, `search`, `fts`, `snippets`) holds the messages and
their full-text index, `context_store` the active contexts, `runs` the runs and
approvals, `compaction_log` every compaction attempt, `schema` the tables and their
migrations. Nothing is imported here, so a module of the package can be imported alone.
"""
