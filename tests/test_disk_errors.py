"""Disk errors: a full disk and a read-only database, in the engine and through the daemon.

A full disk is simulated with SQLite's `max_page_count` on the engine's own connection
(the database cannot grow past it, exactly as when the file system is full) and, for the
daemon, with `RLIMIT_FSIZE` set on the running process (writes past it fail with EFBIG).
A read-only database is simulated with `PRAGMA query_only`: chmod does not stop root.

Every case checks the same three things: the caller gets an error and nothing partial
is written (archive rows, full-text index and context counters agree with a recount),
the engine or daemon goes on serving reads, and once space is back, appends work again.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest
from helpers import DaemonProcess, agent_turn, make_config
from outcomes import OutcomeCounts

from ctxd.daemon.engine import Engine
from ctxd.daemon.stores.sql import contexts as cs
from ctxd.protocol.errors import CtxdError, ErrorCode

# outcome counts, for bench/fuzz_report.py

STATS = OutcomeCounts()
note = STATS.note


@pytest.fixture(scope="module", autouse=True)
def _write_stats() -> Iterator[None]:
    yield
    STATS.write()


DISK_ERROR_CODES = {int(ErrorCode.INTERNAL_ERROR),
                    int(getattr(ErrorCode, "STORAGE_ERROR", ErrorCode.INTERNAL_ERROR))}

FILLER = "lorem ipsum dolor sit amet consectetur adipiscing elit " * 20  # ~1 KiB


def batch(tag: str, n: int = 3) -> list[dict[str, Any]]:
    """`n` messages of about 1 KiB, findable by `tag`."""
    return [{"role": "user", "content": f"{tag} part{i} {FILLER}"} for i in range(n)]


def recount(engine: Engine, sid: str) -> tuple[int, int]:
    n, tokens = engine.conn.execute(
        "SELECT count(*), coalesce(sum(tokens), 0) FROM messages WHERE session_id = ?", (sid,)
    ).fetchone()
    return int(n), int(tokens)


def check_consistent(engine: Engine, sid: str, expected_messages: int) -> None:
    """Archive, full-text index and context counters agree, and hold `expected_messages`."""
    n, tokens = recount(engine, sid)
    assert n == expected_messages
    status = engine.status(sid)
    assert status.archive_messages == n
    assert (status.active_messages, status.estimated_tokens) == (n, tokens)
    stored = cs.load_context(engine.conn, sid)
    assert stored is not None and (stored.active_messages, stored.active_tokens) == (n, tokens)
    fts_rows = engine.conn.execute("SELECT count(*) FROM messages_fts").fetchone()[0]
    all_rows = engine.conn.execute("SELECT count(*) FROM messages").fetchone()[0]
    assert fts_rows == all_rows, "the full-text index and the archive disagree"
    batch_rows = engine.conn.execute(
        "SELECT coalesce(sum(last_message_id - first_message_id + 1), 0) FROM batches"
    ).fetchone()[0]
    assert batch_rows == all_rows, "a batch row without its messages, or the reverse"
    assert engine.conn.pragma("integrity_check") == "ok"
    if not engine.conn.pragma("query_only"):  # FTS5 checks itself through an INSERT command
        engine.conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")


def found(engine: Engine, sid: str, tag: str) -> int:
    return len(engine.search(tag, session_id=sid, limit=100))


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    e = Engine(make_config(tmp_path / "data", max_active_messages=100_000,
                           max_active_tokens=10**9))
    yield e
    e.close()


def fill_until_full(engine: Engine, sid: str, spare_pages: int = 4) -> tuple[int, Exception]:
    """Cap the database a few pages above its size, then append until an append fails.

    Returns how many messages went in and the error of the append that failed.
    """
    engine.conn.pragma("max_page_count", engine.conn.pragma("page_count") + spare_pages)
    stored = 0
    for i in range(200):
        try:
            engine.append(sid, batch(f"fill{i}"))
        except Exception as exc:  # any type: the typed-error test below asks for more
            return stored, exc
        stored += 3
    raise AssertionError("200 appends fitted in a few spare pages")


def test_disk_full_append_is_all_or_nothing_and_recovers(engine: Engine) -> None:
    sid = engine.create_session("s").session_id
    engine.append(sid, batch("before"))
    stored, exc = fill_until_full(engine, sid)
    note(f"append on a full disk: {type(exc).__name__}")
    total = 3 + stored
    check_consistent(engine, sid, total)
    # while full, every further append fails the same way and leaves nothing behind
    for i in range(5):
        with pytest.raises(Exception):  # noqa: B017 - the type is the next test's subject
            engine.append(sid, batch(f"refused{i}"))
        check_consistent(engine, sid, total)
        note("refused, nothing written")
        assert found(engine, sid, f"refused{i}") == 0
    # reads go on
    assert len(engine.read_archive(sid, limit=5000).messages) == total
    assert found(engine, sid, "before") == 3
    # space is back: appends work, ids continue where the archive ended
    last = engine.conn.execute("SELECT max(id) FROM messages").fetchone()[0]
    engine.conn.pragma("max_page_count", 1 << 30)
    ids = engine.append(sid, batch("after")).message_ids
    assert ids == [last + 1, last + 2, last + 3]
    check_consistent(engine, sid, total + 3)
    assert found(engine, sid, "after") == 3


def test_what_survived_a_full_disk_reopens_intact(tmp_path: Path) -> None:
    cfg = make_config(tmp_path / "data")
    engine = Engine(cfg)
    sid = engine.create_session("s").session_id
    stored, _ = fill_until_full(engine, sid)
    status = engine.status(sid)
    engine.close()
    reopened = Engine(make_config(tmp_path / "data"))
    try:
        assert reopened.status(sid) == status
        check_consistent(reopened, sid, stored)
        reopened.append(sid, batch("after reopen"))  # no cap on a new connection
        check_consistent(reopened, sid, stored + 3)
    finally:
        reopened.close()


def test_disk_full_gives_a_typed_error(engine: Engine) -> None:
    # SQLite rolls a transaction back by itself on SQLITE_FULL, so the savepoint's own
    # rollback fails next: neither raw error may reach the caller
    sid = engine.create_session("s").session_id
    _, exc = fill_until_full(engine, sid)
    assert isinstance(exc, CtxdError), repr(exc)
    # every other write either fits in what is left or fails typed
    for write in (lambda: engine.append(sid, batch("again")),
                  lambda: engine.add_pin(sid, FILLER * 8),
                  lambda: engine.create_session(None, "t" * 900, {"k": FILLER}),
                  lambda: engine.start_run(sid)):
        try:
            write()
        except Exception as err:
            assert isinstance(err, CtxdError), repr(err)
            note(f"{type(err).__name__} {int(err.code)}")


def test_disk_full_during_compaction_leaves_the_context_as_it_was(tmp_path: Path) -> None:
    engine = Engine(make_config(tmp_path / "data", max_active_messages=100_000,
                                max_active_tokens=10**9, summary_budget_tokens=20_000))
    try:
        sid = engine.create_session("s").session_id
        for i in range(150):
            engine.append(sid, agent_turn(i))
        status, messages = engine.status(sid), engine.context_messages(sid)
        # no spare page at all: the summary and the compaction record cannot be written
        assert engine.conn.pragma("freelist_count") == 0
        engine.conn.pragma("max_page_count", engine.conn.pragma("page_count"))
        with pytest.raises(CtxdError) as err:
            engine.compact_sync(sid, force=True)
        note(f"compaction on a full disk: {type(err.value).__name__}, context unchanged")
        assert engine.status(sid) == status
        assert engine.context_messages(sid) == messages
        check_consistent(engine, sid, 600)
        engine.conn.pragma("max_page_count", 1 << 30)
        result = engine.compact_sync(sid, force=True)
        assert result.effective and engine.status(sid).compaction_count == 1
        assert engine.status(sid).archive_messages == 600
    finally:
        engine.close()


# read-only database


def test_read_only_database_refuses_appends_and_recovers(engine: Engine) -> None:
    sid = engine.create_session("s").session_id
    engine.append(sid, batch("before"))
    engine.conn.pragma("query_only", True)
    with pytest.raises(Exception) as err:  # noqa: B017 - the type is the next test's subject
        engine.append(sid, batch("refused"))
    note(f"append on a read-only database: {type(err.value).__name__}")
    check_consistent(engine, sid, 3)
    assert found(engine, sid, "refused") == 0
    assert engine.read_archive(sid).messages[0]["content"].startswith("before")
    engine.conn.pragma("query_only", False)
    engine.append(sid, batch("after"))
    check_consistent(engine, sid, 6)


def test_read_only_database_gives_a_typed_error(engine: Engine) -> None:
    # over the wire an untyped error would be an "internal error" that hides the cause
    sid = engine.create_session("s").session_id
    engine.conn.pragma("query_only", True)
    for write in (lambda: engine.append(sid, batch("refused")),
                  lambda: engine.add_pin(sid, "pin"),
                  lambda: engine.create_session("t"),
                  lambda: engine.start_run(sid)):
        with pytest.raises(CtxdError) as err:
            write()
        note(f"{type(err.value).__name__} {int(err.value.code)}")
    engine.conn.pragma("query_only", False)
    assert engine.status(sid).archive_messages == 0 and engine.pins(sid) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="file modes do not stop root")
def test_a_read_only_data_dir_is_refused_at_open(tmp_path: Path) -> None:
    data = tmp_path / "data"
    Engine(make_config(data)).close()
    for p in data.iterdir():
        p.chmod(0o444)
    data.chmod(0o555)
    try:
        with pytest.raises(Exception):  # noqa: B017 - it must not open for writing silently
            e = Engine(make_config(data))
            try:
                e.append(e.create_session("s").session_id, batch("x"))
            finally:
                e.close()
    finally:
        data.chmod(0o755)


# through the daemon


@pytest.mark.skipif(not (sys.platform.startswith("linux") and hasattr(resource, "prlimit")),
                    reason="needs prlimit(2)")
def test_daemon_on_a_full_disk_answers_errors_serves_reads_and_recovers(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path).start()
    assert daemon.proc is not None
    pid = daemon.proc.pid
    soft, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
    rpc = daemon.client("jsonrpc", timeout=30)
    other = daemon.client("zmq", timeout=30)
    try:
        sid = rpc.call("session/create", {})["sessionId"]
        rpc.call("messages/append", {"sessionId": sid, "messages": batch("before")})
        # every file of the daemon may grow only a little beyond its size now
        biggest = max(p.stat().st_size for p in daemon.data_dir.iterdir())
        try:
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (biggest + 256 * 1024, hard))
        except (PermissionError, OSError) as exc:
            pytest.skip(f"cannot lower the daemon's file size limit: {exc}")
        stored = 3
        error: CtxdError | None = None
        for i in range(100):
            try:
                rpc.call("messages/append", {"sessionId": sid, "messages": batch(f"fill{i}", 20)})
            except CtxdError as exc:
                error = exc
                break
            stored += 20
        assert error is not None, "100 appends of 20 KiB fitted in 256 KiB"
        # a wire error with a code for disk errors (the storage code where the protocol has
        # one, else the internal error it documented for them), not a hang or a close
        assert error.code in DISK_ERROR_CODES, error
        note(f"append past RLIMIT_FSIZE: {int(error.code)} {error.message!r}")
        # the daemon keeps serving reads and other clients while the disk stays full
        for _ in range(3):
            with pytest.raises(CtxdError):
                rpc.call("messages/append", {"sessionId": sid, "messages": batch("refused")})
        status = other.call("context/status", {"sessionId": sid})
        assert status["archiveMessages"] == status["activeMessages"] == stored
        msgs = other.call("archive/read", {"sessionId": sid, "limit": 5000})["messages"]
        assert len(msgs) == stored
        assert other.call("archive/search", {"sessionId": sid, "query": "refused"})["hits"] == []
        # space is back
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (soft, hard))
        rpc.call("messages/append", {"sessionId": sid, "messages": batch("after")})
        assert other.call("context/status", {"sessionId": sid})["archiveMessages"] == stored + 3
    finally:
        rpc.close()
        other.close()
        assert daemon.stop() == 0
    # what the daemon wrote is whole on disk
    db = apsw.Connection(str(daemon.data_dir / "ctxd.db"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        assert db.pragma("integrity_check") == "ok"
        count = db.execute("SELECT count(*) FROM messages WHERE session_id = ?", (sid,))
        assert count.fetchone()[0] == stored + 3
        row = db.execute("SELECT active_messages FROM conversation_context WHERE session_id = ?",
                         (sid,)).fetchone()
        assert row[0] == stored + 3
        bodies = [json.loads(r[0])["content"] for r in db.execute(
            "SELECT body FROM messages WHERE session_id = ? ORDER BY id", (sid,))]
        assert not any(b.startswith("refused") for b in bodies)
    finally:
        db.close()
