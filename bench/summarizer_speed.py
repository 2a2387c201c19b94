"""CPU cost of the built-in summarizer per compaction, and a fingerprint of what it wrote.

The inputs are fixed: a history from bench/workload.py's generator and the public
transcripts under bench/data/ (read with ctxd's importer, as bench/retention_real.py
does). Each is replayed into an Engine on a temporary SQLite file, turn by turn, with
automatic compaction on, so the summarizer is asked exactly what the engine asks it:
incremental requests, each one's `previous` the summary the compaction before
committed. Every request is recorded (a copy, before the summarizer sees it).

Then the built-in summarizer alone runs over the recorded requests a few times, in
order, with a fresh token counter each repeat (the daemon's counter keeps a small cache
across compactions, and so does this one within a repeat). Printed: CPU ms per
compaction and per 1,000 input messages (the median of the repeats), and a SHA-256 of
every summary (its stored form without the compaction ids, which are random, plus its
rendered text). `--save FILE` writes the fingerprints, `--compare FILE` checks them
against a file saved before (on another revision) and lists the summaries that differ.

    python bench/summarizer_speed.py --save /tmp/before.json
    python bench/summarizer_speed.py --compare /tmp/before.json
    python bench/summarizer_speed.py --quick       # the workload and two transcripts

`ctxd` is imported from whatever environment runs the script, as in retention_real.py.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import hashlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ctxd.daemon.config import CompactionPolicy, Config
from ctxd.daemon.engine import Engine
from ctxd.daemon.scheduler import AutoCompactor
from ctxd.daemon.summarizers.builtin import BuiltinSummarizer
from ctxd.daemon.summary import Summary, SummaryRequest
from ctxd.daemon.tokens import TokenCounter

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.retention_real import QUICK, turns_of  # noqa: E402
from bench.retention_real_extract import load  # noqa: E402
from bench.workload import generate_session  # noqa: E402

HERE = Path(__file__).resolve().parent
DATA = (HERE / "data" / "transcripts", HERE / "data" / "heldout")
WORKLOAD_MESSAGES = 6000
# the engine's default policy, and the small one retention_real.py uses so that short
# transcripts compact several times
POLICIES = {
    "default": CompactionPolicy(),
    "small": replace(CompactionPolicy(), max_active_messages=40, keep_messages=12),
}


class RecordingSummarizer:
    """The built-in summarizer, keeping a copy of every request the engine makes."""

    name = BuiltinSummarizer.name
    drifts = BuiltinSummarizer.drifts
    chunk_messages = BuiltinSummarizer.chunk_messages
    honours_size_limit = BuiltinSummarizer.honours_size_limit

    def __init__(self) -> None:
        self.inner = BuiltinSummarizer()
        self.requests: list[SummaryRequest] = []

    async def summarize(self, request: SummaryRequest) -> Summary:
        return self.summarize_sync(request)

    def summarize_sync(self, request: SummaryRequest) -> Summary:
        # the engine mutates the summary it commits, which is the next request's previous
        self.requests.append(replace(
            request,
            previous=copy.deepcopy(request.previous),
            messages=copy.deepcopy(request.messages),
            pins=list(request.pins),
            ordinals=dict(request.ordinals),
            verbatim=list(request.verbatim),
        ))
        return self.inner.summarize_sync(request)


@dataclass
class Input:
    name: str
    requests: list[SummaryRequest] = field(default_factory=list)

    @property
    def messages(self) -> int:
        return sum(len(r.messages) for r in self.requests)


async def record(name: str, msgs: list[dict[str, Any]], policy: CompactionPolicy,
                 root: Path) -> Input:
    """Replays `msgs` as retention_real.py does: a run per user message, the agent's
    steps appended in it, automatic compaction when the run finishes."""
    recorder = RecordingSummarizer()
    engine = Engine(Config(data_dir=root, compaction=policy), summarizer=recorder)
    auto = AutoCompactor(engine)
    try:
        sid = engine.create_session(title=name).session_id
        for turn in turns_of(msgs):
            run = engine.start_run(sid)
            for step in turn:
                engine.append(sid, [msgs[i] for i in step], run_id=run.run_id)
            if engine.finish_run(run.run_id, "completed").auto_compaction_scheduled:
                auto.maybe_schedule(sid, due=True)
                await asyncio.gather(*auto.running())
    finally:
        engine.close()
    return Input(name, recorder.requests)


def fingerprint(summary: Summary) -> str:
    stored = summary.to_dict()
    stored.pop("compactionIds", None)  # fresh ids every replay
    text = json.dumps(stored, sort_keys=True, ensure_ascii=False) + "\n" + summary.render()
    return hashlib.sha256(text.encode()).hexdigest()


def run_once(inp: Input) -> tuple[list[float], list[str]]:
    """CPU ms of each request, and the fingerprint of each summary."""
    summarizer = BuiltinSummarizer()
    counter = TokenCounter()
    ms: list[float] = []
    prints: list[str] = []
    for request in inp.requests:
        req = replace(request, count_tokens=counter.count_text)
        started = time.thread_time()
        summary = summarizer.summarize_sync(req)
        ms.append((time.thread_time() - started) * 1000)
        prints.append(fingerprint(summary))
    return ms, prints


async def inputs(quick: bool, workload: int, say: Any) -> list[Input]:
    root = Path(tempfile.mkdtemp(prefix="ctxd-summarizer-speed-"))
    out: list[Input] = []
    try:
        out.append(await record(f"workload ({workload} messages)",
                                list(generate_session(workload, seed=7)),
                                POLICIES["default"], root / "workload"))
        say(f"{out[-1].name}: {len(out[-1].requests)} compactions")
        paths = [p for d in DATA for p in sorted(d.glob("*/*.jsonl"))]
        if quick:
            paths = [p for p in paths if f"{p.parent.name}/{p.stem}" in QUICK]
        for n, path in enumerate(paths):
            t = load(path, root / f"import-{n}")
            if len(t.messages) < 4:
                continue
            for pname, policy in POLICIES.items():
                inp = await record(f"{path.parent.parent.name}/{t.name} [{pname}]",
                                   t.messages, policy, root / f"replay-{n}-{pname}")
                if inp.requests:
                    out.append(inp)
                    say(f"{inp.name}: {len(inp.requests)} compactions")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the workload and two transcripts")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--workload", type=int, default=WORKLOAD_MESSAGES,
                    help="messages of the generated history")
    ap.add_argument("--save", type=Path, help="write the fingerprints to this JSON file")
    ap.add_argument("--compare", type=Path, help="check the fingerprints against this file")
    ap.add_argument("--table", type=Path, help="also write the table (markdown) here")
    args = ap.parse_args()

    recorded = asyncio.run(inputs(args.quick, args.workload, lambda s: print(s, flush=True)))
    rows: list[tuple[str, int, int, float]] = []
    prints: dict[str, list[str]] = {}
    for inp in recorded:
        totals: list[float] = []
        for _ in range(max(1, args.repeats)):
            ms, fp = run_once(inp)
            totals.append(sum(ms))
            prints[inp.name] = fp
        rows.append((inp.name, len(inp.requests), inp.messages, statistics.median(totals)))

    lines = ["| input | compactions | messages | CPU ms / compaction | CPU ms / 1k messages |",
             "|---|---:|---:|---:|---:|"]
    for name, n, m, total in rows:
        lines.append(f"| {name} | {n} | {m} | {total / n:.2f} | {total * 1000 / m:.1f} |")
    for label, chosen in (("transcripts (all)", [r for r in rows if "workload" not in r[0]]),
                          ("all", rows)):
        n = sum(r[1] for r in chosen)
        m = sum(r[2] for r in chosen)
        total = sum(r[3] for r in chosen)
        if n and m:
            lines.append(f"| **{label}** | {n} | {m} | {total / n:.2f} | "
                         f"{total * 1000 / m:.1f} |")
    table = "\n".join(lines)
    print("\n" + table + "\n")
    for name, fps in prints.items():
        print(f"{name}:")
        for i, fp in enumerate(fps):
            print(f"  {i:3d} {fp}")
    if args.table is not None:
        args.table.write_text(table + "\n")
    if args.save is not None:
        args.save.write_text(json.dumps(prints, indent=1) + "\n")
        print(f"fingerprints written to {args.save}")
    if args.compare is not None:
        before: dict[str, list[str]] = json.loads(args.compare.read_text())
        differ = 0
        for name in sorted(before.keys() | prints.keys()):
            old, new = before.get(name), prints.get(name)
            if old is None or new is None:
                print(f"DIFFERENT {name}: only in {'this run' if old is None else 'the file'}")
                differ += 1
            elif old != new:
                bad = [i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b]
                print(f"DIFFERENT {name}: {len(old)} vs {len(new)} summaries, "
                      f"first differing: {bad[:5]}")
                differ += 1
        print("summaries identical" if not differ else f"{differ} input(s) differ")
        if differ:
            sys.exit(1)


if __name__ == "__main__":
    main()
