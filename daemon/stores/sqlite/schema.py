"""The database schema, in one place, as numbered migrations (PRAGMA user_version).

Migration 1 is the archive: sessions, batches, messages, tool calls and the FTS index.
Archived rows are append-only: triggers refuse UPDATE and DELETE on them, so no code
path can rewrite history. Migration 2 adds the replaceable active context, pins, runs,
approvals and the compaction log.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import apsw

from ctxd.protocol.errors import StorageError

MIGRATIONS: list[str] = [
    # 1: the archive
    """
    CREATE TABLE sessions (
        id          TEXT PRIMARY KEY,
        title       TEXT,
        metadata    TEXT,              -- JSON object
        created_at  REAL NOT NULL
    );
    CREATE TABLE batches (
        id               INTEGER PRIMARY KEY,
        session_id       TEXT NOT NULL REFERENCES sessions(id),
        client_batch_id  TEXT,
        run_id           TEXT,
        digest           TEXT NOT NULL,   -- sha256 of the appended messages
        first_message_id INTEGER NOT NULL,
        last_message_id  INTEGER NOT NULL,
        created_at       REAL NOT NULL
    );
    CREATE UNIQUE INDEX batches_client_id ON batches(session_id, client_batch_id)
        WHERE client_batch_id IS NOT NULL;
    CREATE TABLE messages (
        id          INTEGER PRIMARY KEY,  -- global, increasing
        session_id  TEXT NOT NULL,
        batch_id    INTEGER NOT NULL,
        role        TEXT NOT NULL,
        body        TEXT NOT NULL,        -- the message as JSON, OpenAI shape
        tokens      INTEGER NOT NULL,
        created_at  REAL NOT NULL
    );
    CREATE INDEX messages_by_session ON messages(session_id, id);
    CREATE TABLE tool_calls (
        session_id         TEXT NOT NULL,
        tool_call_id       TEXT NOT NULL,
        call_message_id    INTEGER NOT NULL,
        PRIMARY KEY (session_id, tool_call_id)
    ) WITHOUT ROWID;
    CREATE TABLE tool_results (
        session_id         TEXT NOT NULL,
        tool_call_id       TEXT NOT NULL,
        result_message_id  INTEGER NOT NULL,
        PRIMARY KEY (session_id, tool_call_id)
    ) WITHOUT ROWID;
    -- The search text is the message text with CJK characters split apart, so the
    -- built-in unicode61 tokenizer (C speed) indexes one token per Han character.
    CREATE VIRTUAL TABLE messages_fts USING fts5(
        body, tokenize = 'unicode61 remove_diacritics 2'
    );
    CREATE TRIGGER messages_append_only_u BEFORE UPDATE ON messages
        BEGIN SELECT RAISE(ABORT, 'archived messages are append-only'); END;
    CREATE TRIGGER messages_append_only_d BEFORE DELETE ON messages
        BEGIN SELECT RAISE(ABORT, 'archived messages are append-only'); END;
    CREATE TRIGGER batches_append_only_u BEFORE UPDATE ON batches
        BEGIN SELECT RAISE(ABORT, 'archived batches are append-only'); END;
    CREATE TRIGGER batches_append_only_d BEFORE DELETE ON batches
        BEGIN SELECT RAISE(ABORT, 'archived batches are append-only'); END;
    CREATE TRIGGER tool_calls_append_only_d BEFORE DELETE ON tool_calls
        BEGIN SELECT RAISE(ABORT, 'archived tool calls are append-only'); END;
    CREATE TRIGGER tool_results_append_only_d BEFORE DELETE ON tool_results
        BEGIN SELECT RAISE(ABORT, 'archived tool results are append-only'); END;
    """,
    # 2: the active context and what governs it
    """
    CREATE TABLE conversation_context (
        session_id        TEXT PRIMARY KEY REFERENCES sessions(id),
        version           INTEGER NOT NULL,   -- bumped whenever the context is replaced
        system_ids        TEXT NOT NULL,      -- JSON list: the leading system messages
        tail_start_id     INTEGER,            -- first archived id of the exact tail
        summary           TEXT,               -- JSON of the structured summary
        summary_tokens    INTEGER NOT NULL DEFAULT 0,
        active_messages   INTEGER NOT NULL,   -- kept current so status is O(1)
        active_tokens     INTEGER NOT NULL,
        compaction_count  INTEGER NOT NULL DEFAULT 0,
        last_compacted_at REAL,
        updated_at        REAL NOT NULL
    );
    CREATE TABLE pins (
        id          TEXT PRIMARY KEY,
        session_id  TEXT NOT NULL REFERENCES sessions(id),
        text        TEXT NOT NULL,
        created_at  REAL NOT NULL
    );
    CREATE INDEX pins_by_session ON pins(session_id, created_at);
    CREATE TABLE runs (
        id          TEXT PRIMARY KEY,
        session_id  TEXT NOT NULL REFERENCES sessions(id),
        status      TEXT NOT NULL,   -- open|completed|failed|cancelled|interrupted
        started_at  REAL NOT NULL,
        finished_at REAL
    );
    CREATE INDEX runs_open ON runs(session_id) WHERE status = 'open';
    CREATE TABLE approvals (
        id            TEXT PRIMARY KEY,
        session_id    TEXT NOT NULL REFERENCES sessions(id),
        run_id        TEXT NOT NULL,
        tool_call_id  TEXT NOT NULL,
        tool_name     TEXT,
        arguments     TEXT,          -- JSON
        status        TEXT NOT NULL, -- pending|approved|denied
        reason        TEXT,
        created_at    REAL NOT NULL,
        resolved_at   REAL
    );
    CREATE INDEX approvals_by_session ON approvals(session_id, status);
    CREATE TABLE compactions (
        id               TEXT PRIMARY KEY,
        session_id       TEXT NOT NULL,
        trigger          TEXT NOT NULL,  -- auto|manual|rebuild
        started_at       REAL NOT NULL,
        duration_ms      REAL,
        before_messages  INTEGER,
        before_tokens    INTEGER,
        after_messages   INTEGER,
        after_tokens     INTEGER,
        effective        INTEGER NOT NULL DEFAULT 0,
        committed        INTEGER NOT NULL DEFAULT 0,
        summarized_from  INTEGER,
        summarized_to    INTEGER,
        summarizer       TEXT,
        instructions     TEXT,
        error            TEXT
    );
    CREATE INDEX compactions_by_session ON compactions(session_id, started_at);
    """,
    # 3: context/clear and context/pop
    """
    ALTER TABLE conversation_context ADD COLUMN base_id INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE conversation_context ADD COLUMN dropped_ids TEXT;  -- JSON list or NULL
    """,
]

SCHEMA_VERSION = len(MIGRATIONS)


def open_database(
    path: Path | str, *, durability: str = "normal", target_version: int = SCHEMA_VERSION
) -> apsw.Connection:
    """Open (creating if needed) the database, set pragmas, apply pending migrations."""
    # The archive is private: create the file 0600 before SQLite does (its -wal and -shm
    # files take the database file's mode).
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    conn = apsw.Connection(str(path))
    conn.set_busy_timeout(10_000)
    conn.pragma("journal_mode", "wal")
    # NORMAL in WAL mode: a committed transaction survives a process crash; FULL also
    # survives power loss, at the cost of an fsync per commit.
    conn.pragma("synchronous", "full" if durability == "full" else "normal")
    conn.pragma("foreign_keys", True)
    migrate(conn, target_version)
    return conn


def migrate(conn: apsw.Connection, target_version: int = SCHEMA_VERSION) -> int:
    current = int(conn.pragma("user_version"))
    if current > SCHEMA_VERSION:
        raise RuntimeError(
            f"database schema version {current} is newer than this ctxd "
            f"({SCHEMA_VERSION}); upgrade ctxd"
        )
    for version in range(current + 1, target_version + 1):
        with conn:  # one transaction per migration
            conn.execute(MIGRATIONS[version - 1])
            conn.pragma("user_version", version)
    return int(conn.pragma("user_version"))


# SQLite gives up a write for these reasons; the caller can do something about each.
_STORAGE_ERRORS = (
    apsw.FullError,
    apsw.ReadOnlyError,
    apsw.IOError,
    apsw.CantOpenError,
    apsw.CorruptError,
    apsw.NotADBError,
)


@contextmanager
def transaction(conn: apsw.Connection) -> Iterator[None]:
    """One explicit write transaction; storage failures become a typed `StorageError`.

    On SQLITE_FULL SQLite rolls the transaction back by itself, so the savepoint's own
    ROLLBACK then fails with "no transaction is active": that too means nothing was
    written.
    """
    try:
        with conn:
            yield
    except _STORAGE_ERRORS as exc:
        raise StorageError(_storage_message(exc), {"reason": type(exc).__name__}) from None
    except apsw.SQLError as exc:
        if "no transaction is active" not in str(exc):
            raise
        raise StorageError(_storage_message(exc), {"reason": "FullError"}) from None


@contextmanager
def thread_transaction(conn: apsw.Connection) -> Iterator[None]:
    """`transaction` for a worker thread's own connection. BEGIN IMMEDIATE and COMMIT
    run as statements, and APSW lets other threads run while a statement steps; leaving
    `with conn` commits holding the GIL (half a second for a 40 MB batch: the event
    loop's half second). IMMEDIATE takes the write lock first (waiting out another
    writer within the busy timeout), so what is read inside is what is committed on."""
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
            conn.execute("COMMIT")
        except BaseException:
            if not conn.getautocommit():  # (SQLITE_FULL has rolled back by itself)
                conn.execute("ROLLBACK")
            raise
    except _STORAGE_ERRORS as exc:
        raise StorageError(_storage_message(exc), {"reason": type(exc).__name__}) from None


def _storage_message(exc: Exception) -> str:
    if isinstance(exc, apsw.ReadOnlyError):
        what = "the database is read-only"
    elif isinstance(exc, apsw.FullError | apsw.SQLError):
        what = "the disk (or the database's size limit) is full"
    elif isinstance(exc, apsw.IOError):
        what = "the database could not be written (I/O error: is the disk full?)"
    else:
        what = f"the database could not be written ({type(exc).__name__})"
    return f"{what}; nothing was written: fix it and send the request again"
