"""Two real daemon processes on one PostgreSQL database, clients on each: one truth."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fake_llm import FakeLLM
from helpers import DaemonProcess, agent_turn, notifications_until, wait_for
from pg import PASSWORD, PgCluster

from ctxd.protocol.errors import CompactionInProgress, CtxdError

PW_VAR = "CTXD_TEST_PG_PASSWORD"


@pytest.fixture
def daemons(pg_daemons: list[DaemonProcess]) -> list[DaemonProcess]:
    return pg_daemons


def test_each_daemon_names_its_own_endpoints(daemons: list[DaemonProcess]) -> None:
    a, b = (d.info() for d in daemons)
    assert a["pid"] != b["pid"]
    assert a != b and a.get("data_dir") != b.get("data_dir")


def test_events_cross_daemons(daemons: list[DaemonProcess]) -> None:
    a, b = daemons
    with a.client("jsonrpc") as ca, b.client("zmq") as cb:
        sid = ca.create_session(title="shared")["sessionId"]
        ca.subscribe(sid)
        events = ca.notifications(timeout=0.5)
        ids = cb.append(sid, [{"role": "user", "content": "through daemon B"}])["messageIds"]
        got = wait_for(events, "session/didAppend", where=lambda p: p["messageIds"] == ids)
        assert got["sessionId"] == sid
        assert got["status"]["archiveMessages"] == 1
        # and the subscriber's own daemon reads the message B archived
        assert [m["content"] for m in ca.read(sid)["messages"]] == ["through daemon B"]


def test_appends_through_both_daemons_interleave_without_loss(
    daemons: list[DaemonProcess],
) -> None:
    a, b = daemons
    with a.client() as c0:
        sid = c0.create_session()["sessionId"]
    per_client = 25
    errors: list[BaseException] = []

    def writer(d: DaemonProcess, tag: str) -> None:
        try:
            with d.client() as c:
                for i in range(per_client):
                    c.append(sid, [{"role": "user", "content": f"{tag} {i}"}],
                             client_batch_id=f"{tag}-{i}")
                    if i % 5 == 0:  # a retried batch is not stored twice
                        c.append(sid, [{"role": "user", "content": f"{tag} {i}"}],
                                 client_batch_id=f"{tag}-{i}")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(d, f"{n}{k}"))
               for n, d in (("a", a), ("b", b)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    with b.client() as c:
        msgs = c.read(sid, limit=1000)["messages"]
        ids = [m["id"] for m in msgs]
        assert ids == sorted(ids) and len(set(ids)) == len(ids) == 4 * per_client
        for tag in ("a0", "a1", "b0", "b1"):
            mine = [m["content"] for m in msgs if m["content"].startswith(tag)]
            assert mine == [f"{tag} {i}" for i in range(per_client)]  # each writer's order
        # the context's counters saw every append, whichever daemon took it
        for d in (a, b):
            with d.client() as cd:
                st = cd.context_get(sid)
                assert len(st["messages"]) == 4 * per_client


def test_approval_answered_on_two_daemons_has_one_winner(daemons: list[DaemonProcess]) -> None:
    a, b = daemons
    with a.client() as ca, b.client() as cb:
        sid = ca.create_session()["sessionId"]
        run = ca.start_run(sid)
        ca.append(sid, [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "rm", "arguments": "{}"}}]}], run_id=run["runId"])
        appr = ca.request_approval(sid, run["runId"], "call_1", "rm", {})
        # a second run cannot open while this one is, through either daemon
        with pytest.raises(CtxdError):
            cb.start_run(sid)
        outcomes: list[object] = []
        barrier = threading.Barrier(2)

        def answer(client, decision: str) -> None:
            barrier.wait()
            try:
                outcomes.append(client.resolve_approval(appr["approvalId"], decision))
            except CtxdError as exc:
                outcomes.append(exc)

        ts = [threading.Thread(target=answer, args=(ca, "approved")),
              threading.Thread(target=answer, args=(cb, "denied"))]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
        wins = [o for o in outcomes if isinstance(o, dict)]
        assert len(wins) == 1 and len(outcomes) == 2
        for c in (ca, cb):  # both daemons report the winner's answer
            assert c.list_approvals(sid)["approvals"][0]["status"] == wins[0]["status"]


@pytest.fixture
def slow_llm() -> Iterator[FakeLLM]:
    with FakeLLM("good", slow_seconds=2.0) as server:
        yield server


def _llm_daemons(tmp_path: Path, pg_cluster: PgCluster, pg_dsn: str,
                 llm: FakeLLM, max_active: int = 10000,
                 wait_seconds: float = 300.0) -> list[DaemonProcess]:
    dbname = psycopg.conninfo.conninfo_to_dict(pg_dsn)["dbname"]
    config = tmp_path / "ctxd.toml"
    config.write_text(
        'store = "postgres"\nsummarizer = "openai"\n'
        f'[postgres]\ndsn = "{pg_cluster.tcp_dsn(dbname)}"\npassword_env = "{PW_VAR}"\n'
        # no fallback: a failing model must fail the compaction (its event is tested)
        f'[openai]\nbase_url = "{llm.base_url}"\nmodel = "fake-model"\ntimeout_seconds = 20\n'
        'fallback = ""\n'
        f"[compaction]\nmax_active_messages = {max_active}\nkeep_messages = 4\n"
        f"wait_seconds = {wait_seconds}\n"
    )
    out = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        out.append(DaemonProcess(tmp_path / name, "--config", str(config),
                                 env={PW_VAR: PASSWORD, "CTXD_LOG_LEVEL": "INFO"}).start())
    return out


def test_compaction_race_commits_one_and_a_dead_compactor_is_taken_over(
    tmp_path: Path, pg_cluster: PgCluster, pg_dsn: str, slow_llm: FakeLLM,
) -> None:
    a, b = _llm_daemons(tmp_path, pg_cluster, pg_dsn, slow_llm)
    try:
        # JSON-RPC over TCP for A: its client sees A die at once (ZeroMQ would wait)
        with a.client("jsonrpc", timeout=30) as ca, b.client(timeout=30) as cb:
            sid = ca.create_session()["sessionId"]
            for i in range(3):
                ca.append(sid, agent_turn(i))
            results: list[object] = []

            def compact(c) -> None:
                try:
                    results.append(c.compact(sid, force=True))
                except (CtxdError, ConnectionError, OSError) as exc:  # A killed: gone
                    results.append(exc)

            assert not cb.context_status(sid)["compacting"]
            slow_llm.script("slow")  # A's summary takes its time
            t = threading.Thread(target=compact, args=(ca,))
            t.start()
            # A is waiting for its summary: B's clients see the session compacting too
            deadline = time.monotonic() + 20
            while not cb.context_status(sid)["compacting"]:
                assert time.monotonic() < deadline, "B never saw A compacting"
                time.sleep(0.05)
            assert ca.context_status(sid)["compacting"]
            b_done = cb.compact(sid, force=True)  # waits for A's, then runs on what A left
            t.join(30)
            [a_done] = results
            assert isinstance(a_done, dict) and a_done["effective"], a_done
            # one log entry, and at most one commit, per attempt; A's came first
            log = cb.compactions(sid)["compactions"]
            by_id = {e["compactionId"]: e for e in log}
            assert len(log) == 2 and by_id[a_done["compactionId"]]["committed"]
            commits = sum(e["committed"] for e in log)
            assert commits == 1 + bool(b_done["effective"])
            for c in (ca, cb):
                status = c.context_status(sid)
                assert status["compactionCount"] == commits and not status["compacting"]
            assert b_done["before"] == a_done["after"]  # B ran on A's result

            # A dies in the middle of its next compaction: B takes over at once
            for i in range(3, 6):
                cb.append(sid, agent_turn(i))
            slow_llm.script("slow")
            t = threading.Thread(target=compact, args=(ca,))
            t.start()
            time.sleep(0.7)
            a.kill()
            t.join(30)
            # PostgreSQL frees A's lock when it sees A's connection gone, a moment after
            # the kill; B's compaction waits for that
            done = cb.compact(sid, force=True)
            assert done["effective"]
            log = cb.compactions(sid)["compactions"]
            assert sum(e["committed"] for e in log) == commits + 1
            # nothing acknowledged was lost
            assert len(cb.read(sid, limit=1000)["messages"]) == sum(
                len(agent_turn(i)) for i in range(6))
    finally:
        _stop_running((a, b))


def test_a_compaction_waiting_for_another_daemons_gives_up_after_wait_seconds(
    tmp_path: Path, pg_cluster: PgCluster, pg_dsn: str, slow_llm: FakeLLM,
) -> None:
    a, b = _llm_daemons(tmp_path, pg_cluster, pg_dsn, slow_llm, wait_seconds=0.3)
    try:
        with a.client(timeout=30) as ca, b.client(timeout=30) as cb:
            sid = ca.create_session()["sessionId"]
            for i in range(3):
                ca.append(sid, agent_turn(i))
            cb.subscribe(sid)
            events = cb.notifications(timeout=0.5)
            slow_llm.script("slow")  # A's summary takes 2 s, longer than B waits
            results: list[object] = []
            t = threading.Thread(target=lambda: results.append(ca.compact(sid, force=True)))
            t.start()
            wait_for(events, "$/progress", timeout=30,
                     where=lambda p: p["value"]["kind"] == "begin")
            with pytest.raises(CompactionInProgress) as refused:
                cb.rebuild(sid)
            assert refused.value.data["waitedSeconds"] == 0.3
            t.join(30)
            assert results and results[0]["effective"]
            log = cb.compactions(sid)["compactions"]
            assert [e["compactionId"] for e in log] == [results[0]["compactionId"]]
    finally:
        _stop_running((a, b))


def test_run_of_a_dead_daemon_is_interrupted_after_a_lease(
    tmp_path: Path, pg_cluster: PgCluster, pg_dsn: str,
) -> None:
    dbname = psycopg.conninfo.conninfo_to_dict(pg_dsn)["dbname"]
    env = {"CTXD_STORE": "postgres", "CTXD_POSTGRES_DSN": pg_cluster.tcp_dsn(dbname),
           "CTXD_POSTGRES_PASSWORD_ENV": PW_VAR, PW_VAR: PASSWORD,
           "CTXD_RUN_LEASE_SECONDS": "1"}
    procs = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        procs.append(DaemonProcess(tmp_path / name, env=env).start())
    a, b = procs
    try:
        with b.client() as cb:
            live = cb.create_session()["sessionId"]
            doomed = cb.create_session()["sessionId"]
            with a.client("jsonrpc") as ca:
                ca.start_run(live)
                run = ca.start_run(doomed)
                time.sleep(3)  # three leases: B leaves the runs of a live daemon alone
                assert cb.context_status(live)["activeRunId"] is not None
                assert cb.context_status(doomed)["activeRunId"] == run["runId"]
                a.kill()
            deadline = time.monotonic() + 15
            while cb.context_status(doomed)["activeRunId"] is not None:
                assert time.monotonic() < deadline, "the dead daemon's run stayed open"
                time.sleep(0.2)
            # the session is free again: a new run opens through B
            again = cb.start_run(doomed)["runId"]
            assert cb.context_status(doomed)["activeRunId"] == again != run["runId"]
    finally:
        _stop_running(procs)


def test_every_event_crosses_daemons_with_the_same_params(
    tmp_path: Path, pg_cluster: PgCluster, pg_dsn: str,
) -> None:
    with FakeLLM("good") as llm:
        a, b = _llm_daemons(tmp_path, pg_cluster, pg_dsn, llm)
        try:
            with a.client("jsonrpc", timeout=30) as ca, b.client("jsonrpc", timeout=30) as cb:
                sid = cb.create_session()["sessionId"]
                ca.subscribe(sid)
                cb.subscribe(sid)
                on_a = ca.notifications(timeout=0.5)
                on_b = cb.notifications(timeout=0.5)
                seen: set[str] = set()

                def step(method: str, where=lambda p: True, moved: bool = False) -> None:
                    """What B's subscriber got for the last change made through B, A's
                    got too, with the same params (the status as well, unless the
                    session `moved` on before A relayed the event: A reads it then)."""
                    local = notifications_until(on_b, method, where)
                    relayed = notifications_until(on_a, method, where)
                    if moved:
                        local, relayed = ([(m, {k: v for k, v in p.items() if k != "status"})
                                           for m, p in events] for events in (local, relayed))
                    assert relayed == local
                    seen.update(m for m, _ in local)

                run = cb.start_run(sid)["runId"]
                step("run/didStart")
                call = {"id": "call_rm", "type": "function",
                        "function": {"name": "lookup", "arguments": "{\"q\": \"x\"}"}}
                cb.append(sid, [{"role": "user", "content": "look x up"},
                                {"role": "assistant", "content": None, "tool_calls": [call]}],
                          run_id=run)
                step("session/didAppend")
                appr = cb.request_approval(sid, run, "call_rm", "lookup", {"q": "x" * 5000})
                step("approval/didRequest")
                cb.resolve_approval(appr["approvalId"], "approved", "fine")
                step("approval/didResolve")
                # the run's last messages and its end in one request: the append's
                # event reaches A once the run is over
                cb.finish_run(run, "completed", messages=[
                    {"role": "tool", "tool_call_id": "call_rm", "content": "found"}])
                step("run/didFinish", moved=True)
                run = cb.start_run(sid)["runId"]
                step("run/didStart")
                cb.finish_run(run, "completed")
                step("run/didFinish")
                for i in range(4):
                    cb.append(sid, agent_turn(i))
                    step("session/didAppend")
                cb.compact(sid, force=True)
                step("context/didCompact")
                cb.rebuild(sid)
                step("context/didCompact", lambda p: p["trigger"] == "rebuild")
                cb.context_pop(sid, 2)
                step("context/didChange", lambda p: p["change"] == "pop")
                cb.context_clear(sid)
                step("context/didChange", lambda p: p["change"] == "clear")
                for i in range(4, 7):
                    cb.append(sid, agent_turn(i))
                    step("session/didAppend")
                llm.default = "http500"
                with pytest.raises(CtxdError):
                    cb.compact(sid, force=True)
                step("context/compactionFailed")
                step("$/progress", lambda p: p["value"]["kind"] == "end")
                assert seen == {
                    "run/didStart", "session/didAppend", "approval/didRequest",
                    "approval/didResolve", "run/didFinish", "context/didCompact",
                    "$/progress", "context/didChange", "context/compactionFailed"}
        finally:
            _stop_running((a, b))


def test_auto_compaction_leaves_a_session_another_daemon_is_compacting(
    tmp_path: Path, pg_cluster: PgCluster, pg_dsn: str, slow_llm: FakeLLM,
) -> None:
    a, b = _llm_daemons(tmp_path, pg_cluster, pg_dsn, slow_llm, max_active=8)
    try:
        with a.client("jsonrpc", timeout=30) as ca, b.client(timeout=30) as cb:
            sid = ca.create_session()["sessionId"]
            run = ca.start_run(sid)["runId"]
            for i in range(3):  # inside a run: nothing is compacted before run/finish
                ca.append(sid, agent_turn(i), run_id=run)
            results: list[object] = []
            ca.subscribe(sid)
            events = ca.notifications(timeout=0.5)
            slow_llm.script("slow")  # B's summary takes its time
            t = threading.Thread(target=lambda: results.append(cb.compact(sid, force=True)))
            t.start()
            # B has begun (it holds the session) and waits for its summary
            wait_for(events, "$/progress", timeout=30,
                     where=lambda p: p["value"]["kind"] == "begin")
            # A finds auto-compaction due, and leaves the session to B
            assert ca.finish_run(run, "completed")["run"]["status"] == "completed"
            t.join(30)
            assert results and results[0]["effective"]
            ca.append(sid, [{"role": "user", "content": "after"}])  # A serves on
            log = cb.compactions(sid)["compactions"]
            assert [(e["trigger"], e["committed"]) for e in log] == [("manual", True)]
            assert ca.context_status(sid)["compactionCount"] == 1
        text = a.log_path.read_text(errors="replace")
        assert text.count(f"auto-compaction of {sid} left to the one running") == 1
        assert "Traceback" not in text
    finally:
        _stop_running((a, b))


def _pg_env(pg_cluster: PgCluster, pg_dsn: str) -> dict[str, str]:
    dbname = psycopg.conninfo.conninfo_to_dict(pg_dsn)["dbname"]
    return {"CTXD_STORE": "postgres", "CTXD_POSTGRES_DSN": pg_cluster.tcp_dsn(dbname),
            "CTXD_POSTGRES_PASSWORD_ENV": PW_VAR, PW_VAR: PASSWORD,
            "CTXD_MAX_ACTIVE_MESSAGES": "100000"}


def _stop_running(daemons: Iterable[DaemonProcess]) -> None:
    """Stop those still running (a test may have killed or stopped some already)."""
    for d in daemons:
        if d.proc and d.proc.poll() is None:
            d.stop()


def _in_lockstep(
    clients: dict[str, object], rounds: int, step: Callable[[Any, int], object]
) -> dict[str, list[object]]:
    """`step(client, i)` for each round i on every client in its own thread, each round
    started together; what each step returned, or the CtxdError it raised, by name."""
    barrier = threading.Barrier(len(clients))
    got: dict[str, list[object]] = {name: [] for name in clients}

    def run(name: str, c: object) -> None:
        for i in range(rounds):
            barrier.wait(30)
            try:
                got[name].append(step(c, i))
            except CtxdError as exc:
                got[name].append(exc)

    ts = [threading.Thread(target=run, args=item) for item in clients.items()]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    return got


def _read_all(c, sid: str) -> list[dict]:
    out: list[dict] = []
    after = 0
    while True:
        page = c.read(sid, after_id=after, limit=1000)
        out.extend(page["messages"])
        if page["nextAfterId"] is None:
            return out
        after = page["nextAfterId"]


def test_three_daemons_clients_on_each_append_at_once(
    tmp_path: Path, pg_cluster: PgCluster, pg_dsn: str,
) -> None:
    env = _pg_env(pg_cluster, pg_dsn)
    procs = []
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
        procs.append(DaemonProcess(tmp_path / name, env=env).start())
    clients_per_daemon, batches = 4, 50
    try:
        with procs[0].client() as c0:
            sid = c0.create_session()["sessionId"]
        # one subscriber on each daemon, counting the batches it is told of
        told: list[list[int]] = [[] for _ in procs]
        subs = [d.client("jsonrpc") for d in procs]
        for sub, seen in zip(subs, told, strict=True):
            sub.subscribe(sid)
            sub.on_notification(lambda m, p, seen=seen: seen.append(p["batchId"])
                                if m == "session/didAppend" else None)
        acked: dict[str, int] = {}
        errors: list[BaseException] = []

        def writer(d: DaemonProcess, tag: str) -> None:
            try:
                with d.client() as c:
                    for i in range(batches):
                        msgs = [{"role": "user", "content": f"{tag} {i} {k}"} for k in range(2)]
                        got = c.append(sid, msgs, client_batch_id=f"{tag}-{i}")
                        if i % 10 == 0:  # a retried batch is not stored twice
                            again = c.append(sid, msgs, client_batch_id=f"{tag}-{i}")
                            assert again["batchId"] == got["batchId"]
                        acked[f"{tag}-{i}"] = got["batchId"]
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(d, f"{n}{k}"))
                   for n, d in zip("abc", procs, strict=True) for k in range(clients_per_daemon)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not errors
        total = len(procs) * clients_per_daemon * batches
        assert len(acked) == total and len(set(acked.values())) == total
        for d in procs:  # every daemon reads the whole archive, in one order
            with d.client() as c:
                msgs = _read_all(c, sid)
                ids = [m["id"] for m in msgs]
                assert ids == sorted(ids) and len(set(ids)) == len(ids) == 2 * total
                assert sorted(m["content"] for m in msgs) == sorted(
                    f"{n}{k} {i} {j}" for n in "abc" for k in range(clients_per_daemon)
                    for i in range(batches) for j in range(2))
                # batches stored whole: a batch's two messages are consecutive ids
                by_batch: dict[int, list[int]] = {}
                for m in msgs:
                    by_batch.setdefault(m["batchId"], []).append(m["id"])
                assert sorted(by_batch) == sorted(acked.values())
                assert all(b[1] == b[0] + 1 for b in by_batch.values())
                assert c.context_status(sid)["activeMessages"] == 2 * total
        # every subscriber, whichever daemon it is on, was told of every batch once
        deadline = time.monotonic() + 60
        while any(len(seen) < total for seen in told) and time.monotonic() < deadline:
            time.sleep(0.1)
        for seen in told:
            assert sorted(seen) == sorted(acked.values())
        for sub in subs:
            sub.close()
    finally:
        _stop_running(procs)


def test_kill_9_mid_append_loses_nothing_acknowledged(
    tmp_path: Path, pg_cluster: PgCluster, pg_dsn: str,
) -> None:
    env = _pg_env(pg_cluster, pg_dsn)
    procs = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        procs.append(DaemonProcess(tmp_path / name, env=env).start())
    a, b = procs
    batch = 50  # large batches: the kill finds one in flight
    try:
        with b.client() as cb:
            sid = cb.create_session()["sessionId"]
            acked: dict[str, int] = {}
            in_flight: dict[str, list[dict]] = {}
            started = threading.Event()

            def writer(tag: str) -> None:
                # JSON-RPC over TCP: the client sees its daemon die at once
                with a.client("jsonrpc", timeout=30) as c:
                    for i in range(10_000):
                        key = f"{tag}-{i}"
                        msgs = [{"role": "user", "content": f"{key} {k}"} for k in range(batch)]
                        in_flight[tag] = [key, msgs]
                        try:
                            got = c.append(sid, msgs, client_batch_id=key)
                        except (CtxdError, ConnectionError, OSError):
                            return  # the daemon is gone: this batch is unacknowledged
                        acked[key] = got["batchId"]
                        started.set()

            threads = [threading.Thread(target=writer, args=(f"w{k}",)) for k in range(3)]
            for t in threads:
                t.start()
            assert started.wait(60)
            time.sleep(1.0)
            a.kill()  # SIGKILL: no shutdown of any kind
            for t in threads:
                t.join(60)
            assert acked
            # B carries on: every acknowledged batch is there, whole
            msgs = _read_all(cb, sid)
            have: dict[int, list[str]] = {}
            for m in msgs:
                have.setdefault(m["batchId"], []).append(m["content"])
            for key, bid in acked.items():
                assert have[bid] == [f"{key} {k}" for k in range(batch)]
            # the batches that were in flight, retried through B with the same
            # clientBatchId: stored exactly once, whether A committed them or not
            for key, msgs_ in in_flight.values():
                if key in acked:
                    continue
                first = cb.append(sid, msgs_, client_batch_id=key)
                second = cb.append(sid, msgs_, client_batch_id=key)
                assert first["batchId"] == second["batchId"]
                acked[key] = first["batchId"]
            cb.append(sid, [{"role": "user", "content": "after the kill"}])
            msgs = _read_all(cb, sid)
            contents = [m["content"] for m in msgs]
            assert len(contents) == len(set(contents)) == batch * len(acked) + 1
            assert contents[-1] == "after the kill"
            assert cb.context_status(sid)["activeMessages"] == len(msgs)
            assert len(cb.context_get(sid)["messages"]) == len(msgs)
    finally:
        _stop_running(procs)


def test_one_batch_sent_through_two_daemons_at_once_is_stored_once(
    daemons: list[DaemonProcess],
) -> None:
    a, b = daemons
    rounds = 30
    with a.client() as ca, b.client() as cb:
        sid = ca.create_session()["sessionId"]

        def send(c, i: int) -> object:
            msgs = [{"role": "user", "content": f"retry {i}"}]
            return c.append(sid, msgs, client_batch_id=f"r{i}")["batchId"]

        got = _in_lockstep({"a": ca, "b": cb}, rounds, send)
        # both clients were answered, with the one batch
        assert got["a"] == got["b"] and all(isinstance(x, int) for x in got["a"])
        msgs = _read_all(cb, sid)
        assert [m["content"] for m in msgs] == [f"retry {i}" for i in range(rounds)]
        assert cb.context_status(sid)["activeMessages"] == rounds


def test_one_tool_call_sent_through_two_daemons_at_once_is_refused_with_a_typed_error(
    daemons: list[DaemonProcess],
) -> None:
    a, b = daemons
    rounds = 20
    with a.client() as ca, b.client() as cb:
        sid = ca.create_session()["sessionId"]

        def send(c, i: int) -> object:
            call = {"id": f"call_same_{i}", "type": "function",
                    "function": {"name": "ls", "arguments": "{}"}}
            c.append(sid, [{"role": "assistant", "content": None, "tool_calls": [call]}])
            return "stored"

        got = {
            name: [x if x == "stored" else type(x).__name__ for x in outcomes]
            for name, outcomes in _in_lockstep({"a": ca, "b": cb}, rounds, send).items()
        }
        for x, y in zip(got["a"], got["b"], strict=True):
            # one stored it; the other was told why not, in a typed error
            assert sorted([x, y])[1] == "stored"
            assert sorted([x, y])[0] in ("Conflict", "InvalidMessage")
        assert len(_read_all(cb, sid)) == rounds


def test_events_cross_again_after_a_postgres_restart(tmp_path: Path) -> None:
    cluster = PgCluster().start()
    env = {"CTXD_STORE": "postgres", "CTXD_POSTGRES_DSN": cluster.tcp_dsn(),
           "CTXD_POSTGRES_PASSWORD_ENV": PW_VAR, PW_VAR: PASSWORD}
    procs = []
    try:
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            procs.append(DaemonProcess(tmp_path / name, env=env).start())
        a, b = procs
        with a.client("jsonrpc") as ca, b.client("jsonrpc") as cb:
            sid = cb.create_session()["sessionId"]
            ca.subscribe(sid)
            events = ca.notifications(timeout=0.5)
            ids = cb.append(sid, [{"role": "user", "content": "before"}])["messageIds"]
            wait_for(events, "session/didAppend", where=lambda p: p["messageIds"] == ids)
            cluster.halt()
            cluster.launch()
            # A listens again by itself: B's appends reach A's subscriber once more (those
            # made before A's listener is back are not replayed: a client re-reads)
            deadline = time.monotonic() + 60
            while True:
                assert time.monotonic() < deadline, "A never listened again"
                try:
                    ids = cb.append(sid, [{"role": "user", "content": "after"}])["messageIds"]
                except CtxdError:  # B's first request after the restart may fail
                    continue
                try:
                    wait_for(events, "session/didAppend", timeout=1.0,
                             where=lambda p, ids=ids: p["messageIds"] == ids)
                    break
                except AssertionError:
                    continue
            ids = cb.append(sid, [{"role": "user", "content": "and on"}])["messageIds"]
            got = wait_for(events, "session/didAppend", where=lambda p: p["messageIds"] == ids)
            assert got["status"]["archiveMessages"] == len(ca.read(sid)["messages"])
    finally:
        _stop_running(procs)
        cluster.stop()


def test_a_daemon_reads_nothing_for_the_sessions_none_of_its_clients_watch(
    tmp_path: Path, pg_cluster: PgCluster, pg_dsn: str,
) -> None:
    """B's appends to a session no client of A subscribes to are not read on A: not
    even handed to A's relay, which would say in its debug log that it let one pass
    (tests/test_pg_events.py counts the rows on the server); once a client of A
    subscribes, they reach it again, status and all."""
    env = _pg_env(pg_cluster, pg_dsn)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    a = DaemonProcess(tmp_path / "a", env={**env, "CTXD_LOG_LEVEL": "DEBUG"}).start()
    b = DaemonProcess(tmp_path / "b", env=env).start()
    try:
        with a.client("jsonrpc") as ca, a.client("zmq") as za, b.client() as cb:
            quiet = cb.create_session()["sessionId"]
            marker = cb.create_session()["sessionId"]
            ca.subscribe(marker)
            events = ca.notifications(timeout=0.5)

            def barrier() -> None:
                """B's events reach A in the order B committed them: once the marker's
                append is relayed, every earlier one has been handled."""
                ids = cb.append(marker, [{"role": "user", "content": "mark"}])["messageIds"]
                wait_for(events, "session/didAppend", where=lambda p: p["messageIds"] == ids)

            def passed() -> list[str]:
                return [line for line in a.log_path.read_text().splitlines()
                        if "not relayed: no subscriber here" in line]

            for i in range(3):
                cb.append(quiet, [{"role": "user", "content": f"q{i}"}])
            barrier()
            assert passed() == []

            za.subscribe(quiet)  # a ZeroMQ subscriber this time
            zevents = za.notifications(timeout=0.5)
            ids = cb.append(quiet, [{"role": "user", "content": "q3"}])["messageIds"]
            got = wait_for(zevents, "session/didAppend", where=lambda p: p["messageIds"] == ids)
            assert got["status"]["archiveMessages"] == 4
            barrier()
            assert passed() == []
    finally:
        for d in (a, b):
            d.stop()
