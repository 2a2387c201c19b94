"""Shared SQL: the statements both stores run, SQLite and PostgreSQL alike, with `?`
parameters (PgConnection turns them into psycopg's), and the Python around them; each
engine's folder (sqlite/, postgres/) subclasses these parts with only what is its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class SqlConnection(Protocol):
    """What the shared SQL asks of a connection: an APSW connection, or a `PgConnection`
    (stores/postgres/connection.py), which takes the same `?` parameters and gives back
    a cursor to iterate or `fetchone`."""

    def execute(self, statement: str, bindings: Sequence[Any] = ...) -> Any: ...
