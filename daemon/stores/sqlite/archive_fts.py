"""SqliteArchive: the archive on SQLite, with its full-text index (FTS5).

The SQL both stores run is `SqlArchive`'s (stores/sql/archive.py); here is what is
SQLite's: a batch written with its `messages_fts` rows, ids taken as max(id) + 1 under
the one writer, a session's tail read by (session_id, id), and search through FTS5 with
a time budget kept by SQLite's progress handler. Queries are built by `fts.py`,
snippets by `snippets.py`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import apsw

from ctxd.daemon.messages import message_text
from ctxd.daemon.stores.records import SearchHitRecord
from ctxd.daemon.stores.sql.archive import INSERT_BATCH, SqlArchive, message_from_row, tool_links
from ctxd.daemon.stores.sql.search import SearchPage, search_where, too_broad
from ctxd.daemon.stores.sql.search_text import clean_snippet, index_text
from ctxd.daemon.stores.sqlite import fts
from ctxd.daemon.stores.sqlite.snippets import Snippets
from ctxd.protocol.errors import InvalidParams

# SQLite virtual-machine steps between two looks at the clock: about a millisecond of work
PROGRESS_STEPS = 10_000


@contextmanager
def _budget(conn: apsw.Connection, seconds: float | None) -> Iterator[float | None]:
    """Interrupt the statements run inside when `seconds` have passed; yields the
    deadline (time.monotonic) for work done outside `conn`, None without a budget."""
    if not seconds:
        yield None
        return
    deadline = time.monotonic() + seconds
    conn.set_progress_handler(lambda: time.monotonic() > deadline, PROGRESS_STEPS)
    try:
        yield deadline
    except apsw.InterruptError:
        raise too_broad(seconds) from None
    finally:
        conn.set_progress_handler(None)


# a session's messages from an id on (its tail), and within a range of ids
READ_FROM = (
    "SELECT id, batch_id, body, tokens, created_at FROM messages "
    "WHERE session_id = ? AND id >= ? ORDER BY id"
)
READ_RANGE = (
    "SELECT id, batch_id, body, tokens, created_at FROM messages "
    "WHERE session_id = ? AND id >= ? AND id <= ? ORDER BY id"
)


class SqliteArchive(SqlArchive):
    conn: apsw.Connection
    # FTS5 match queries from the user's text
    queries = fts

    def __init__(self, conn: apsw.Connection) -> None:
        super().__init__(conn)
        self.snippets = Snippets()

    def append(
        self,
        session_id: str,
        messages: Sequence[tuple[dict[str, Any], str, int]],
        *,
        digest: str,
        run_id: str | None,
        client_batch_id: str | None,
        index_texts: Sequence[str] | None = None,
    ) -> tuple[int, list[int], float]:
        """Write one batch: (normalized message, JSON body, tokens) each. Returns
        (batch id, message ids, created_at). Must run inside a transaction.
        `index_texts` are the messages' `index_text`, when computed beforehand."""
        now = time.time()
        last_message, last_batch = self.conn.execute(
            "SELECT (SELECT max(id) FROM messages), (SELECT max(id) FROM batches)"
        ).fetchone()
        first = (last_message or 0) + 1
        ids = list(range(first, first + len(messages)))
        batch_id = (last_batch or 0) + 1
        self._insert_batch(
            session_id, messages, ids, batch_id, digest, run_id, client_batch_id, now
        )
        self.conn.executemany(
            "INSERT INTO messages_fts(rowid, body) VALUES (?, ?)",
            [
                (i, index_text(message_text(m)) if index_texts is None else text)
                for i, (m, _, _), text in zip(
                    ids, messages, index_texts or [None] * len(ids), strict=True
                )
            ],
        )
        self._index_tool_calls(session_id, messages, ids)
        return batch_id, ids, now

    def _insert_batch(
        self,
        session_id: str,
        messages: Sequence[tuple[dict[str, Any], str, int]],
        ids: Sequence[int],
        batch_id: int,
        digest: str,
        run_id: str | None,
        client_batch_id: str | None,
        now: float,
    ) -> None:
        """The `batches` row and the `messages` rows of an append (PostgreSQL writes
        them as arrays: stores/postgres/batch_rows.py)."""
        self.conn.execute(
            INSERT_BATCH,
            (batch_id, session_id, client_batch_id, run_id, digest, ids[0], ids[-1], now),
        )
        self.conn.executemany(
            "INSERT INTO messages(id, session_id, batch_id, role, body, tokens, created_at) "
            "VALUES (?,?,?,?,?,?,?)",
            [
                # a message that brings its own time (an imported one) keeps it
                (i, session_id, batch_id, m["role"], body, tokens, m.get("createdAt", now))
                for i, (m, body, tokens) in zip(ids, messages, strict=True)
            ],
        )

    def _index_tool_calls(
        self,
        session_id: str,
        messages: Sequence[tuple[dict[str, Any], str, int]],
        ids: Sequence[int],
    ) -> None:
        """The rows of `tool_calls` and `tool_results` for an appended batch."""
        calls, results = tool_links(messages, ids)
        if calls:
            self.conn.executemany(
                "INSERT INTO tool_calls(session_id, tool_call_id, call_message_id) VALUES (?,?,?)",
                [(session_id, call, mid) for call, mid in calls],
            )
        if results:
            self.conn.executemany(
                "INSERT INTO tool_results(session_id, tool_call_id, result_message_id) "
                "VALUES (?,?,?)",
                [(session_id, call, mid) for call, mid in results],
            )

    def read_from(
        self, session_id: str, from_id: int, to_id: int | None = None
    ) -> list[dict[str, Any]]:
        """Every message of the session with from_id <= id (<= to_id)."""
        if to_id is None:
            rows = self.conn.execute(READ_FROM, (session_id, from_id))
        else:
            rows = self.conn.execute(READ_RANGE, (session_id, from_id, to_id))
        return [message_from_row(r) for r in rows]

    def get_many(self, ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        for i in range(0, len(ids), 500):
            chunk = list(ids[i : i + 500])
            marks = ",".join("?" * len(chunk))
            for row in self.conn.execute(
                f"SELECT id, batch_id, body, tokens, created_at FROM messages "  # noqa: S608
                f"WHERE id IN ({marks})",
                chunk,
            ):
                out[row[0]] = message_from_row(row)
        return out

    def message_count(self, session_id: str) -> int:
        return int(
            self.conn.execute(
                "SELECT count(*) FROM messages WHERE session_id = ?", (session_id,)
            ).fetchone()[0]
        )

    # search

    @contextmanager
    def _budget(self, seconds: float | None) -> Iterator[float | None]:
        """SQLite's progress handler stops the statements when `seconds` have passed."""
        with _budget(self.conn, seconds) as deadline:
            yield deadline

    def _search(self, match: str, page: SearchPage) -> list[SearchHitRecord]:
        """A page of hits, each with a snippet made by daemon/stores/sqlite/snippets.py (not by
        FTS5's snippet() in this query, whose cost grows with the square of a message's hits and
        which the progress handler cannot stop); past `page.deadline`, InterruptError."""
        where, params = search_where("messages_fts MATCH ?", match, page)
        order = "messages_fts.rowid DESC" if page.newest_first else "rank"
        sql = (
            "SELECT m.id, m.session_id, m.role, m.created_at, bm25(messages_fts) "
            "FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid "
            f"WHERE {where} ORDER BY {order} LIMIT ? OFFSET ?"
        )
        params += [page.limit, page.offset]
        try:
            rows = list(self.conn.execute(sql, params))
            texts = [self._indexed_text(row[0]) for row in rows]
        except UnicodeEncodeError:
            raise InvalidParams(
                "the search text contains a lone surrogate; send valid Unicode text"
            ) from None
        except apsw.SQLError as exc:
            hint = (
                "check the FTS5 query syntax, or search without advanced mode"
                if page.advanced
                else "report this query as a bug"
            )
            raise InvalidParams(f"search query not understood: {exc}; {hint}") from None
        return [
            SearchHitRecord(
                message_id=mid,
                session_id=sid,
                role=r,
                snippet=clean_snippet(self.snippets.make(match, text, page.deadline)),
                created_at=created,
                score=round(-score, 4),
            )
            for (mid, sid, r, created, score), text in zip(rows, texts, strict=True)
        ]

    def _indexed_text(self, message_id: int) -> str:
        row = self.conn.execute(
            "SELECT body FROM messages_fts WHERE rowid = ?", (message_id,)
        ).fetchone()
        return row[0] if row and row[0] is not None else ""
