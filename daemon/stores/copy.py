"""`ctxd copy --from sqlite:DIR --to postgres:DSN`: an embedded archive into PostgreSQL.

Archived rows keep their ids (batches, messages, tool calls), so summaries, pins of
provenance and clients' cursors stay true. The copy goes in batch-id order, a chunk of
batches per transaction; a copy cut short (killed, the server gone) is resumed by running
it again: it starts after the highest batch already in PostgreSQL, after checking that
batch's digest matches, so nothing is copied twice and nothing is skipped. The rows that
change (active contexts, pins, runs, approvals, the compaction log) are then upserted, so
running the copy again refreshes them. The target must be empty or hold only an earlier
copy of the same archive: a batch id that holds other data there stops the copy.

It reads the SQLite file and writes through the PostgreSQL store's parts, so it stands
beside both engines' folders, not in either (neither imports the other); the CLI
imports it for `ctxd copy` alone, so the embedded path never loads psycopg for it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import apsw

from ctxd.daemon.messages import message_text
from ctxd.daemon.stores.postgres import schema, tsearch
from ctxd.daemon.stores.postgres.connection import PgConnection
from ctxd.daemon.stores.postgres.ids import CATCH_UP
from ctxd.daemon.stores.sqlite.schema import SCHEMA_VERSION as SQLITE_VERSION

CHUNK_BATCHES = 200

# the rows that change, with their primary key: copied by upsert
_MUTABLE = {
    "conversation_context": (
        "session_id",
        "session_id, version, system_ids, tail_start_id, summary, summary_tokens, "
        "active_messages, active_tokens, compaction_count, last_compacted_at, updated_at, "
        "base_id, dropped_ids",
    ),
    "pins": ("id", "id, session_id, text, created_at"),
    "runs": ("id", "id, session_id, status, started_at, finished_at"),
    "approvals": (
        "id",
        "id, session_id, run_id, tool_call_id, tool_name, arguments, status, reason, "
        "created_at, resolved_at",
    ),
    "compactions": (
        "id",
        "id, session_id, trigger, started_at, duration_ms, before_messages, before_tokens, "
        "after_messages, after_tokens, effective, committed, summarized_from, "
        "summarized_to, summarizer, instructions, error",
    ),
}


class CopyError(RuntimeError):
    pass


def _source(data_dir: Path) -> apsw.Connection:
    path = Path(data_dir) / "ctxd.db"
    if not path.exists():
        raise CopyError(f"{path}: no ctxd database there (expected sqlite:DATA_DIR)")
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    conn.set_busy_timeout(10_000)
    version = int(conn.pragma("user_version"))
    if version != SQLITE_VERSION:
        conn.close()
        raise CopyError(
            f"{path}: schema version {version}, this ctxd copies version {SQLITE_VERSION}: "
            "run `ctxd migrate` on it (or start its daemon once) first"
        )
    return conn


def copy_sqlite_to_postgres(
    data_dir: Path, dsn: str, password: str | None = None, *,
    max_batches: int | None = None, chunk: int = CHUNK_BATCHES,
) -> dict[str, int]:
    """Copy (or resume copying) the archive of `data_dir` into the database `dsn`.
    `max_batches` stops after that many batches (a copy cut short, for tests)."""
    src = _source(data_dir)
    pg = PgConnection(dsn, password)
    try:
        schema.migrate(pg.raw())
        return _copy(src, pg, max_batches, chunk)
    finally:
        pg.close()
        src.close()


def _copy(
    src: apsw.Connection, pg: PgConnection, max_batches: int | None, chunk: int
) -> dict[str, int]:
    counts = {"sessions": 0, "batches": 0, "messages": 0}
    with pg.transaction():
        for row in src.execute("SELECT id, title, metadata, created_at FROM sessions"):
            cur = pg.execute(
                "INSERT INTO sessions(id, title, metadata, created_at) VALUES (?,?,?,?) "
                "ON CONFLICT (id) DO NOTHING", row,
            )
            counts["sessions"] += cur.rowcount
    done = pg.execute("SELECT max(id) FROM batches").fetchone()[0] or 0
    if done:
        theirs = pg.execute("SELECT digest FROM batches WHERE id = ?", (done,)).fetchone()[0]
        ours = src.execute("SELECT digest FROM batches WHERE id = ?", (done,)).fetchone()
        if ours is None or ours[0] != theirs:
            raise CopyError(
                f"the target already holds batch {done}, which is not this archive's: copy "
                "into an empty database (or one holding an earlier copy of this archive)"
            )
    left = max_batches
    while left is None or left > 0:
        n = chunk if left is None else min(chunk, left)
        batches = list(src.execute(
            "SELECT id, session_id, client_batch_id, run_id, digest, first_message_id, "
            "last_message_id, created_at FROM batches WHERE id > ? ORDER BY id LIMIT ?",
            (done, n),
        ))
        if not batches:
            break
        lo, hi = batches[0][0], batches[-1][0]
        messages = list(src.execute(
            "SELECT id, session_id, batch_id, role, body, tokens, created_at FROM messages "
            "WHERE batch_id BETWEEN ? AND ? ORDER BY id", (lo, hi),
        ))
        first, last = batches[0][5], batches[-1][6]
        with pg.transaction():
            pg.executemany("INSERT INTO batches VALUES (?,?,?,?,?,?,?,?)", batches)
            pg.executemany("INSERT INTO messages VALUES (?,?,?,?,?,?,?)", messages)
            pg.executemany(
                "INSERT INTO messages_search(message_id, part, tsv) VALUES (?,?,?::tsvector)",
                [
                    (m[0], part, lit)
                    for m in messages
                    for part, lit in enumerate(
                        tsearch.tsvector_parts(message_text(json.loads(m[4])))
                    )
                ],
            )
            for table, col in (("tool_calls", "call_message_id"),
                               ("tool_results", "result_message_id")):
                pg.executemany(
                    f"INSERT INTO {table} VALUES (?,?,?)",
                    list(src.execute(
                        f"SELECT session_id, tool_call_id, {col} FROM {table} "  # noqa: S608
                        f"WHERE {col} BETWEEN ? AND ?", (first, last),
                    )),
                )
        counts["batches"] += len(batches)
        counts["messages"] += len(messages)
        done = hi
        if left is not None:
            left -= len(batches)
    # the ids daemons allocate next come after the copied ones
    pg.execute(CATCH_UP)
    if max_batches is None or left is None or left > 0:
        _copy_mutable(src, pg, counts)
    if counts["messages"]:
        # fresh statistics after a bulk load: with those of the empty tables the planner
        # reads a session's tail through the primary key, walking every other session's
        # newer rows, instead of through messages_by_session
        pg.execute("ANALYZE")
    return counts


def _copy_mutable(src: apsw.Connection, pg: PgConnection, counts: dict[str, Any]) -> None:
    with pg.transaction():
        for table, (key, cols) in _MUTABLE.items():
            names = [c.strip() for c in cols.split(",")]
            # runs closed first: a run the copy opens must not meet the run it closes
            # in the one-open-run index
            order = " ORDER BY status = 'open'" if table == "runs" else ""
            rows = list(src.execute(f"SELECT {cols} FROM {table}{order}"))  # noqa: S608
            update = ", ".join(f"{c} = excluded.{c}" for c in names if c != key)
            pg.executemany(
                f"INSERT INTO {table}({cols}) VALUES ({','.join('?' * len(names))}) "
                f"ON CONFLICT ({key}) DO UPDATE SET {update}",
                rows,
            )
            counts[table] = len(rows)
