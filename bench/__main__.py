"""Every benchmark in one command.

    python -m bench            # small sizes: the core engine, then ctxd and its peers
    python -m bench --full     # full sizes
    python -m bench --only peers

Results go to bench/results/ (markdown and PNG plots); see docs/performance.md.
"""

from __future__ import annotations

import argparse
import sys
import time

from bench import bench_core, bench_import, bench_mcp, bench_peers, bench_turn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="full sizes instead of small ones")
    parser.add_argument("--tmp", help="directory for the scratch files (default: /tmp)")
    parser.add_argument(
        "--only",
        choices=("core", "peers", "import", "mcp", "turn"),
        help="run one benchmark: core (engine in-process), peers (ctxd beside its peers), "
        "import (ctxd import of a transcript folder), mcp (ctxd mcp with the MCP SDK) or "
        "turn (one request and one agent turn against their floors)",
    )
    args = parser.parse_args(argv)
    common = (["--full"] if args.full else []) + (["--tmp", args.tmp] if args.tmp else [])
    started = time.perf_counter()
    status = 0
    if args.only in (None, "core"):
        status |= bench_core.main(common)
    if args.only in (None, "peers"):
        status |= bench_peers.main(common)
    if args.only in (None, "import"):
        size = ["--size-mb", "100"] if args.full else [
            "--size-mb", "20", "--out", "bench/results/import_small.md"]
        status |= bench_import.main(size + (["--tmp", args.tmp] if args.tmp else []))
    if args.only in (None, "mcp"):
        status |= bench_mcp.main(["--tmp", args.tmp] if args.tmp else [])
    if args.only in (None, "turn"):
        status |= bench_turn.main([] if args.full else ["--turns", "200", "--requests", "1000",
                                                         "--out", "/dev/null"])
    print(f"all benchmarks done in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
