"""SqlArchive: the archive's SQL both stores run (sessions, reads, tool-call lookups).

The append-only record of every message. Nothing here updates or deletes an archived
row (triggers would refuse it anyway). What each store does its own way is in its
subclass: writing a batch with its search rows, reading a session's tail, counting, and
searching (`SqlSearch` runs the search over the store's own queries and SQL):
`SqliteArchive` (stores/sqlite/archive_fts.py) and `PgArchive` (stores/postgres/store.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ctxd.daemon.stores.records import SessionRecord
from ctxd.daemon.stores.sql import SqlConnection
from ctxd.daemon.stores.sql.search import SqlSearch
from ctxd.protocol.errors import InvalidParams


def strict_json(value: Any, what: str) -> str:
    """JSON text for storage; NaN, Infinity and lone surrogates are refused, since every
    reader must be able to parse what the archive returns."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
        text.encode("utf-8")
    except (ValueError, TypeError, RecursionError) as exc:
        raise InvalidParams(f"{what} is not storable as JSON: {exc}", {"param": what}) from None
    return text


# ids per `IN (...)` lookup: well under SQLite's bound-parameter limit
_CHUNK = 500
# a batch's own row, as both engines write it
INSERT_BATCH = (
    "INSERT INTO batches(id, session_id, client_batch_id, run_id, digest, "
    "first_message_id, last_message_id, created_at) VALUES (?,?,?,?,?,?,?,?)"
)


def tool_links(
    messages: Sequence[tuple[dict[str, Any], str, int]], ids: Sequence[int],
) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """A batch's rows of `tool_calls` (each call's id and the id of the message making
    it) and of `tool_results` (the call's id and the id of the message answering it)."""
    calls = [(c["id"], i) for i, (m, _, _) in zip(ids, messages, strict=True)
             for c in m.get("tool_calls") or ()]
    results = [(m["tool_call_id"], i) for i, (m, _, _) in zip(ids, messages, strict=True)
               if m["role"] == "tool"]
    return calls, results


_CALL_IDS = (
    "SELECT tool_call_id, call_message_id FROM tool_calls "
    "WHERE session_id = ? AND tool_call_id IN ({})"
)


def lookup_statements(
    sql: str, session_id: str, keys: Iterable[str]
) -> list[tuple[str, tuple[Any, ...]]]:
    """The statements `_lookup` sends for the keys (a store may send them ahead)."""
    wanted = sorted(set(keys))
    out = []
    for i in range(0, len(wanted), _CHUNK):
        chunk = wanted[i : i + _CHUNK]
        out.append((sql.format(",".join("?" * len(chunk))), (session_id, *chunk)))
    return out


_RESULT_IDS = (
    "SELECT tool_call_id, result_message_id FROM tool_results "
    "WHERE session_id = ? AND tool_call_id IN ({})"
)


def _within_bytes(rows: Iterable[Sequence[Any]], max_bytes: int | None) -> Iterator[Sequence[Any]]:
    """Rows while their bodies add up to at most `max_bytes` (the first one always).
    Stops reading at the first row past the bound, so a page of large messages is never
    loaded beyond it."""
    used = 0
    for row in rows:
        if max_bytes is not None:
            size = len(row[2].encode("utf-8", "surrogatepass"))
            if used and used + size > max_bytes:
                return
            used += size
        yield row


def message_from_row(row: Sequence[Any]) -> dict[str, Any]:
    msg_id, batch_id, body, tokens, created_at = row
    msg = json.loads(body)
    msg["id"] = msg_id
    msg["batchId"] = batch_id
    msg["tokens"] = tokens
    msg["createdAt"] = created_at
    return msg


class SqlArchive(SqlSearch):
    """The archive on one connection: an APSW connection, or a `PgConnection`, which
    takes the same `?` parameters."""

    def __init__(self, conn: SqlConnection) -> None:
        self.conn = conn

    # sessions

    def create_session(
        self,
        session_id: str,
        title: str | None,
        metadata: dict | None,
        created_at: float | None = None,
    ) -> float:
        """`created_at`: the session's own start (an imported transcript's), else now."""
        now = time.time() if created_at is None else created_at
        self.conn.execute(
            "INSERT INTO sessions(id, title, metadata, created_at) VALUES (?, ?, ?, ?)",
            (session_id, title, strict_json(metadata, "metadata") if metadata else None, now),
        )
        return now

    def get_session(self, session_id: str) -> SessionRecord | None:
        row = self.conn.execute(
            "SELECT id, title, metadata, created_at FROM sessions WHERE id = ?", (session_id,)
        ).fetchone()
        return self._session(row) if row else None

    def list_sessions(
        self, limit: int, after: tuple[float, str] | None, title: str | None = None
    ) -> list[SessionRecord]:
        """Newest first; `after` is the (created_at, id) of the last session already seen;
        `title` keeps only titles containing it (LIKE: ASCII letters in either case)."""
        where: list[str] = []
        args: list[Any] = []
        if after is not None:
            where.append("(created_at, id) < (?, ?)")
            args += [after[0], after[1]]
        if title:
            escaped = title.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            # lower() both: PostgreSQL's LIKE minds case, SQLite's does not (ASCII)
            where.append("lower(title) LIKE lower(?) ESCAPE '\\'")
            args.append(f"%{escaped}%")
        clause = f"WHERE {' AND '.join(where)} " if where else ""
        rows = self.conn.execute(
            "SELECT id, title, metadata, created_at FROM sessions "
            f"{clause}ORDER BY created_at DESC, id DESC LIMIT ?",
            (*args, limit),
        )
        return [self._session(r) for r in rows]

    def last_message_at(self, session_id: str) -> float | None:
        for (created_at,) in self.conn.execute(
            "SELECT created_at FROM messages WHERE session_id = ? ORDER BY id DESC LIMIT 1",
            (session_id,),
        ):
            return float(created_at)
        return None

    def sizes_at(
        self, session_id: str, times: list[float], start: tuple[int, int, int] = (0, 0, 0)
    ) -> tuple[list[tuple[int, int]], tuple[int, int, int]]:
        """(messages, tokens) of the session's archive at each of `times`, in one pass.

        `start` is (last id, messages, tokens) already counted, from the second value
        returned by an earlier call whose times all came before these: the scan goes on
        from there. Archived rows never change, so such a checkpoint stays true."""
        last_id, count, tokens = start
        if not times:
            return [], start
        order = sorted(range(len(times)), key=lambda i: times[i])
        out: list[tuple[int, int]] = [(0, 0)] * len(times)
        k = 0
        for mid, created_at, n in self.conn.execute(
            "SELECT id, created_at, tokens FROM messages WHERE session_id = ? AND id > ? "
            "ORDER BY id",
            (session_id, last_id),
        ):
            while k < len(order) and created_at > times[order[k]]:
                out[order[k]] = (count, tokens)
                k += 1
            if k == len(order):
                break
            last_id, count, tokens = mid, count + 1, tokens + n
        for i in order[k:]:
            out[i] = (count, tokens)
        return out, (last_id, count, tokens)

    @staticmethod
    def _session(row: Sequence[Any]) -> SessionRecord:
        sid, title, metadata, created_at = row
        return SessionRecord(sid, title, json.loads(metadata) if metadata else {}, created_at)

    def session_ids_without_context(self) -> list[str]:
        return [
            r[0]
            for r in self.conn.execute(
                "SELECT s.id FROM sessions s LEFT JOIN conversation_context c "
                "ON c.session_id = s.id WHERE c.session_id IS NULL"
            )
        ]

    # batches

    def find_batch(self, session_id: str, client_batch_id: str) -> tuple[int, str, int, int] | None:
        row = self.conn.execute(
            "SELECT id, digest, first_message_id, last_message_id FROM batches "
            "WHERE session_id = ? AND client_batch_id = ?",
            (session_id, client_batch_id),
        ).fetchone()
        return tuple(row) if row else None  # type: ignore[return-value]

    # tool call bookkeeping for validation

    def existing_tool_calls(self, session_id: str, call_ids: Iterable[str]) -> set[str]:
        return set(self._lookup(_CALL_IDS, session_id, call_ids))

    def answered_tool_calls(self, session_id: str, call_ids: Iterable[str]) -> set[str]:
        return set(self._lookup(_RESULT_IDS, session_id, call_ids))

    def call_message_ids(self, session_id: str, call_ids: Iterable[str]) -> dict[str, int]:
        """The archive id of the assistant message that made each tool call."""
        return self._lookup(_CALL_IDS, session_id, call_ids)

    def _lookup(self, sql: str, session_id: str, keys: Iterable[str]) -> dict[str, Any]:
        """`sql` ("... tool_call_id IN ({})") for the keys, a chunk per statement."""
        out: dict[str, Any] = {}
        for statement, params in lookup_statements(sql, session_id, keys):
            for key, value in self.conn.execute(statement, params):
                out[key] = value
        return out

    def batches_of_closed_runs(self, batch_ids: set[int]) -> set[int]:
        """Which of these batches belong to a run that is no longer open."""
        wanted = list(batch_ids)
        closed: set[int] = set()
        for i in range(0, len(wanted), _CHUNK):
            chunk = wanted[i : i + _CHUNK]
            marks = ",".join("?" * len(chunk))
            closed.update(
                bid
                for (bid,) in self.conn.execute(
                    "SELECT b.id FROM batches b JOIN runs r ON r.id = b.run_id "  # noqa: S608
                    f"WHERE b.id IN ({marks}) AND r.status != 'open'",
                    chunk,
                )
            )
        return closed

    # reading

    def read(
        self, session_id: str, after_id: int, limit: int, max_bytes: int | None = None
    ) -> list[dict[str, Any]]:
        """Up to `limit` messages after `after_id`, oldest first; with `max_bytes`, no more
        than that many bytes of stored JSON (but always one message, so paging moves)."""
        rows = self.conn.execute(
            "SELECT id, batch_id, body, tokens, created_at FROM messages "
            "WHERE session_id = ? AND id > ? ORDER BY id LIMIT ?",
            (session_id, after_id, limit),
        )
        return [message_from_row(r) for r in _within_bytes(rows, max_bytes)]

    def read_before(
        self,
        session_id: str,
        before_id: int,
        after_id: int,
        limit: int,
        max_bytes: int | None = None,
    ) -> list[dict[str, Any]]:
        """The latest `limit` messages with after_id < id < before_id, oldest first; with
        `max_bytes`, the latest that fit it (always one)."""
        rows = self.conn.execute(
            "SELECT id, batch_id, body, tokens, created_at FROM messages "
            "WHERE session_id = ? AND id > ? AND id < ? ORDER BY id DESC LIMIT ?",
            (session_id, after_id, before_id, limit),
        )
        kept = list(_within_bytes(rows, max_bytes))
        return [message_from_row(r) for r in reversed(kept)]

    def has_between(self, session_id: str, after_id: int, before_id: int | None) -> bool:
        """Whether the session has a message with after_id < id (< before_id)."""
        row = self.conn.execute(
            "SELECT 1 FROM messages WHERE session_id = ? AND id > ? AND id < ? LIMIT 1",
            (session_id, after_id, before_id if before_id is not None else 1 << 62),
        ).fetchone()
        return row is not None

    def stored_bytes(
        self, session_id: str, from_id: int, also: Sequence[int] = (),
        less: Sequence[int] = (),
    ) -> int:
        """Bytes of stored JSON of the session's messages with id >= from_id, and of
        those in `also`, less those in `less`: what a context reply carries. SQLite
        reads each row's length from its header (`octet_length`), never the content."""
        total = int(self.conn.execute(
            "SELECT coalesce(sum(octet_length(body)), 0) FROM messages "
            "WHERE session_id = ? AND id >= ?",
            (session_id, from_id),
        ).fetchone()[0])
        for ids, sign in ((also, 1), (less, -1)):
            for i in range(0, len(ids), 500):
                chunk = list(ids[i : i + 500])
                marks = ",".join("?" * len(chunk))
                total += sign * int(self.conn.execute(
                    "SELECT coalesce(sum(octet_length(body)), 0) FROM messages "  # noqa: S608
                    f"WHERE session_id = ? AND id IN ({marks})",
                    [session_id, *chunk],
                ).fetchone()[0])
        return total

    def count_between(self, session_id: str, lo: int, hi: int) -> int:
        """Messages of the session with lo <= id <= hi (the summary's per-session ordinals
        count on from a known one, so this only walks the new stretch)."""
        return int(
            self.conn.execute(
                "SELECT count(*) FROM messages WHERE session_id = ? AND id >= ? AND id <= ?",
                (session_id, lo, hi),
            ).fetchone()[0]
        )

    def sums_from(self, session_id: str, from_id: int) -> tuple[int, int]:
        row = self.conn.execute(
            "SELECT count(*), coalesce(sum(tokens), 0) FROM messages "
            "WHERE session_id = ? AND id >= ?",
            (session_id, from_id),
        ).fetchone()
        return int(row[0]), int(row[1])

    def last_id(self, session_id: str) -> int | None:
        return self.conn.execute(
            "SELECT max(id) FROM messages WHERE session_id = ?", (session_id,)
        ).fetchone()[0]
