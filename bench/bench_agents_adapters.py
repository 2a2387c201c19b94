"""The framework adapters against each framework's own SQLite store, per agent step.

Each pair runs the same seeded agent session (bench/workload.py) the way the framework
drives its store on every model call: read the model input, then store the turn.

- OpenAI Agents SDK: `SQLiteSession` (`get_items()`, and `get_items(limit=80)`) against
  `CtxdSession`, through `get_items` + `add_items` on one long-lived event loop.
- LangChain: `SQLChatMessageHistory` against `CtxdChatMessageHistory`, `.messages` +
  `add_messages` (what `RunnableWithMessageHistory` calls per invoke).
- LangGraph: a graph with `SqliteSaver` whose model input is the whole state, against
  the same graph and saver with `CtxdThreadMemory.pre_model_hook` giving the model
  ctxd's context (the state and its checkpoints are still written: ctxd adds to it).

The store is first filled to 1,000 and 10,000 messages (not timed; ctxd's daemon then
compacts as it does in use), then the next turns are timed one step each. Usage:

    python bench/bench_agents_adapters.py            # about 5-10 minutes
    python bench/bench_agents_adapters.py --steps 20 --sizes 1000

The report goes to bench/results/agents_adapters.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# Run as a script, the repository root is not on sys.path; `bench.*` needs it.
if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_core import machine_info  # noqa: E402
from bench.bench_peers import Scratch, ctxd_revision, fmt_ms, log, table  # noqa: E402
from bench.peers import LAST_N, Daemon, peer_versions, to_agents_items, to_langchain  # noqa: E402
from bench.workload import Message, turns  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
FILL_CHUNK = 400  # messages per untimed fill call


def _size(obj: Any) -> int:
    return len(json.dumps(obj, ensure_ascii=False, default=str).encode())


def _lc_size(msgs: list[Any]) -> int:
    return _size([m.model_dump() for m in msgs])


def _items_orphan(items: list[Any]) -> bool:
    """A `function_call_output` without its `function_call` before it: a request the model
    API refuses unless the caller repairs it."""
    calls: set[str] = set()
    for i in items:
        if i.get("type") == "function_call":
            calls.add(i["call_id"])
        elif i.get("type") == "function_call_output" and i["call_id"] not in calls:
            return True
    return False


def _lc_orphan(msgs: list[Any]) -> bool:
    calls: set[str] = set()
    for m in msgs:
        calls.update(c["id"] for c in getattr(m, "tool_calls", None) or ())
        if m.type == "tool" and m.tool_call_id not in calls:
            return True
    return False


def _chunks(turns_: list[list[Any]], size: int = FILL_CHUNK) -> list[list[Any]]:
    out: list[list[Any]] = [[]]
    for t in turns_:
        if len(out[-1]) >= size:
            out.append([])
        out[-1].extend(t)
    return [c for c in out if c]


class Contender:
    key = "base"
    label = "base"

    def fill(self, turns_: list[list[Message]]) -> None:
        raise NotImplementedError

    def step(self, turn: list[Message]) -> list[Any]:
        """Read the model input, store the turn; returns the model input."""
        raise NotImplementedError

    def measure(self, got: list[Any]) -> tuple[int, int, bool]:
        """The model input's messages and bytes, and whether it held a tool result without
        its call (measured outside the timed step)."""
        if got and isinstance(got[0], dict):
            return len(got), _size(got), _items_orphan(got)
        return len(got), _lc_size(got), _lc_orphan(got)

    def close(self) -> None:
        pass


def settle(daemon: Daemon, sid: str, timeout: float = 300.0) -> None:
    """Wait until the daemon's compaction has brought the context under its limits."""
    with daemon.client("zmq") as c:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = c.context_status(sid)
            if st["compacting"]:
                time.sleep(0.1)
            elif st["activeMessages"] > 100 and not c.compact(sid)["effective"]:
                return
            elif st["activeMessages"] <= 100:
                return


class AgentsSQLite(Contender):
    def __init__(self, root: Path, limit: int | None) -> None:
        from agents import SQLiteSession

        self.limit = limit
        self.key = "agents-sqlite" if limit is None else "agents-sqlite-last80"
        self.label = (
            "`SQLiteSession`, `get_items(" + ("" if limit is None else f"limit={limit}") + ")`"
        )
        self.loop = asyncio.Runner()
        self.session = SQLiteSession("bench", root / "agents.db")

    def fill(self, turns_: list[list[Message]]) -> None:
        for chunk in _chunks([to_agents_items(t) for t in turns_]):
            self.loop.run(self.session.add_items(chunk))

    def step(self, turn: list[Message]) -> list[Any]:
        items = to_agents_items(turn)
        got = self.loop.run(self.session.get_items(limit=self.limit))
        self.loop.run(self.session.add_items(items))
        return got

    def close(self) -> None:
        self.session.close()
        self.loop.close()


class AgentsCtxd(Contender):
    key = "agents-ctxd"
    label = "`CtxdSession` (ctxd daemon, JSON-RPC)"

    def __init__(self, daemon: Daemon) -> None:
        from ctxd.clients.integrations.openai_agents import CtxdSession

        self.daemon = daemon
        self.loop = asyncio.Runner()
        self.session = CtxdSession("agents", connection_file=str(daemon.connection_file))

    def fill(self, turns_: list[list[Message]]) -> None:
        for chunk in _chunks([to_agents_items(t) for t in turns_]):
            self.loop.run(self.session.add_items(chunk))
        settle(self.daemon, "agents")

    def step(self, turn: list[Message]) -> list[Any]:
        items = to_agents_items(turn)
        got = self.loop.run(self.session.get_items())
        self.loop.run(self.session.add_items(items))
        return got

    def close(self) -> None:
        self.loop.run(self.session.close())
        self.loop.close()


class LangChainSQL(Contender):
    key = "lc-sql"
    label = "`SQLChatMessageHistory` (SQLite)"

    def __init__(self, root: Path) -> None:
        from langchain_community.chat_message_histories import SQLChatMessageHistory

        self.history = SQLChatMessageHistory(
            session_id="bench", connection=f"sqlite:///{root / 'langchain.db'}"
        )

    def fill(self, turns_: list[list[Message]]) -> None:
        for chunk in _chunks([to_langchain(t) for t in turns_]):
            self.history.add_messages(chunk)

    def step(self, turn: list[Message]) -> list[Any]:
        msgs = to_langchain(turn)
        got = self.history.messages
        self.history.add_messages(msgs)
        return got

    def close(self) -> None:
        self.history.engine.dispose()


class LangChainCtxd(LangChainSQL):
    key = "lc-ctxd"
    label = "`CtxdChatMessageHistory` (ctxd daemon, JSON-RPC)"

    def __init__(self, daemon: Daemon) -> None:
        from ctxd.clients.integrations.langchain import CtxdChatMessageHistory

        self.daemon = daemon
        self.history = CtxdChatMessageHistory(
            "langchain", connection_file=str(daemon.connection_file)
        )

    def fill(self, turns_: list[list[Message]]) -> None:
        super().fill(turns_)
        settle(self.daemon, "langchain")

    def close(self) -> None:
        pass


class LangGraphSqlite(Contender):
    key = "lg-sqlite"
    label = "graph + `SqliteSaver`, whole state to the model"

    def __init__(self, root: Path, memory: Any = None) -> None:
        import sqlite3
        from typing import Annotated, TypedDict

        from langchain_core.messages import AnyMessage
        from langgraph.checkpoint.sqlite import SqliteSaver
        from langgraph.graph import END, START, StateGraph
        from langgraph.graph.message import add_messages

        State = TypedDict(  # noqa: UP013
            "State",
            {"messages": Annotated[list[AnyMessage], add_messages], "turn": list[AnyMessage]},
        )

        def agent(state: Any) -> dict[str, Any]:
            return {"messages": state["turn"]}  # the turn the model call produced

        builder = StateGraph(State)
        builder.add_node("agent", agent)
        builder.add_edge(START, "agent")
        builder.add_edge("agent", END)
        self.conn = sqlite3.connect(str(root / "langgraph.db"), check_same_thread=False)
        self.graph = builder.compile(checkpointer=SqliteSaver(self.conn))
        self.config: Any = {"configurable": {"thread_id": "bench"}}
        self.memory = memory

    def fill(self, turns_: list[list[Message]]) -> None:
        for chunk in _chunks([to_langchain(t) for t in turns_]):
            self.graph.invoke({"turn": chunk}, self.config)
            if self.memory is not None:  # ctxd takes the thread's messages as it grows
                self.model_input()

    def model_input(self) -> list[Any]:
        state = self.graph.get_state(self.config).values.get("messages", [])
        if self.memory is None:
            return list(state)
        out = self.memory.pre_model_hook({"messages": state}, self.config)
        return list(out["llm_input_messages"])

    def step(self, turn: list[Message]) -> list[Any]:
        msgs = to_langchain(turn)
        got = self.model_input()
        self.graph.invoke({"turn": msgs}, self.config)
        return got

    def close(self) -> None:
        self.conn.close()


class LangGraphCtxd(LangGraphSqlite):
    key = "lg-ctxd"
    label = "same graph + `CtxdThreadMemory.pre_model_hook`"

    def __init__(self, root: Path, daemon: Daemon) -> None:
        from ctxd.clients.integrations.langchain import CtxdThreadMemory

        self.daemon = daemon
        super().__init__(root, CtxdThreadMemory(connection_file=str(daemon.connection_file)))

    def fill(self, turns_: list[list[Message]]) -> None:
        super().fill(turns_)
        settle(self.daemon, "bench")


PAIRS = [
    ("OpenAI Agents SDK", ["agents-sqlite", "agents-sqlite-last80", "agents-ctxd"]),
    ("LangChain", ["lc-sql", "lc-ctxd"]),
    ("LangGraph", ["lg-sqlite", "lg-ctxd"]),
]


def make(key: str, root: Path, daemon: Daemon) -> Contender:
    root.mkdir(parents=True, exist_ok=True)
    return {
        "agents-sqlite": lambda: AgentsSQLite(root, None),
        "agents-sqlite-last80": lambda: AgentsSQLite(root, LAST_N),
        "agents-ctxd": lambda: AgentsCtxd(daemon),
        "lc-sql": lambda: LangChainSQL(root),
        "lc-ctxd": lambda: LangChainCtxd(daemon),
        "lg-sqlite": lambda: LangGraphSqlite(root),
        "lg-ctxd": lambda: LangGraphCtxd(root, daemon),
    }[key]()


def run_one(key: str, n: int, steps: int, cap: float, scratch: Scratch) -> dict[str, Any]:
    history = list(turns(n + 4 * steps + 40, seed=7))
    filled, count = [], 0
    while count < n:
        t = history[len(filled)]
        filled.append(t)
        count += len(t)
    timed = history[len(filled) : len(filled) + steps]
    root = scratch.new_dir(f"{key}-{n}")
    daemon = Daemon(root / "ctxd").start() if "ctxd" in key else None
    c = make(key, root, daemon)  # type: ignore[arg-type]
    try:
        t0 = time.perf_counter()
        c.fill(filled)
        log(f"{key} at {n}: filled {count} messages in {time.perf_counter() - t0:.1f} s")
        times, sizes = [], []
        deadline = time.monotonic() + cap
        for turn in timed:
            s = time.perf_counter()
            got = c.step(turn)
            times.append(time.perf_counter() - s)
            sizes.append(c.measure(got))
            if time.monotonic() > deadline:
                break
    finally:
        c.close()
        if daemon is not None:
            daemon.stop()
        scratch.drop(root)
    times.sort()
    return {
        "median": statistics.median(times),
        "p90": times[max(0, math.ceil(0.9 * len(times)) - 1)],
        "steps": len(times),
        "input_msgs": statistics.median(m for m, _, _ in sizes),
        "input_kb": statistics.median(b for _, b, _ in sizes) / 1024,
        "orphans": sum(1 for _, _, o in sizes if o),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1000,10000", help="history sizes in messages")
    p.add_argument("--steps", type=int, default=40, help="timed steps per store and size")
    p.add_argument("--cap", type=float, default=60.0, help="seconds of timed steps at most")
    p.add_argument("--tmp", help="directory for the scratch files (default: /tmp)")
    p.add_argument("--out", default=str(RESULTS / "agents_adapters.md"))
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    started = time.perf_counter()
    info = machine_info() + [("ctxd revision", ctxd_revision())] + peer_versions()
    parts = [
        "# The framework adapters against the frameworks' own SQLite stores\n",
        table(["", ""], info),
        "\nRun with `python bench/bench_agents_adapters.py`. A step is what the framework "
        "does with its store on every model call: read the model input, then store the "
        "new turn (bench/workload.py's seeded session: tool calls with results, ~1.8 "
        "messages a turn, a third of the prose Chinese). The ctxd stores talk to a real "
        "daemon subprocess over JSON-RPC (TCP, loopback); the daemon compacts with its "
        "defaults (over 80 messages, keep ~24). Times are wall-clock per step, median "
        f"and p90 of up to {args.steps} steps; 'model input' is the median size of what "
        "the step read for the model; the last column counts the steps whose model input held "
        "a tool result without the call it answers (a request the model API refuses). "
        "One run on a shared, noisy machine: differences "
        "under ~20% are not meaningful.\n",
    ]
    scratch = Scratch(args.tmp)
    try:
        for framework, keys in PAIRS:
            rows = []
            results: dict[tuple[str, int], dict[str, Any]] = {}
            for n in sizes:
                for key in keys:
                    log(f"{framework}: {key} at {n} messages")
                    r = results[key, n] = run_one(key, n, args.steps, args.cap, scratch)
                    rows.append(
                        [
                            f"{n:,}",
                            _label(key),
                            fmt_ms(r["median"]),
                            fmt_ms(r["p90"]),
                            f"{r['input_msgs']:,.0f}",
                            f"{r['input_kb']:,.0f}",
                            f"{r['orphans']} of {r['steps']}",
                        ]
                    )
            section = (
                f"## {framework}\n\n"
                + table(
                    [
                        "history",
                        "store",
                        "ms/step (median)",
                        "p90",
                        "model input (msgs)",
                        "model input (KB)",
                        "steps with a tool result but not its call",
                    ],
                    rows,
                )
                + "\n"
            )
            ctxd_key = keys[-1]
            ratios = [
                f"{_label(k)}: {_ratio(results, k, sizes):.2f}"
                for k in keys
                if (k, sizes[0]) in results and (k, sizes[-1]) in results and len(sizes) > 1
            ]
            if ratios:
                section += (
                    f"\nPer-step cost at {sizes[-1]:,} over {sizes[0]:,} messages: "
                    + "; ".join(ratios)
                    + f" ({_label(ctxd_key)} is ctxd).\n"
                )
            print(section, flush=True)
            parts.append(section)
    finally:
        scratch.close()
    try:
        load = "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    except OSError:
        load = "n/a"
    parts.append(
        f"Total run time {time.perf_counter() - started:.0f} s; load average at the end {load}.\n"
    )
    Path(args.out).write_text("\n".join(parts), encoding="utf-8")
    print(f"written to {args.out}")
    return 0


def _ratio(results: dict[tuple[str, int], dict[str, Any]], key: str, sizes: list[int]) -> float:
    return float(results[key, sizes[-1]]["median"] / results[key, sizes[0]]["median"])


def _label(key: str) -> str:
    return {
        "agents-sqlite": "`SQLiteSession`, `get_items()`",
        "agents-sqlite-last80": f"`SQLiteSession`, `get_items(limit={LAST_N})`",
        "agents-ctxd": "`CtxdSession`",
        "lc-sql": "`SQLChatMessageHistory`",
        "lc-ctxd": "`CtxdChatMessageHistory`",
        "lg-sqlite": "`SqliteSaver`, whole state",
        "lg-ctxd": "`SqliteSaver` + `CtxdThreadMemory`",
    }[key]


if __name__ == "__main__":
    sys.exit(main())
