"""Core engine benchmark: append, indexing, context build, search and compaction.

Everything runs in one process against the engine as a library (no sockets), on fresh
SQLite files in a temporary directory on the local disk, which is removed afterwards.
Usage:

    python bench/bench_core.py            # small sizes (20k-message archive), 1-3 minutes
    python bench/bench_core.py --full     # 100k-message archive, several minutes

The report (markdown) is printed and written to bench/results/ (see --out).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import apsw
import apsw.fts5

# Run as a script, the repository root is not on sys.path; `bench.workload` needs it.
if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.workload import (  # noqa: E402
    COMMON_WORD,
    RARE_WORD,
    ZH_PHRASE,
    ZH_WORD,
    Message,
    turns,
)
from ctxd.daemon import fts  # noqa: E402
from ctxd.daemon.config import Config  # noqa: E402
from ctxd.daemon.engine import Engine  # noqa: E402
from ctxd.daemon.messages import message_text, normalize_message  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
# the FTS5 table definition the archive uses (daemon/schema.py, messages_fts)
FTS_TOKENIZE = "unicode61 remove_diacritics 2"


@dataclass(frozen=True)
class Sizes:
    name: str
    append_messages: int  # per fresh database, section 1
    append_repeats: int
    index_messages: int  # section 2
    index_repeats: int
    unicodewords_messages: int  # the Python tokenizer is slow: a subset is enough
    big_archive: int  # sections 3 and 4
    small_archive: int
    context_calls: int
    search_calls: int
    compaction_rounds: int
    round_messages: int
    compaction_series: int
    # per-section time budgets (seconds): repeats stop early once one is spent
    budget: dict[str, float] = field(default_factory=dict)


SMALL = Sizes(
    name="small",
    append_messages=3_000,
    append_repeats=3,
    index_messages=20_000,
    index_repeats=3,
    unicodewords_messages=3_000,
    big_archive=20_000,
    small_archive=100,
    context_calls=200,
    search_calls=15,
    compaction_rounds=50,
    round_messages=60,
    compaction_series=2,
    budget={"append": 40, "index": 45, "fill": 150, "context": 15, "search": 20, "compact": 40},
)
FULL = Sizes(
    name="full",
    append_messages=20_000,
    append_repeats=3,
    index_messages=100_000,
    index_repeats=3,
    unicodewords_messages=10_000,
    big_archive=100_000,
    small_archive=100,
    context_calls=300,
    search_calls=25,
    compaction_rounds=50,
    round_messages=60,
    compaction_series=3,
    budget={
        "append": 300,
        "index": 400,
        "fill": 1200,
        "context": 40,
        "search": 90,
        "compact": 120,
    },
)


# ------------------------------------------------------------------------ helpers


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    @property
    def passed(self) -> bool:
        return time.monotonic() > self.end


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def fmt(value: float, digits: int = 0) -> str:
    if value != value:  # NaN: not measured
        return "n/a"
    return f"{value:,.{digits}f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


class Scratch:
    """Fresh data directories under one temporary root, all removed at the end."""

    def __init__(self, base: str | None) -> None:
        # /tmp is on the same disk as the repository on the reference machine; --tmp
        # moves the files elsewhere.
        self.root = Path(tempfile.mkdtemp(prefix="ctxd-bench-", dir=base))
        self.count = 0

    def new_dir(self) -> Path:
        self.count += 1
        path = self.root / f"d{self.count}"
        path.mkdir()
        return path

    def drop(self, path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def new_engine(scratch: Scratch) -> tuple[Engine, Path]:
    path = scratch.new_dir()
    return Engine(Config(data_dir=path)), path


def chunks(items: list[Message], size: int) -> Iterator[list[Message]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def machine_info() -> list[tuple[str, str]]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        load = "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    except OSError:
        load = "n/a"
    return [
        ("Date (UTC)", datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M")),
        ("CPU", cpu),
        ("Cores", str(os.cpu_count())),
        ("OS", platform.platform()),
        ("Python", platform.python_version()),
        ("SQLite", apsw.sqlite_lib_version()),
        ("APSW", apsw.apsw_version()),
        ("Load average at start", load),
    ]


# ------------------------------------------------------------------ 1. appending


def append_all(engine: Engine, sid: str, batches: list[list[Message]]) -> float:
    t0 = time.perf_counter()
    for batch in batches:
        engine.append(sid, batch)
    return time.perf_counter() - t0


def bench_append(sizes: Sizes, scratch: Scratch, report: Report) -> None:
    """Messages/s through Engine.append on a fresh database, per turn and per 100."""
    deadline = Deadline(sizes.budget["append"])
    per_turn: list[float] = []
    per_batch: list[float] = []
    n_turns = 0
    for rep in range(sizes.append_repeats):
        if rep and deadline.passed:
            break
        session_turns = list(turns(sizes.append_messages, seed=100 + rep))
        flat = [m for t in session_turns for m in t]
        n_turns = len(session_turns)
        # alternate which mode runs first so drift on a shared machine hits both
        order = ("turn", "batch") if rep % 2 == 0 else ("batch", "turn")
        for mode in order:
            engine, path = new_engine(scratch)
            sid = engine.create_session()["sessionId"]
            batches = session_turns if mode == "turn" else list(chunks(flat, 100))
            elapsed = append_all(engine, sid, batches)
            (per_turn if mode == "turn" else per_batch).append(len(flat) / elapsed)
            engine.close()
            scratch.drop(path)
    n = sizes.append_messages
    rows = [
        [
            "one agent turn per call",
            f"{n / n_turns:.2f}",
            fmt(median(per_turn)),
            fmt(median(per_turn) * n_turns / n),
            len(per_turn),
        ],
        [
            "100 messages per call",
            "100",
            fmt(median(per_batch)),
            fmt(median(per_batch) / 100, 1),
            len(per_batch),
        ],
    ]
    report.section(
        "1. Append throughput",
        f"`Engine.append` on a fresh database, {n:,} messages per run (validation, token "
        "counting, archive rows, FTS indexing, context counters; one transaction per call).",
        table(["Batching", "Messages/call", "Messages/s", "Calls/s", "Runs"], rows),
    )
    report.headline["append_turn"] = median(per_turn)
    report.headline["append_batch"] = median(per_batch)


# ------------------------------------------------------------------ 2. indexing


def fts_db(path: Path, tokenize: str, python_tokenizer: bool = False) -> apsw.Connection:
    # the same pragmas as daemon/schema.py open_database
    conn = apsw.Connection(str(path / "fts.db"))
    conn.pragma("journal_mode", "wal")
    conn.pragma("synchronous", "normal")
    if python_tokenizer:
        conn.register_fts5_tokenizer("unicodewords", apsw.fts5.UnicodeWordsTokenizer)
    conn.execute(f"CREATE VIRTUAL TABLE t USING fts5(body, tokenize = '{tokenize}')")
    return conn


def index_run(
    scratch: Scratch,
    texts: list[str],
    tx_sizes: list[int],
    prepare: Callable[[str], str] | None,
    tokenize: str = FTS_TOKENIZE,
    python_tokenizer: bool = False,
) -> float:
    """Rows/s inserting `texts` in transactions of `tx_sizes` rows, on a fresh file."""
    path = scratch.new_dir()
    conn = fts_db(path, tokenize, python_tokenizer)
    sql = "INSERT INTO t(rowid, body) VALUES (?, ?)"
    start = 0
    t0 = time.perf_counter()
    for size in tx_sizes:
        part = texts[start : start + size]
        with conn:
            if prepare is None:
                conn.executemany(sql, [(start + i + 1, x) for i, x in enumerate(part)])
            else:
                conn.executemany(sql, [(start + i + 1, prepare(x)) for i, x in enumerate(part)])
        start += size
    elapsed = time.perf_counter() - t0
    conn.close()
    scratch.drop(path)
    return start / elapsed


def bench_index(sizes: Sizes, scratch: Scratch, report: Report) -> None:
    """The archive's FTS path (CJK split + unicode61) against plain unicode61."""
    deadline = Deadline(sizes.budget["index"])
    session_turns = list(turns(sizes.index_messages, seed=200))
    texts = [message_text(normalize_message(m, 0, 1 << 30)[0]) for t in session_turns for m in t]
    mb = sum(len(x.encode()) for x in texts) / 1e6
    by_turn = [len(t) for t in session_turns]
    by_100 = [min(100, len(texts) - i) for i in range(0, len(texts), 100)]
    results: dict[tuple[str, str], list[float]] = {}
    prep_only: list[float] = []
    for rep in range(sizes.index_repeats):
        if rep and deadline.passed:
            break
        for tx_name, tx in (("100 rows", by_100), ("one turn", by_turn)):
            variants: list[tuple[str, Callable[[str], str] | None]] = [
                ("plain unicode61, raw text", None),
                ("engine: CJK split + unicode61", fts.index_text),
            ]
            if rep % 2:
                variants.reverse()
            for name, prepare in variants:
                rate = index_run(scratch, texts, tx, prepare)
                results.setdefault((tx_name, name), []).append(rate)
        t0 = time.perf_counter()
        for x in texts:
            fts.index_text(x)
        prep_only.append(len(texts) / (time.perf_counter() - t0))
    uw_rate = float("nan")
    uw_n = min(len(texts), sizes.unicodewords_messages)
    try:
        uw_tx = [min(100, uw_n - i) for i in range(0, uw_n, 100)]
        uw_rate = index_run(scratch, texts[:uw_n], uw_tx, None, "unicodewords", True)
    except apsw.Error as exc:  # an APSW build without the fts5 helpers
        print(f"unicodewords skipped: {exc}", file=sys.stderr)

    rows = []
    ratios: dict[str, float] = {}
    for tx_name in ("100 rows", "one turn"):
        raw = median(results.get((tx_name, "plain unicode61, raw text"), []))
        eng = median(results.get((tx_name, "engine: CJK split + unicode61"), []))
        ratios[tx_name] = eng / raw
        rows.append([tx_name, "plain unicode61, raw text", fmt(raw), "1.00"])
        rows.append([tx_name, "engine: CJK split + unicode61", fmt(eng), f"{eng / raw:.2f}"])
    raw100 = median(results[("100 rows", "plain unicode61, raw text")])
    rows.append(
        [
            "100 rows",
            f"apsw `unicodewords` (Python), first {uw_n:,} texts",
            fmt(uw_rate),
            f"{uw_rate / raw100:.2f}",
        ]
    )
    runs = len(results[("100 rows", "plain unicode61, raw text")])
    report.section(
        "2. Indexing speed",
        f"{len(texts):,} message texts ({mb:.1f} MB UTF-8, the text `message_text` extracts) "
        "inserted into a fresh FTS5 table per run, same pragmas as the archive (WAL, "
        f"synchronous=normal); medians of {runs} runs, variants alternating. The CJK split "
        f"alone (`fts.index_text`, no insert) runs at {fmt(median(prep_only))} texts/s.",
        table(["Transaction", "Table", "Rows/s", "vs plain"], rows),
    )
    report.headline["index_ratio_100"] = ratios["100 rows"]
    report.headline["index_ratio_turn"] = ratios["one turn"]


# -------------------------------------------------- shared: the big archive


@dataclass
class BigArchive:
    engine: Engine
    path: Path
    sid: str
    messages: int
    # append seconds per tenth of the fill, and calls in each tenth
    tenth_seconds: list[float]
    tenth_messages: list[int]
    compactions: int
    compaction_seconds: float
    suffix_seed: int


def build_big_archive(sizes: Sizes, scratch: Scratch, runner: asyncio.Runner) -> BigArchive:
    """One session of `big_archive` messages appended turn by turn, as an agent would.

    Auto-compaction runs whenever the policy says it is due, as the daemon's scheduler
    does, so the active context stays bounded. The last 99 messages repeat those of
    the small session of section 3 (same generator seed), so both contexts end alike.
    """
    deadline = Deadline(sizes.budget["fill"])
    engine, path = new_engine(scratch)
    sid = engine.create_session()["sessionId"]
    suffix_seed = 300
    suffix = list(turns(sizes.small_archive, seed=suffix_seed))
    # the big session has its own system prompt; only the conversation is repeated
    suffix[0] = [m for m in suffix[0] if m["role"] != "system"]
    suffix = [t for t in suffix if t]
    body = list(turns(sizes.big_archive - sum(len(t) for t in suffix), seed=301))
    all_turns = body + suffix
    total = sum(len(t) for t in all_turns)
    tenth = [0.0] * 10
    tenth_n = [0] * 10
    done = 0
    compactions = 0
    compaction_s = 0.0
    for t in all_turns:
        if deadline.passed:
            print(f"fill stopped by its time budget at {done:,} messages", file=sys.stderr)
            break
        t0 = time.perf_counter()
        engine.append(sid, t)
        dt = time.perf_counter() - t0
        k = min(9, done * 10 // total)
        tenth[k] += dt
        tenth_n[k] += len(t)
        done += len(t)
        if engine.auto_compaction_due(sid):
            t0 = time.perf_counter()
            runner.run(engine.compact(sid, trigger="auto"))
            compaction_s += time.perf_counter() - t0
            compactions += 1
    return BigArchive(
        engine, path, sid, done, tenth, tenth_n, compactions, compaction_s, suffix_seed
    )


def report_fill(big: BigArchive, report: Report) -> None:
    rates = [n / s for n, s in zip(big.tenth_messages, big.tenth_seconds, strict=True) if s]
    first, last = rates[0], rates[-1]
    t0 = time.perf_counter()
    for _ in range(20):
        big.engine.archive.message_count(big.sid)
    count_ms = (time.perf_counter() - t0) / 20 * 1e3
    rows = [[f"{(i + 1) * 10}%", fmt(r)] for i, r in enumerate(rates)]
    report.section(
        "1b. Append rate as one session grows",
        f"The archive for sections 3 and 4: {big.messages:,} messages appended turn by turn "
        f"to one session, with {big.compactions} auto-compactions "
        f"({big.compaction_seconds:.1f} s, not counted here). Append-only messages/s in "
        f"each tenth of the fill. Last/first tenth: {last / first:.2f}. For reference, "
        f"`archive.message_count` (run by `Engine.status`, i.e. by every append and every "
        f"`get_context`) takes {count_ms:.2f} ms at this size.",
        table(["Fill progress", "Messages/s"], rows),
    )
    report.headline["append_growth"] = last / first
    report.headline["count_ms"] = count_ms


# ----------------------------------------------------------- 3. context build


def bench_context(
    sizes: Sizes, scratch: Scratch, runner: asyncio.Runner, big: BigArchive, report: Report
) -> None:
    deadline = Deadline(sizes.budget["context"])
    small, small_path = new_engine(scratch)
    small_sid = small.create_session()["sessionId"]
    for t in turns(sizes.small_archive, seed=big.suffix_seed):
        small.append(small_sid, t)
    # both contexts brought down by a forced compaction of the same final messages
    runner.run(small.compact(small_sid, force=True))
    runner.run(big.engine.compact(big.sid, force=True))
    cases = [("small", small, small_sid), ("big", big.engine, big.sid)]
    timings: dict[tuple[str, str], list[float]] = {}
    calls = 0
    for i in range(sizes.context_calls):
        if i >= 20 and deadline.passed:
            break
        calls += 1
        for name, engine, sid in cases if i % 2 == 0 else cases[::-1]:
            for what, fn in (
                ("get_context", engine.get_context),
                ("context_messages", engine.context_messages),
                ("status", engine.status),
            ):
                t0 = time.perf_counter()
                fn(sid)
                timings.setdefault((name, what), []).append(time.perf_counter() - t0)
    rows = []
    for name, engine, sid in cases:
        st = engine.status(sid)
        rows.append(
            [
                f"{st['archiveMessages']:,}",
                st["activeMessages"],
                f"{st['estimatedTokens']:,}",
                fmt(median(timings[(name, "get_context")]) * 1e3, 3),
                fmt(median(timings[(name, "context_messages")]) * 1e3, 3),
                fmt(median(timings[(name, "status")]) * 1e3, 3),
            ]
        )
    ratio = {
        what: median(timings[("big", what)]) / median(timings[("small", what)])
        for what in ("get_context", "context_messages", "status")
    }
    rows.append(
        [
            "**ratio**",
            "",
            "",
            f"**{ratio['get_context']:.2f}**",
            f"{ratio['context_messages']:.2f}",
            f"{ratio['status']:.2f}",
        ]
    )
    report.section(
        "3. Context build",
        "`Engine.get_context` (the messages the model reads next, plus the status) for a "
        "session with a small archive and one with the big archive, each after a forced "
        "compaction; both end with the same messages. `get_context` = `context_messages` "
        f"+ `status`. Medians of {calls} calls each, interleaved, in ms.",
        table(
            [
                "Archived messages",
                "Active messages",
                "Active tokens",
                "get_context ms",
                "context_messages ms",
                "status ms",
            ],
            rows,
        ),
    )
    report.headline["context_ratio"] = ratio["get_context"]
    report.headline["context_big_ms"] = median(timings[("big", "get_context")]) * 1e3
    small.close()
    scratch.drop(small_path)


# ------------------------------------------------------------------- 4. search


def bench_search(sizes: Sizes, big: BigArchive, report: Report) -> None:
    deadline = Deadline(sizes.budget["search"])
    engine = big.engine
    queries: list[tuple[str, str, dict[str, Any]]] = [
        ("rare English word", RARE_WORD, {}),
        ("common English word, bm25 top-20", COMMON_WORD, {}),
        ("2-character Chinese word", ZH_WORD, {}),
        ("Chinese phrase (7 characters)", ZH_PHRASE, {}),
        ("common English word, newest first", COMMON_WORD, {"newest_first": True}),
        ("Chinese word, newest first, this session", ZH_WORD, {"newest_first": True, "sid": 1}),
    ]
    timings: dict[str, list[float]] = {label: [] for label, _, _ in queries}
    hits: dict[str, int] = {}
    for i in range(sizes.search_calls):
        if i >= 3 and deadline.passed:
            break
        for label, text, kw in queries if i % 2 == 0 else queries[::-1]:
            args = {k: v for k, v in kw.items() if k != "sid"}
            if "sid" in kw:
                args["session_id"] = big.sid
            t0 = time.perf_counter()
            found = engine.search(text, limit=20, **args)
            timings[label].append(time.perf_counter() - t0)
            hits[label] = len(found)
    rows = []
    for label, text, _ in queries:
        match = fts.plain_query(text)
        total = engine.conn.execute(
            "SELECT count(*) FROM messages_fts WHERE messages_fts MATCH ?", (match,)
        ).fetchone()[0]
        rows.append(
            [label, f"`{text}`", f"{total:,}", hits[label], fmt(median(timings[label]) * 1e3, 2)]
        )
    report.section(
        "4. Search latency",
        f"`Engine.search(limit=20)` over the {big.messages:,}-message archive (snippets "
        f"included); medians of {len(timings[queries[0][0]])} calls per query, in ms.",
        table(["Query", "Text", "Matching messages", "Returned", "Median ms"], rows),
    )
    report.headline["search_worst_ms"] = max(median(v) for v in timings.values()) * 1e3
    report.headline["search_common_ms"] = median(timings[queries[1][0]]) * 1e3


# --------------------------------------------------------------- 5. compaction


def bench_compaction(
    sizes: Sizes, scratch: Scratch, runner: asyncio.Runner, report: Report
) -> None:
    """Forced compaction after every ~60 appended messages, 50 times in one session."""
    deadline = Deadline(sizes.budget["compact"])
    per_round: list[list[tuple[float, int, int, int]]] = []
    for series in range(sizes.compaction_series):
        if series and deadline.passed:
            break
        engine, path = new_engine(scratch)
        sid = engine.create_session()["sessionId"]
        stream = turns(sizes.compaction_rounds * (sizes.round_messages + 20), seed=500 + series)
        rounds: list[tuple[float, int, int, int]] = []
        for _ in range(sizes.compaction_rounds):
            added = 0
            while added < sizes.round_messages:
                t = next(stream)
                engine.append(sid, t)
                added += len(t)
            t0 = time.perf_counter()
            result = runner.run(engine.compact(sid, force=True))
            dt = time.perf_counter() - t0
            st = engine.context_state(sid)
            first, last = result["summarizedFrom"], result["summarizedTo"]
            # ids are contiguous: this session is the only writer of its database
            left = 0 if first is None else last - first + 1
            rounds.append((dt, st.summary_tokens, engine.archive.message_count(sid), left))
        per_round.append(rounds)
        engine.close()
        scratch.drop(path)

    def group(lo: int, hi: int, idx: int) -> float:
        return median([r[lo - 1 + k][idx] for r in per_round for k in range(hi - lo + 1)])

    n = sizes.compaction_rounds
    early, late = (1, 5), (n - 4, n)
    rows = []
    for lo, hi in (early, late):
        rows.append(
            [
                f"{lo}–{hi}",
                fmt(group(lo, hi, 2)),
                fmt(group(lo, hi, 3)),
                fmt(group(lo, hi, 0) * 1e3, 1),
                fmt(group(lo, hi, 1)),
            ]
        )
    ratio = group(*late, 0) / group(*early, 0)
    rows.append(["**ratio**", "", "", f"**{ratio:.2f}**", ""])
    report.section(
        "5. Compaction time as history grows",
        f"One session: append ~{sizes.round_messages} messages (whole turns), then "
        f"`compact(force=True)` with the built-in summarizer; {n} times. Medians over "
        f"compactions {early[0]}–{early[1]} and {late[0]}–{late[1]} of {len(per_round)} "
        "series.",
        table(
            [
                "Compactions",
                "Archived messages",
                "Messages summarized",
                "Compaction ms",
                "Summary tokens after",
            ],
            rows,
        ),
    )
    report.headline["compaction_ratio"] = ratio
    report.headline["compaction_late_ms"] = group(*late, 0) * 1e3


# ------------------------------------------------------------------- report


class Report:
    def __init__(self, sizes: Sizes) -> None:
        self.sizes = sizes
        self.parts: list[str] = []
        self.headline: dict[str, float] = {}

    def section(self, title: str, intro: str, body: str) -> None:
        text = f"## {title}\n\n{intro}\n\n{body}\n"
        print(text, flush=True)
        self.parts.append(text)

    def summary(self) -> str:
        h = self.headline

        def verdict(ok: bool) -> str:
            return "ok" if ok else "**MISSED**"

        rows = [
            ["Append, one turn per call", f"{fmt(h['append_turn'])} msg/s", "—", ""],
            ["Append, 100 per call", f"{fmt(h['append_batch'])} msg/s", "—", ""],
            [
                "Append rate, last/first tenth of the big fill",
                f"{h['append_growth']:.2f}",
                "≈ 1",
                verdict(h["append_growth"] >= 0.67),
            ],
            [
                "Indexing, engine/plain (100-row tx)",
                f"{h['index_ratio_100']:.2f}",
                "≥ 0.5",
                verdict(h["index_ratio_100"] >= 0.5),
            ],
            [
                "Indexing, engine/plain (one-turn tx)",
                f"{h['index_ratio_turn']:.2f}",
                "≥ 0.5",
                verdict(h["index_ratio_turn"] >= 0.5),
            ],
            [
                f"Context build, {self.sizes.big_archive:,} vs {self.sizes.small_archive} archived",
                f"{h['context_ratio']:.2f} ({h['context_big_ms']:.2f} ms)",
                "≈ 1",
                verdict(h["context_ratio"] <= 1.5),
            ],
            [
                "Search, common word bm25 top-20",
                f"{h['search_common_ms']:.1f} ms",
                "—",
                "",
            ],
            ["Search, slowest query", f"{h['search_worst_ms']:.1f} ms", "—", ""],
            [
                f"Compaction, last 5 / first 5 of {self.sizes.compaction_rounds}",
                f"{h['compaction_ratio']:.2f} ({h['compaction_late_ms']:.1f} ms)",
                "≈ 1",
                verdict(h["compaction_ratio"] <= 1.5),
            ],
        ]
        return table(["Measure", "Result", "Target", ""], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="100k-message sizes")
    parser.add_argument("--tmp", help="directory for the scratch databases (default: /tmp)")
    parser.add_argument("--out", help="markdown output (default: bench/results/core[_full].md)")
    args = parser.parse_args(argv)
    sizes = FULL if args.full else SMALL
    out = Path(args.out) if args.out else RESULTS / ("core_full.md" if args.full else "core.md")

    info = machine_info()
    head = (
        f"# Core benchmark ({sizes.name} sizes)\n\n"
        + table(["", ""], info)
        + "\n\nRun with `python bench/bench_core.py"
        + (" --full" if args.full else "")
        + "`. See bench/README.md for what each number means.\n"
    )
    print(head, flush=True)
    report = Report(sizes)
    scratch = Scratch(args.tmp)
    started = time.perf_counter()
    try:
        with asyncio.Runner() as runner:
            bench_append(sizes, scratch, report)
            bench_index(sizes, scratch, report)
            big = build_big_archive(sizes, scratch, runner)
            try:
                report_fill(big, report)
                bench_context(sizes, scratch, runner, big, report)
                bench_search(sizes, big, report)
            finally:
                big.engine.close()
                scratch.drop(big.path)
            bench_compaction(sizes, scratch, runner, report)
    finally:
        scratch.close()
    elapsed = time.perf_counter() - started
    try:
        load = "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    except OSError:
        load = "n/a"
    summary = (
        "## Summary\n\n"
        + report.summary()
        + f"\n\nTotal run time {elapsed:.0f} s; load average at the end {load}.\n"
    )
    print(summary)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(head + "\n" + summary + "\n" + "\n".join(report.parts), encoding="utf-8")
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
