"""The engine's store tests, run again on the PostgreSQL store with the same assertions.

Every test of the archive, search, compaction and context-edit suites that takes the
`engine` fixture is collected here a second time, with `engine` built on a
`PostgresStore` in a fresh database of the test server (tests/pg.py); the originals keep
running on the embedded SQLite store.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import psycopg
import pytest
import test_archive
import test_compaction
import test_context_edit
import test_search
import test_store_records
from _pytest.fixtures import FixtureFunctionDefinition
from helpers import make_config

from ctxd.daemon import context_edit
from ctxd.daemon.busy import when_free
from ctxd.daemon.engine import Engine
from ctxd.daemon.stores.base import SharedArchive, SharedStore, shared_store
from ctxd.daemon.stores.postgres import events
from ctxd.daemon.stores.postgres.store import PostgresStore
from ctxd.protocol.errors import SessionBusy, StorageError

SUITES = (test_archive, test_search, test_compaction, test_context_edit, test_store_records)
# tests that open the SQLite file itself (PostgreSQL's counterparts: test_pg_schema.py)
SQLITE_ONLY = {"test_triggers_refuse_rewriting_history"}

for _mod in SUITES:
    for _name, _fn in list(vars(_mod).items()):
        if isinstance(_fn, FixtureFunctionDefinition) and _name != "engine":
            globals()[_name] = _fn  # the suite's own fixtures (e.g. a session id)
        elif (
            _name.startswith("test_")
            and _name not in SQLITE_ONLY
            and callable(_fn)
            and "engine" in inspect.signature(_fn).parameters
        ):
            globals()[f"{_name}__{_mod.__name__.removeprefix('test_')}"] = _fn


@pytest.fixture
def engine(tmp_path: Path, pg_dsn: str) -> Iterator[Engine]:
    cfg = make_config(tmp_path / "data")
    e = Engine(cfg, store=PostgresStore(pg_dsn, search_budget_seconds=cfg.search_budget_seconds))
    yield e
    e.close()


def _while_waiting(a: Engine, a_edit, b: Engine, sid: str, pg_dsn: str, write) -> object:
    """Run `a_edit()` in a thread while B writes the session (holds its row lock): A's
    edit is refused at once (SessionBusy) and waits for the lock as the daemon does
    (busy.when_free); once A waits, B writes (`write()`) and commits: what A's edit
    returns."""
    out: list[object] = []
    with b.store.transaction(sid):
        with pytest.raises(SessionBusy):
            a_edit()  # never waits on the caller's thread
        t = threading.Thread(target=lambda: out.append(asyncio.run(when_free(a.store, a_edit))))
        t.start()
        with psycopg.connect(pg_dsn, autocommit=True) as watch:
            deadline = time.monotonic() + 30
            while not watch.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            ).fetchone()[0]:
                assert time.monotonic() < deadline, "A never waited for the session's lock"
                time.sleep(0.02)
        write()
    t.join(30)
    assert out, "A's edit failed"
    return out[0]


def test_the_postgres_store_declares_the_shared_capabilities(engine: Engine,
                                                             tmp_path: Path) -> None:
    """What the engine asks of a shared store is declared on SharedStore and checked
    once: the PostgreSQL store has all of it, the embedded one none of it."""
    assert isinstance(engine.store, SharedStore)
    assert isinstance(engine.store.archive, SharedArchive)
    assert engine.shared_store is engine.store and engine.shared
    embedded = Engine(make_config(tmp_path / "embedded"))
    try:
        assert shared_store(embedded.store) is None
        assert embedded.shared_store is None and not embedded.shared
        assert not isinstance(embedded.store.archive, SharedArchive)
    finally:
        embedded.close()


def test_context_edits_read_what_another_daemon_wrote_meanwhile(
    two_engines: tuple[Engine, Engine], pg_dsn: str,
) -> None:
    a, b = two_engines
    sid = a.create_session().session_id
    a.append(sid, [{"role": "user", "content": f"m{i}"} for i in range(4)])
    late: list[int] = []

    def b_appends() -> None:
        late.extend(b.append(sid, [{"role": "user", "content": "late"}]).message_ids)

    popped = _while_waiting(a, lambda: context_edit.pop(a, sid, 1), b, sid, pg_dsn, b_appends)
    # the pop took the newest message, the one B appended while A waited
    assert [m["id"] for m in popped.messages] == late
    for e in (a, b):
        got = e.get_context(sid)
        assert [m["content"] for m in got.messages] == ["m0", "m1", "m2", "m3"]
        assert got.status.active_messages == 4

    late.clear()
    _while_waiting(a, lambda: context_edit.clear(a, sid), b, sid, pg_dsn, b_appends)
    # the cleared context starts after B's message too: a rebuild does not bring it back
    assert a.store.contexts.load(sid).base_id == late[0]
    b.append(sid, [{"role": "user", "content": "after"}])
    for e in (a, b):
        got = e.get_context(sid)
        assert [m["content"] for m in got.messages] == ["after"]
        assert got.status.active_messages == 1


def test_events_too_large_for_a_notification_still_cross(
    two_engines: tuple[Engine, Engine], pg_dsn: str,
) -> None:
    a, b = two_engines
    refs: list[dict] = []
    b.store.listen(refs.append)  # B's listening thread, as in a daemon
    assert b.store.listening.wait(30), "B never listened"
    local: list[tuple] = []
    relayed: list[tuple] = []
    # A's own events are Structs; B's relayed ones are rebuilt in their wire form
    a.add_listener(lambda sid, m, p: local.append((m, msgspec.to_builtins(p))))
    b.add_listener(lambda sid, m, p: relayed.append((m, msgspec.to_builtins(p))))
    sid = a.create_session().session_id
    a.append(sid, [{"role": "user", "content": f"m{i}"} for i in range(1200)])
    context_edit.pop(a, sid, 1000)  # 1000 ids would not fit in one notification
    deadline = time.monotonic() + 30
    while not any(r["m"] == "context/didChange" for r in refs):
        assert time.monotonic() < deadline, "no notification of the pop"
        time.sleep(0.02)
    change = next(r for r in refs if r["m"] == "context/didChange")
    assert isinstance(change["v"]["messageIds"], dict)  # sent as a range
    events.relay(b, change)
    assert relayed == [local[-1]] and len(local[-1][1]["messageIds"]) == 1000

    # a long error text is cut to fit; the rest of the event is whole
    failed = {"sessionId": sid, "trigger": "manual", "compactionId": "cmp_x",
              "error": {"code": -32016, "message": "e" * 20_000}}
    text = events.reference(a.store.origin, sid, "context/compactionFailed", failed)
    assert text is not None and len(text.encode()) < 8000
    events.relay(b, json.loads(text))
    m, params = relayed[-1]
    assert m == "context/compactionFailed"
    assert params["error"]["message"] == "e" * events.CUT_CHARS + "…"
    assert {**params, "error": failed["error"]} == failed


def test_archive_count_counts_on_across_daemons_and_rollbacks(
    two_engines: tuple[Engine, Engine],
) -> None:
    """Each status reports the session's archived count, counted on from the last one:
    appends through another daemon on the same database are seen, rows of a transaction
    that rolls back are not kept."""
    a, b = two_engines
    sid = a.create_session().session_id
    for i in range(3):
        a.append(sid, [{"role": "user", "content": f"a {i}"}])
    assert a.status(sid).archive_messages == 3
    b.append(sid, [{"role": "user", "content": "b 0"}, {"role": "user", "content": "b 1"}])
    assert a.status(sid).archive_messages == 5
    row = ({"role": "user", "content": "rolled back"}, '{"role":"user"}', 1)
    with pytest.raises(RuntimeError), a.store.transaction():
        a.archive.append(sid, [row], digest="x", run_id=None, client_batch_id=None)
        assert a.archive.message_count(sid) == 6  # its own uncommitted row
        raise RuntimeError("roll back")
    assert a.status(sid).archive_messages == b.status(sid).archive_messages == 5
    a.append(sid, [{"role": "user", "content": "a 3"}])
    assert b.status(sid).archive_messages == a.status(sid).archive_messages == 6


def test_status_says_compacting_while_another_daemon_holds_the_session(
    two_engines: tuple[Engine, Engine],
) -> None:
    """B learns of A's compaction from A's events and asks the server's locks only
    then: true while A holds the session's lock, false (and forgotten) once it is let go
    or when A never said it ended."""
    a, b = two_engines
    sids = [a.create_session().session_id for _ in range(6)]  # hashes of both signs
    for sid in sids:
        begin = events.reference(a.store.origin, sid, "$/progress", {
            "sessionId": sid, "token": f"cmp_{sid}",
            "value": {"kind": "begin", "title": "Compacting context", "percentage": 0}})
        assert begin is not None
        assert not b.status(sid).compacting
        assert a.store.try_compaction_lock(sid)
        assert not b.status(sid).compacting  # nothing told yet: no query
        events.relay(b, json.loads(begin))
        assert b.status(sid).compacting and not a.status(sid).compacting
        assert not b.status(sids[0] if sid != sids[0] else sids[1]).compacting
        a.store.release_compaction_lock(sid)
        assert not b.status(sid).compacting
        assert sid not in b.store._elsewhere  # the dead hint is forgotten
    # told of a start and of its end: nothing left to ask
    sid = sids[0]
    for kind in ("begin", "end"):
        ref = events.reference(a.store.origin, sid, "$/progress", {
            "sessionId": sid, "token": "cmp_t", "value": {"kind": kind}})
        events.relay(b, json.loads(ref))
    assert sid not in b.store._elsewhere


def test_a_compaction_waiting_for_another_daemons_ends_its_progress_when_the_server_goes(
    two_engines: tuple[Engine, Engine], pg_dsn: str,
) -> None:
    """B waits for A's compaction; B's connections are cut meanwhile: B's request fails
    with a typed storage error and its progress ends, and B compacts again afterwards."""
    a, b = two_engines
    sid = a.create_session().session_id
    for i in range(12):
        a.append(sid, [{"role": "user", "content": f"turn {i}"},
                       {"role": "assistant", "content": f"answer {i}"}])
    progress: list[dict] = []
    b.add_listener(lambda s, m, p: progress.append(msgspec.to_builtins(p)["value"])
                   if m == "$/progress" else None)
    assert a.store.try_compaction_lock(sid)

    async def cut_while_waiting() -> None:
        task = asyncio.create_task(b.compact(sid, force=True))
        while not progress:
            await asyncio.sleep(0.01)
        # every connection of B's (the lock is asked for on the session's worker
        # thread, on a connection of its own), none of A's
        pids = b.store.conn.backend_pids()
        assert pids and not pids & a.store.conn.backend_pids()
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            for pid in pids:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(StorageError):
            await asyncio.wait_for(task, 30)

    asyncio.run(cut_while_waiting())
    assert progress[0]["kind"] == "begin" and progress[-1]["kind"] == "end"
    assert not b.status(sid).compacting
    a.store.release_compaction_lock(sid)
    assert asyncio.run(b.compact(sid, force=True)).effective


def test_an_unwatched_session_relays_nothing_yet_its_compaction_is_known(
    two_engines: tuple[Engine, Engine],
) -> None:
    """No client of B watches the session: A's events reach none of B's listeners, but
    B's status still says the session is compacting while A holds it."""
    a, b = two_engines
    relayed: list[str] = []
    b.add_listener(lambda sid, m, p: relayed.append(m))
    sid = a.create_session().session_id
    appended = {"m": "session/didAppend", "s": sid, "o": a.store.origin,
                "b": a.append(sid, [{"role": "user", "content": "m"}]).batch_id}
    events.relay(b, appended, lambda s: False)
    assert relayed == []
    events.relay(b, appended, lambda s: True)
    assert relayed == ["session/didAppend"]
    relayed.clear()
    begin = events.reference(a.store.origin, sid, "$/progress", {
        "sessionId": sid, "token": "cmp_u", "value": {"kind": "begin", "percentage": 0}})
    assert begin is not None
    assert a.store.try_compaction_lock(sid)
    try:
        events.relay(b, json.loads(begin), lambda s: False)
        assert relayed == [] and b.status(sid).compacting
        events.relay(b, json.loads(begin), lambda s: s == sid)  # watched: relayed
        assert relayed == ["$/progress"]
    finally:
        a.store.release_compaction_lock(sid)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_listener_thread_that_ended_is_started_again_and_reads_what_it_missed(
    two_engines: tuple[Engine, Engine], caplog: pytest.LogCaptureFixture,
) -> None:
    """Whatever ends B's listening thread (here its callback raising SystemExit, which
    no `except Exception` stops), the daemon's watch starts it again with one warning,
    and the events written meanwhile are read then."""
    a, b = two_engines
    got: list[dict] = []

    def on_event(ref: dict) -> None:
        if not got:
            got.append(ref)
            raise SystemExit("the listener's end")
        got.append(ref)

    b.store.listen(on_event)
    assert b.store.listening.wait(30)
    sid = a.create_session().session_id
    first = a.append(sid, [{"role": "user", "content": "one"}]).batch_id
    deadline = time.monotonic() + 30
    while b.store._listener.is_alive():
        assert time.monotonic() < deadline, "the listener never ended"
        time.sleep(0.02)
    second = a.append(sid, [{"role": "user", "content": "two"}]).batch_id
    with caplog.at_level("WARNING", logger="ctxd.pg.store"):
        b.store.ensure_listening()
        b.store.ensure_listening()  # alive again: nothing more to do
    assert [r.getMessage() for r in caplog.records] == [
        "the events listener had stopped; listening again"]
    while len(got) < 2:
        assert time.monotonic() < deadline, "the missed event was never read"
        time.sleep(0.02)
    assert [r["b"] for r in got] == [first, second]
