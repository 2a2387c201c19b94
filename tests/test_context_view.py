"""What the engine keeps between requests (rendered model inputs, open runs, pending
approvals) always equals what a fresh engine reads from the file.

A random sequence of every kind of change (appends of each role, runs, approvals, pins,
compactions, rebuild previews, clear, pop) on two sessions; after each step the model
input, a budgeted projection and the status are compared with those of a new engine
opened on the same file, which has nothing kept.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import msgspec
import pytest
from helpers import make_config

from ctxd.daemon import context_edit
from ctxd.daemon.engine import Engine
from ctxd.protocol.errors import CtxdError

STATUS_KEYS = ("activeMessages", "estimatedTokens", "archiveMessages", "pendingApprovals",
               "activeRunId", "version", "compactionCount")


class Driver:
    def __init__(self, engine: Engine, rng: random.Random) -> None:
        self.engine = engine
        self.rng = rng
        self.sessions = [engine.create_session().session_id for _ in range(2)]
        self.calls: dict[str, list[str]] = {s: [] for s in self.sessions}  # unanswered
        self.runs: dict[str, str | None] = dict.fromkeys(self.sessions)
        self.n = 0

    def step(self, sid: str) -> None:
        e, rng = self.engine, self.rng
        self.n += 1
        n = self.n
        op = rng.choice(["user", "user", "system", "call", "result", "result", "run", "run",
                         "approve", "resolve", "pin", "unpin", "compact", "preview", "pop",
                         "clear", "metadata"])
        run_id = self.runs[sid]
        if op == "user":
            e.append(sid, [{"role": "user", "content": f"step {n}: " + "word " * rng.randrange(40)},
                           {"role": "assistant", "content": f"answer {n}"}], run_id=run_id)
        elif op == "system":
            e.append(sid, [{"role": "system", "content": f"rule {n}"}])
        elif op == "call":
            cid = f"call_{n}"
            e.append(sid, [{"role": "assistant", "content": None, "tool_calls": [
                {"id": cid, "type": "function",
                 "function": {"name": "read", "arguments": f'{{"n": {n}}}'}}]}], run_id=run_id)
            self.calls[sid].append(cid)
        elif op == "result" and self.calls[sid]:
            cid = self.calls[sid].pop(rng.randrange(len(self.calls[sid])))
            result = {"role": "tool", "tool_call_id": cid, "content": "x" * rng.randrange(900)}
            e.append(sid, [result], run_id=run_id)
        elif op == "run":
            if run_id is None:
                self.runs[sid] = e.start_run(sid).run_id
            else:
                self.runs[sid] = None
                e.finish_run(run_id, rng.choice(["completed", "failed"]))
        elif op == "approve" and run_id is not None and self.calls[sid]:
            e.request_approval(sid, run_id, rng.choice(self.calls[sid]), "read", {"n": n})
        elif op == "resolve":
            pending = e.list_approvals(sid, "pending")
            if pending:
                e.resolve_approval(rng.choice(pending).approval_id,
                                   rng.choice(["approved", "denied"]))
        elif op == "pin":
            e.add_pin(sid, f"pin {n}")
        elif op == "unpin":
            pins = e.pins(sid)
            if pins:
                e.remove_pin(sid, rng.choice(pins).pin_id)
        elif op == "compact":
            e.compact_sync(sid, force=True)
        elif op == "preview":
            asyncio.run(e.rebuild(sid, dry_run=True))
        elif op == "pop":
            context_edit.pop(e, sid, rng.randrange(1, 4))
        elif op == "clear":
            context_edit.clear(e, sid)
        elif op == "metadata":
            e.append(sid, [{"role": "user", "content": f"with metadata {n}",
                            "metadata": {"k": [n, {"n": n}]}}], run_id=run_id)


def _seen(engine: Engine, sid: str) -> dict[str, Any]:
    return {
        "context": engine.get_context(sid),
        "budgeted": engine.get_context(sid, budget_tokens=400),
        "metadata": engine.get_context(sid, include_metadata=True).messages,
        "status": {k: msgspec.to_builtins(engine.status(sid))[k] for k in STATUS_KEYS},
        "pins": engine.pins(sid),
        "pending": engine.pending_approvals(sid),
    }


def _compare(engine: Engine, data_dir: Path, sid: str) -> None:
    kept = _seen(engine, sid)
    fresh_engine = Engine(make_config(data_dir))
    try:
        fresh = _seen(fresh_engine, sid)
    finally:
        fresh_engine.close()
    for part in ("context", "budgeted"):
        kept[part] = msgspec.structs.replace(kept[part], status=None)
        fresh[part] = msgspec.structs.replace(fresh[part], status=None)
    assert kept == fresh


@pytest.mark.parametrize("bounds", [None, (1, 3000)], ids=["default", "tiny-bounds"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_kept_state_equals_a_fresh_read(
    tmp_path: Path, seed: int, bounds: tuple[int, int] | None
) -> None:
    data_dir = tmp_path / "data"
    engine = Engine(make_config(data_dir, max_active_messages=30, keep_messages=8))
    if bounds is not None:  # evicted again and again: every read may be a fresh one
        engine.view.max_sessions, engine.view.max_chars = bounds
    driver = Driver(engine, random.Random(seed))
    refused = 0
    try:
        for i in range(120):
            sid = driver.sessions[i % 2 if i % 5 else 0]
            try:
                driver.step(sid)
            except CtxdError:
                refused += 1  # a refused change changes nothing: compared all the same
            _compare(engine, data_dir, sid)
        # the changes were not all refused: the comparison saw a context that moved
        assert refused < 60
        assert engine.status(driver.sessions[0]).archive_messages > 20
    finally:
        engine.close()


def test_a_caller_changing_its_messages_changes_no_later_read(engine: Engine) -> None:
    sid = engine.create_session().session_id
    engine.append(sid, [{"role": "system", "content": "rules"},
                        {"role": "user", "content": "hello"}])
    engine.add_pin(sid, "keep this")
    first = engine.get_context(sid).messages
    for m in first:
        m["content"] = "changed"
        m["extra"] = 1
    tail = engine.tail_messages(sid, engine.context_state(sid))
    tail.clear()
    popped = context_edit.pop(engine, sid, 1).messages
    popped[0]["content"] = "changed"
    assert [m["content"] for m in engine.get_context(sid).messages][::2] == ["rules"]
    context_edit.clear(engine, sid)
    engine.append(sid, [{"role": "user", "content": "again"}])
    again = engine.get_context(sid).messages
    assert [m.get("extra") for m in again] == [None, None]
    assert again[-1] == {"role": "user", "content": "again"}
    assert again[0]["content"].endswith("- keep this")


def test_messages_appended_by_the_caller_are_not_shared_with_the_kept_context(
    engine: Engine,
) -> None:
    sid = engine.create_session().session_id
    engine.append(sid, [{"role": "user", "content": "first"}])
    engine.get_context(sid)  # the tail is kept from here on
    parts = [{"type": "text", "text": "second"}]
    engine.append(sid, [{"role": "user", "content": parts}])
    parts[0]["text"] = "changed after the append"
    last = engine.get_context(sid).messages[-1]
    assert last["content"] == [{"type": "text", "text": "second"}]


def test_a_read_between_a_commit_elsewhere_and_its_bookkeeping_keeps_each_message_once(
    engine: Engine,
) -> None:
    # a large batch is committed on a connection of its own (daemon/offload.py) and the
    # engine is told on the event loop afterwards; a context/get may run in between
    from ctxd.daemon import offload

    sid = engine.create_session().session_id
    engine.append(sid, [{"role": "user", "content": "first"}])
    prepared = engine.prepare_append([{"role": "user", "content": "second"},
                                      {"role": "assistant", "content": "answer"}])
    assert prepared.tokens is not None
    rows = [(m, body, n) for (m, body), n in
            zip(prepared.normalized, prepared.tokens, strict=True)]
    st = engine.context_state(sid)
    batch_id, ids, created_at, new = offload._commit(
        engine.config.db_path, engine.config.durability, st, rows, prepared, None, None)
    # nothing kept: the read in between reads the file (the archive's count too)
    engine.view.forget(sid)
    engine._archive_counts.pop(sid)
    engine.get_context(sid)
    engine.append_committed(new, rows, ids, batch_id, created_at, None, 0, elsewhere=True)
    contents = [m["content"] for m in engine.get_context(sid).messages]
    assert contents == ["first", "second", "answer"]
    assert engine.status(sid).archive_messages == 3
