"""Adapters that drive ctxd and the systems users would pick instead, through one interface.

Every adapter stores one agent session in its own directory and offers the three things
an agent loop does: append one turn, read the model input for the next step, and look
for a phrase in the history. Each peer is driven through its public API the way its
documentation shows, on its own defaults (journal mode, `synchronous`):

- LangGraph: a `StateGraph` whose `messages` channel uses the `add_messages` reducer, a
  trivial node that appends the turn, compiled with `SqliteSaver` (one checkpoint per
  super-step); the model input is `graph.get_state(config).values["messages"]`.
- OpenAI Agents SDK: `SQLiteSession.add_items` / `get_items()` (or `get_items(limit=80)`),
  driven with asyncio since the API is async.
- LangChain: `SQLChatMessageHistory` on SQLite, `add_messages` / `.messages`.

Turns arrive as OpenAI chat messages (bench/workload.py) and are converted into each
framework's own types before timing starts (`prepare`), so the timings measure storage
and retrieval, not conversion. Tool calls and tool results are converted with their ids
so every framework sees the same pairs.

The peer frameworks are imported lazily inside their adapters: none of them is needed to
run or test ctxd, only to run this benchmark (`pip install -e '.[bench]'`).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import apsw
import msgspec

from bench.workload import Message
from ctxd.daemon.config import Config
from ctxd.daemon.engine import Engine
from ctxd.daemon.messages import message_text
from ctxd.daemon.stores.sql import search_text
from ctxd.daemon.stores.sqlite import fts

# the number of most recent items a "last N" reader takes (the SDK docs' limit example
# and ctxd's default compaction threshold are both around this size)
LAST_N = 80
SEARCH_LIMIT = 20


def dir_bytes(path: Path) -> int:
    """Apparent size of every file under `path` (database, WAL and shared-memory files)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:
                pass  # a WAL file can vanish between listing and stat
    return total


class Store:
    """One agent session in one system. Subclasses override the five operations."""

    key = "base"
    label = "base"

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def prepare(self, turns: list[list[Message]]) -> list[Any]:
        """Turns converted to this system's own message types (not timed)."""
        return turns

    def append(self, turn: Any) -> None:
        raise NotImplementedError

    def read(self) -> int:
        """Fetch the model input for the next step; returns how many messages it holds."""
        raise NotImplementedError

    def search(self, text: str) -> int:
        """Up to SEARCH_LIMIT newest-or-best hits for `text`; returns how many were found."""
        raise NotImplementedError

    def disk_bytes(self) -> int:
        return dir_bytes(self.root)

    def cpu_seconds(self) -> float:
        """CPU time spent so far by every process doing this system's work. On a shared
        machine it is steadier than wall time (it leaves out waiting for a core)."""
        return time.process_time()

    def close(self) -> None:
        pass


def _contains(haystack: str, needle: str) -> bool:
    # what a user scanning loaded history in Python would write: case-insensitive
    # substring for English, exact for Chinese (lower() leaves Han characters alone)
    return needle in haystack.lower()


# ------------------------------------------------------------------------ ctxd


class CtxdEngine(Store):
    """The engine as a library, in this process. Auto-compaction runs when the policy says
    it is due after an append, as the daemon's scheduler does after `messages/append`."""

    key = "ctxd-inproc"
    label = "ctxd in-process"

    def __init__(self, root: Path, session_id: str | None = None) -> None:
        super().__init__(root)
        self.engine = Engine(Config(data_dir=root))
        self.runner = asyncio.Runner()
        if session_id is None:
            # wire form: a dict on every revision compared
            session_id = msgspec.to_builtins(self.engine.create_session(title="bench"))[
                "sessionId"]
        self.sid = session_id
        self.compactions = 0
        self.compaction_seconds = 0.0

    def append(self, turn: list[Message]) -> None:
        self.engine.append(self.sid, turn)
        if self.engine.auto_compaction_due(self.sid):
            t0 = time.perf_counter()
            self.runner.run(self.engine.compact(self.sid, trigger="auto"))
            self.compaction_seconds += time.perf_counter() - t0
            self.compactions += 1

    def append_many(self, turns: Iterable[list[Message]], per_call: int = 200) -> None:
        """Fast fill: whole turns in batches of about `per_call` messages, compacting when
        due after each batch (the context ends up as bounded as with per-turn appends)."""
        batch: list[Message] = []
        for turn in turns:
            batch.extend(turn)
            if len(batch) >= per_call:
                self.append(batch)
                batch = []
        if batch:
            self.append(batch)

    def read(self) -> int:
        return len(self.engine.get_context(self.sid).messages)

    def context(self) -> list[dict[str, Any]]:
        return self.engine.get_context(self.sid).messages

    def search(self, text: str) -> int:
        return len(self.engine.search(text, session_id=self.sid, limit=SEARCH_LIMIT))

    def close(self) -> None:
        self.runner.close()
        self.engine.close()


class Daemon:
    """A real `ctxd serve` subprocess on `root/data`, with its runtime dir under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data_dir = root / "data"
        self.run_dir = root / "run"
        self.connection_file = self.run_dir / "ctxd.json"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = root / "daemon.log"

    def start(self, timeout: float = 30.0) -> Daemon:
        self.root.mkdir(parents=True, exist_ok=True)
        self.connection_file.unlink(missing_ok=True)
        env = {
            **os.environ,
            "CTXD_RUNTIME_DIR": str(self.run_dir),
            "CTXD_LOG_LEVEL": "WARNING",
        }
        cmd = [
            sys.executable,
            "-m",
            "ctxd.daemon",
            "serve",
            "--data-dir",
            str(self.data_dir),
            "--connection-file",
            str(self.connection_file),
        ]
        # output to a file, not a pipe: nobody reads a pipe here, and a full one would
        # stall the daemon mid-benchmark
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=log)
        deadline = time.monotonic() + timeout
        while not self.connection_file.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"ctxd daemon exited with {self.proc.returncode}: "
                    + self.log_path.read_text(errors="replace")[-2000:]
                )
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError("the ctxd daemon did not write its connection file")
            time.sleep(0.02)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def client(self, wire: str) -> Any:
        from ctxd.clients.client import connect

        return connect(connection_file=self.connection_file, wire=wire)  # type: ignore[arg-type]

    def cpu_seconds(self) -> float:
        """User + system CPU time of the daemon process so far."""
        with open(f"/proc/{self.pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        # fields[11] and [12] are utime and stime (fields 14 and 15 of proc(5))
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def memory(self) -> dict[str, int]:
        """VmHWM (peak) and VmRSS of the daemon, in bytes."""
        out: dict[str, int] = {}
        with open(f"/proc/{self.pid}/status", encoding="ascii") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmHWM", "VmRSS"):
                    out[key] = int(value.split()[0]) * 1024
        return out

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None


class CtxdWire(Store):
    """ctxd through the Python client over a real socket to a daemon subprocess. The
    daemon auto-compacts by itself after appends made outside a run."""

    def __init__(
        self,
        root: Path,
        wire: str,
        *,
        daemon: Daemon | None = None,
        session_id: str | None = None,
    ) -> None:
        super().__init__(root)
        self.wire = wire
        self.key = f"ctxd-{wire}"
        self.label = "ctxd over ZeroMQ" if wire == "zmq" else "ctxd over JSON-RPC (TCP)"
        self.own_daemon = daemon is None
        self.daemon = daemon or Daemon(root).start()
        self.client = self.daemon.client(wire)
        if session_id is None:
            session_id = self.client.call("session/create", {"title": "bench"})["sessionId"]
        self.sid = session_id

    def append(self, turn: list[Message]) -> None:
        self.client.call("messages/append", {"sessionId": self.sid, "messages": turn})

    def read(self) -> int:
        return len(self.client.call("context/get", {"sessionId": self.sid})["messages"])

    def search(self, text: str) -> int:
        params = {"query": text, "sessionId": self.sid, "limit": SEARCH_LIMIT}
        return len(self.client.call("archive/search", params)["hits"])

    def disk_bytes(self) -> int:
        return dir_bytes(self.daemon.data_dir)

    def cpu_seconds(self) -> float:
        return time.process_time() + self.daemon.cpu_seconds()

    def close(self) -> None:
        self.client.close()
        if self.own_daemon:
            self.daemon.stop()


# ------------------------------------------------------------------ the floor


class RawApsw(Store):
    """The physical floor of the archive: the same rows (the message JSON) and the same
    full-text index (the engine's CJK-split text in a unicode61 FTS5 table), one
    transaction per turn, the same pragmas as the archive; no validation, no token
    counts, no context bookkeeping. The model input is the last LAST_N rows."""

    key = "floor-apsw"
    label = "floor: raw APSW + FTS5"

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.conn = apsw.Connection(str(root / "floor.db"))
        self.conn.pragma("journal_mode", "wal")
        self.conn.pragma("synchronous", "normal")
        self.conn.execute(
            "CREATE TABLE messages (id INTEGER PRIMARY KEY, session_id TEXT NOT NULL, "
            "role TEXT NOT NULL, body TEXT NOT NULL, created_at REAL NOT NULL);"
            "CREATE INDEX messages_by_session ON messages(session_id, id);"
            "CREATE VIRTUAL TABLE messages_fts USING fts5("
            "body, tokenize = 'unicode61 remove_diacritics 2');"
        )
        self.next_id = 1

    def append(self, turn: list[Message]) -> None:
        now = time.time()
        first = self.next_id
        self.next_id += len(turn)
        bodies = [json.dumps(m, ensure_ascii=False, separators=(",", ":")) for m in turn]
        with self.conn:
            self.conn.executemany(
                "INSERT INTO messages(id, session_id, role, body, created_at) "
                "VALUES (?, 's', ?, ?, ?)",
                [
                    (first + i, m["role"], b, now)
                    for i, (m, b) in enumerate(zip(turn, bodies, strict=True))
                ],
            )
            self.conn.executemany(
                "INSERT INTO messages_fts(rowid, body) VALUES (?, ?)",
                [(first + i, search_text.index_text(message_text(m))) for i, m in enumerate(turn)],
            )

    def read(self, n: int = LAST_N) -> int:
        rows = self.conn.execute(
            "SELECT body FROM messages WHERE session_id = 's' ORDER BY id DESC LIMIT ?", (n,)
        ).fetchall()
        return len([json.loads(b) for (b,) in reversed(rows)])

    def search(self, text: str) -> int:
        match = fts.plain_query(text)
        if match is None:
            return 0
        rows = self.conn.execute(
            "SELECT m.id, snippet(messages_fts, 0, '**', '**', '…', 24) "
            "FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid "
            "WHERE messages_fts MATCH ? ORDER BY rank LIMIT ?",
            (match, SEARCH_LIMIT),
        ).fetchall()
        return len(rows)

    def close(self) -> None:
        self.conn.close()


# --------------------------------------------------------- OpenAI Agents SDK


def to_agents_items(turn: list[Message]) -> list[dict[str, Any]]:
    """OpenAI chat messages as Responses API input items, the shape `SQLiteSession` stores:
    an assistant message with tool calls becomes its text (if any) followed by one
    `function_call` item per call; a tool message becomes a `function_call_output`."""
    items: list[dict[str, Any]] = []
    for m in turn:
        role = m["role"]
        if role in ("system", "user"):
            items.append({"role": role, "content": m["content"]})
        elif role == "assistant":
            if m.get("content"):
                items.append(
                    {
                        "type": "message",
                        "role": "assistant",
                        "status": "completed",
                        "content": [
                            {"type": "output_text", "text": m["content"], "annotations": []}
                        ],
                    }
                )
            for call in m.get("tool_calls") or ():
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call["id"],
                        "name": call["function"]["name"],
                        "arguments": call["function"]["arguments"],
                        "status": "completed",
                    }
                )
        elif role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": m["tool_call_id"],
                    "output": m["content"],
                }
            )
    return items


def split_pair_share(turns: list[list[dict[str, Any]]], limit: int = LAST_N) -> float:
    """Share of steps whose newest-`limit` items hold a `function_call_output` without its
    `function_call`: a request the model API refuses unless the caller repairs it."""
    items: list[dict[str, Any]] = []
    split = 0
    for turn in turns:
        items.extend(turn)
        window = items[-limit:]
        calls = {i["call_id"] for i in window if i.get("type") == "function_call"}
        if any(
            i.get("type") == "function_call_output" and i["call_id"] not in calls for i in window
        ):
            split += 1
    return split / max(1, len(turns))


def agents_item_text(item: dict[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    if item.get("type") == "function_call":
        return f"{item['name']} {item['arguments']}"
    return str(item.get("output", ""))


class AgentsSQLite(Store):
    """OpenAI Agents SDK `SQLiteSession` on a file. `limit=None` reads the whole history
    each step (the SDK's default); `limit=80` reads the newest 80 items, a plain cut that
    can separate a `function_call_output` from its `function_call`."""

    def __init__(self, root: Path, limit: int | None = None) -> None:
        super().__init__(root)
        from agents import SQLiteSession

        self.limit = limit
        self.key = "agents" if limit is None else f"agents-last{limit}"
        self.label = (
            "OpenAI Agents `SQLiteSession`, `get_items()`"
            if limit is None
            else f"OpenAI Agents `SQLiteSession`, `get_items(limit={limit})`"
        )
        self.session = SQLiteSession("bench", root / "agents.db")
        # the SDK's API is async: a long-lived loop, as in an agent's own process
        self.runner = asyncio.Runner()

    def prepare(self, turns: list[list[Message]]) -> list[Any]:
        return [to_agents_items(t) for t in turns]

    def append(self, turn: list[dict[str, Any]]) -> None:
        self.runner.run(self.session.add_items(turn))

    def read(self) -> int:
        return len(self.runner.run(self.session.get_items(limit=self.limit)))

    def search(self, text: str) -> int:
        # no search API: load the whole history and scan it
        items = self.runner.run(self.session.get_items())
        hits = [i for i in reversed(items) if _contains(agents_item_text(i), text)]
        return len(hits[:SEARCH_LIMIT])

    def close(self) -> None:
        self.session.close()
        self.runner.close()


# ------------------------------------------------------------------- LangChain


def to_langchain(turn: list[Message]) -> list[Any]:
    """OpenAI chat messages as LangChain message objects, tool calls with parsed args."""
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    out: list[Any] = []
    for m in turn:
        role = m["role"]
        if role == "system":
            out.append(SystemMessage(content=m["content"]))
        elif role == "user":
            out.append(HumanMessage(content=m["content"]))
        elif role == "assistant":
            calls = [
                {
                    "name": c["function"]["name"],
                    "args": json.loads(c["function"]["arguments"] or "{}"),
                    "id": c["id"],
                    "type": "tool_call",
                }
                for c in m.get("tool_calls") or ()
            ]
            out.append(AIMessage(content=m.get("content") or "", tool_calls=calls))
        elif role == "tool":
            out.append(ToolMessage(content=m["content"], tool_call_id=m["tool_call_id"]))
    return out


def langchain_text(msg: Any) -> str:
    text = msg.content if isinstance(msg.content, str) else json.dumps(msg.content)
    for call in getattr(msg, "tool_calls", None) or ():
        text += f"\n{call['name']} {json.dumps(call['args'], ensure_ascii=False)}"
    return text


class LangChainSQL(Store):
    """LangChain `SQLChatMessageHistory` (langchain-community) on a SQLite file."""

    key = "langchain"
    label = "LangChain `SQLChatMessageHistory`"

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        from langchain_community.chat_message_histories import SQLChatMessageHistory

        self.history = SQLChatMessageHistory(
            session_id="bench", connection=f"sqlite:///{root / 'langchain.db'}"
        )

    def prepare(self, turns: list[list[Message]]) -> list[Any]:
        return [to_langchain(t) for t in turns]

    def append(self, turn: list[Any]) -> None:
        self.history.add_messages(turn)

    def read(self) -> int:
        return len(self.history.messages)

    def search(self, text: str) -> int:
        msgs = self.history.messages
        hits = [m for m in reversed(msgs) if _contains(langchain_text(m), text)]
        return len(hits[:SEARCH_LIMIT])

    def close(self) -> None:
        self.history.engine.dispose()


# ------------------------------------------------------------------- LangGraph


class LangGraphSqlite(Store):
    """LangGraph with `SqliteSaver`: messages in graph state through `add_messages`, one
    trivial node that appends the turn, a checkpoint per super-step. The agent reads
    `graph.get_state(config).values["messages"]` before each model call."""

    key = "langgraph"
    label = "LangGraph + `SqliteSaver`"

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        import sqlite3
        from typing import Annotated, TypedDict

        from langchain_core.messages import AnyMessage
        from langgraph.checkpoint.sqlite import SqliteSaver
        from langgraph.graph import END, START, StateGraph
        from langgraph.graph.message import add_messages

        # the functional form: annotations must be real objects for LangGraph to read the
        # reducer, and this module postpones the evaluation of class annotations
        State = TypedDict(  # noqa: UP013
            "State",
            {"messages": Annotated[list[AnyMessage], add_messages], "turn": list[AnyMessage]},
        )

        def agent(state: Any) -> dict[str, Any]:
            # stands in for the model call: the turn it produced joins the messages
            return {"messages": state["turn"]}

        builder = StateGraph(State)
        builder.add_node("agent", agent)
        builder.add_edge(START, "agent")
        builder.add_edge("agent", END)
        # the documented set-up: a sqlite3 connection shared with the saver
        self.conn = sqlite3.connect(str(root / "langgraph.db"), check_same_thread=False)
        self.saver = SqliteSaver(self.conn)
        self.graph = builder.compile(checkpointer=self.saver)
        self.config: Any = {"configurable": {"thread_id": "bench"}}

    def prepare(self, turns: list[list[Message]]) -> list[Any]:
        return [to_langchain(t) for t in turns]

    def append(self, turn: list[Any]) -> None:
        self.graph.invoke({"turn": turn}, self.config)

    def messages(self) -> list[Any]:
        return self.graph.get_state(self.config).values.get("messages", [])

    def read(self) -> int:
        return len(self.messages())

    def search(self, text: str) -> int:
        hits = [m for m in reversed(self.messages()) if _contains(langchain_text(m), text)]
        return len(hits[:SEARCH_LIMIT])

    def close(self) -> None:
        self.conn.close()


def peer_versions() -> list[tuple[str, str]]:
    """Installed versions of the peers and of what ctxd itself stands on."""
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for name in (
        "langgraph",
        "langgraph-checkpoint-sqlite",
        "langgraph-checkpoint",
        "openai-agents",
        "langchain-community",
        "langchain-core",
        "SQLAlchemy",
        "greenlet",
        "pyzmq",
        "msgpack",
        "tiktoken",
    ):
        try:
            out.append((name, version(name)))
        except PackageNotFoundError:
            out.append((name, "not installed"))
    import sqlite3

    out.append(("sqlite3 module's SQLite (used by the peers)", sqlite3.sqlite_version))
    return out
