"""The PostgreSQL schema, as numbered migrations kept in step with daemon/stores/sqlite/schema.py's.

Migrations 1-3 here hold what SQLite's migrations 1-3 hold, so the tables and columns
mean the same on both stores (`ctxd copy` relies on it); 4 adds an index only
PostgreSQL's plans need, 5 and 6 what daemons sharing a database lock and tell each
other through. The differences are PostgreSQL's own ways to give the same
guarantees:
- append-only: row triggers refuse UPDATE and DELETE on archived rows, a statement
  trigger refuses TRUNCATE;
- one open run per session: a partial UNIQUE index, so two daemons racing to open a run
  cannot both succeed (SQLite's single writer made a plain index enough);
- search: `messages_search` holds a tsvector built by ctxd's own tokenizer
  (stores/postgres/tsearch.py), not PostgreSQL's parser, so Chinese and Japanese are split the
  same way as in the SQLite index whatever the server's locale.
The applied version lives in `ctxd_schema`; migrations run under a lock on that table
so daemons starting together apply each one exactly once.
"""

from __future__ import annotations

from typing import Any

MIGRATIONS: list[str] = [
    # 1: the archive
    """
    CREATE FUNCTION ctxd_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION 'archived % are append-only', TG_ARGV[0]
            USING ERRCODE = 'restrict_violation';
    END $$;
    CREATE TABLE sessions (
        id          TEXT PRIMARY KEY,
        title       TEXT,
        metadata    TEXT,
        created_at  DOUBLE PRECISION NOT NULL
    );
    CREATE TABLE batches (
        id               BIGINT PRIMARY KEY,
        session_id       TEXT NOT NULL REFERENCES sessions(id),
        client_batch_id  TEXT,
        run_id           TEXT,
        digest           TEXT NOT NULL,
        first_message_id BIGINT NOT NULL,
        last_message_id  BIGINT NOT NULL,
        created_at       DOUBLE PRECISION NOT NULL
    );
    CREATE UNIQUE INDEX batches_client_id ON batches(session_id, client_batch_id)
        WHERE client_batch_id IS NOT NULL;
    CREATE SEQUENCE batch_ids;
    CREATE SEQUENCE message_ids;
    CREATE TABLE messages (
        id          BIGINT PRIMARY KEY,
        session_id  TEXT NOT NULL,
        batch_id    BIGINT NOT NULL REFERENCES batches(id),
        role        TEXT NOT NULL,
        body        TEXT NOT NULL,
        tokens      INTEGER NOT NULL,
        created_at  DOUBLE PRECISION NOT NULL
    );
    CREATE INDEX messages_by_session ON messages(session_id, id);
    CREATE TABLE tool_calls (
        session_id         TEXT NOT NULL,
        tool_call_id       TEXT NOT NULL,
        call_message_id    BIGINT NOT NULL,
        PRIMARY KEY (session_id, tool_call_id)
    );
    CREATE TABLE tool_results (
        session_id         TEXT NOT NULL,
        tool_call_id       TEXT NOT NULL,
        result_message_id  BIGINT NOT NULL,
        PRIMARY KEY (session_id, tool_call_id)
    );
    -- the search index, like SQLite's messages_fts: derived data, rebuildable
    -- (a long message is several overlapping parts, daemon/stores/postgres/tsearch.py)
    CREATE TABLE messages_search (
        message_id  BIGINT NOT NULL REFERENCES messages(id),
        part        INTEGER NOT NULL,
        tsv         TSVECTOR NOT NULL,
        PRIMARY KEY (message_id, part)
    );
    CREATE INDEX messages_search_tsv ON messages_search USING GIN (tsv);
    CREATE TRIGGER messages_append_only BEFORE UPDATE OR DELETE ON messages
        FOR EACH ROW EXECUTE FUNCTION ctxd_refuse_change('messages');
    CREATE TRIGGER messages_no_truncate BEFORE TRUNCATE ON messages
        FOR EACH STATEMENT EXECUTE FUNCTION ctxd_refuse_change('messages');
    CREATE TRIGGER batches_append_only BEFORE UPDATE OR DELETE ON batches
        FOR EACH ROW EXECUTE FUNCTION ctxd_refuse_change('batches');
    CREATE TRIGGER batches_no_truncate BEFORE TRUNCATE ON batches
        FOR EACH STATEMENT EXECUTE FUNCTION ctxd_refuse_change('batches');
    CREATE TRIGGER tool_calls_append_only BEFORE DELETE ON tool_calls
        FOR EACH ROW EXECUTE FUNCTION ctxd_refuse_change('tool calls');
    CREATE TRIGGER tool_results_append_only BEFORE DELETE ON tool_results
        FOR EACH ROW EXECUTE FUNCTION ctxd_refuse_change('tool results');
    """,
    # 2: the active context and what governs it
    """
    CREATE TABLE conversation_context (
        session_id        TEXT PRIMARY KEY REFERENCES sessions(id),
        version           BIGINT NOT NULL,
        system_ids        TEXT NOT NULL,
        tail_start_id     BIGINT,
        summary           TEXT,
        summary_tokens    INTEGER NOT NULL DEFAULT 0,
        active_messages   INTEGER NOT NULL,
        active_tokens     BIGINT NOT NULL,
        compaction_count  INTEGER NOT NULL DEFAULT 0,
        last_compacted_at DOUBLE PRECISION,
        updated_at        DOUBLE PRECISION NOT NULL
    );
    CREATE TABLE pins (
        id          TEXT PRIMARY KEY,
        session_id  TEXT NOT NULL REFERENCES sessions(id),
        text        TEXT NOT NULL,
        created_at  DOUBLE PRECISION NOT NULL
    );
    CREATE INDEX pins_by_session ON pins(session_id, created_at);
    CREATE TABLE runs (
        id          TEXT PRIMARY KEY,
        session_id  TEXT NOT NULL REFERENCES sessions(id),
        status      TEXT NOT NULL,
        started_at  DOUBLE PRECISION NOT NULL,
        finished_at DOUBLE PRECISION
    );
    -- at most one open run per session, whichever daemon opens it
    CREATE UNIQUE INDEX runs_open ON runs(session_id) WHERE status = 'open';
    CREATE TABLE approvals (
        id            TEXT PRIMARY KEY,
        session_id    TEXT NOT NULL REFERENCES sessions(id),
        run_id        TEXT NOT NULL,
        tool_call_id  TEXT NOT NULL,
        tool_name     TEXT,
        arguments     TEXT,
        status        TEXT NOT NULL CHECK (status IN ('pending', 'approved', 'denied')),
        reason        TEXT,
        created_at    DOUBLE PRECISION NOT NULL,
        resolved_at   DOUBLE PRECISION
    );
    CREATE INDEX approvals_by_session ON approvals(session_id, status);
    CREATE TABLE compactions (
        id               TEXT PRIMARY KEY,
        session_id       TEXT NOT NULL,
        trigger          TEXT NOT NULL,
        started_at       DOUBLE PRECISION NOT NULL,
        duration_ms      DOUBLE PRECISION,
        before_messages  INTEGER,
        before_tokens    BIGINT,
        after_messages   INTEGER,
        after_tokens     BIGINT,
        effective        INTEGER NOT NULL DEFAULT 0,
        committed        INTEGER NOT NULL DEFAULT 0,
        summarized_from  BIGINT,
        summarized_to    BIGINT,
        summarizer       TEXT,
        instructions     TEXT,
        error            TEXT
    );
    CREATE INDEX compactions_by_session ON compactions(session_id, started_at);
    """,
    # 3: context/clear and context/pop
    """
    ALTER TABLE conversation_context ADD COLUMN base_id BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE conversation_context ADD COLUMN dropped_ids TEXT;
    """,
    # 4: PostgreSQL's own: a session's batches by their last message, so a tail read
    # finds the id ranges holding the session's rows (daemon/stores/postgres/store.py, READ_TAIL)
    """
    CREATE INDEX batches_by_session_last ON batches(session_id, last_message_id);
    """,
    # 5: PostgreSQL's own: what other daemons wait for and hear about lives in rows of
    # ctxd's tables, which only ctxd's role can lock or write (advisory locks and NOTIFY
    # payloads are open to every role that may connect):
    # - id allocation: one counter row, advanced in a statement of its own, so appends
    #   to different sessions need not wait for each other (daemon/stores/postgres/ids.py);
    # - one compactor per session: the session's row here, locked by the compacting
    #   daemon for as long as it compacts (daemon/stores/postgres/locks.py);
    # - events across daemons: a row each, the NOTIFY only a wake-up (stores/postgres/events.py)
    """
    CREATE TABLE ctxd_ids (
        one              BOOLEAN PRIMARY KEY DEFAULT true CHECK (one),
        next_message_id  BIGINT NOT NULL,
        next_batch_id    BIGINT NOT NULL
    );
    INSERT INTO ctxd_ids(next_message_id, next_batch_id) SELECT
        coalesce((SELECT max(id) FROM messages), 0) + 1,
        coalesce((SELECT max(id) FROM batches), 0) + 1;
    CREATE TABLE compaction_locks (
        session_id  TEXT PRIMARY KEY
    );
    CREATE TABLE ctxd_events (
        id          BIGSERIAL PRIMARY KEY,
        origin      TEXT NOT NULL,
        session_id  TEXT NOT NULL,
        body        TEXT NOT NULL,
        created_at  DOUBLE PRECISION NOT NULL
    );
    CREATE INDEX ctxd_events_by_time ON ctxd_events(created_at);
    """,
    # 6: PostgreSQL's own: which daemon serves each open run, and which daemons live (a
    # daemon holds the row lock on its own row for as long as it lives; an open run whose
    # daemon's row is free is adopted by another daemon, stores/postgres/runs.py). A row each,
    # where an advisory lock per run could be held by any role that may connect.
    """
    CREATE TABLE ctxd_daemons (
        daemon_id   TEXT PRIMARY KEY,
        started_at  DOUBLE PRECISION NOT NULL
    );
    ALTER TABLE runs ADD COLUMN daemon_id TEXT;
    CREATE INDEX runs_open_by_daemon ON runs(daemon_id) WHERE status = 'open';
    """,
]

SCHEMA_VERSION = len(MIGRATIONS)

def current_version(conn: Any) -> int:
    row = conn.execute(
        "SELECT to_regclass('ctxd_schema') IS NOT NULL"
    ).fetchone()
    if not row[0]:
        return 0
    return int(conn.execute("SELECT version FROM ctxd_schema").fetchone()[0])


# how long a daemon starting beside another waits for that one's migrations
MIGRATION_WAIT_SECONDS = 120


def migrate(conn: Any, target_version: int = SCHEMA_VERSION) -> int:
    """Apply pending migrations, in one transaction; returns the version.

    `conn` is a psycopg connection in autocommit mode. A lock on `ctxd_schema` serializes
    daemons (and `ctxd migrate`) starting at the same time: a table lock, which only a
    role with rights on ctxd's tables can take, where an advisory key could be held by
    any role allowed to connect."""
    from psycopg import errors as pgerr

    try:
        conn.execute("CREATE TABLE IF NOT EXISTS ctxd_schema (version INTEGER NOT NULL)")
    except (pgerr.UniqueViolation, pgerr.DuplicateTable, pgerr.DuplicateObject):
        # another daemon created it at the same moment: the race shows as the table, its
        # row type ("type ctxd_schema already exists") or a catalog index's key
        pass
    with conn.transaction():
        conn.execute(f"SET LOCAL lock_timeout = '{MIGRATION_WAIT_SECONDS}s'")
        # building an index on a large archive may take longer than a request may
        conn.execute("SET LOCAL statement_timeout = 0")
        conn.execute("LOCK TABLE ctxd_schema IN EXCLUSIVE MODE")
        conn.execute(
            "INSERT INTO ctxd_schema SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM ctxd_schema)"
        )
        current = current_version(conn)
        if current > SCHEMA_VERSION:
            raise RuntimeError(
                f"database schema version {current} is newer than this ctxd "
                f"({SCHEMA_VERSION}); upgrade ctxd"
            )
        for version in range(current + 1, target_version + 1):
            conn.execute(MIGRATIONS[version - 1])
            conn.execute("UPDATE ctxd_schema SET version = %s", (version,))
    return current_version(conn)
