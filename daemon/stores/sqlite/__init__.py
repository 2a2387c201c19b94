"""The embedded SQLite store (the default): `store.SqliteStore` over one APSW connection.

What is SQLite's own, on top of the shared SQL (stores/sql/): `archive_fts` (with
`search`, `fts`, `snippets`) writes the messages with their FTS5 index and searches it,
`contexts` writes a context's row with INSERT OR REPLACE, `schema` makes the tables and
their migrations. Nothing is imported here, so a module of the package can be imported
alone.
"""
