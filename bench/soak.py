"""Reliability runs at any length: kill -9 under load, the soak, clients that stop reading.

    python -m bench.soak --seconds 600          # the soak, for 10 minutes
    python -m bench.soak --kills 200            # the crash test with 200 kills
    python -m bench.soak --stuck                # the stuck-client checks
    python -m bench.soak --report               # all of them (suite sizes unless given)
                                                # and rewrite their rows of the table
                                                # in docs/reliability.md

The checks are the ones of tests/test_crash.py and tests/test_soak.py (the harnesses in
the tests.harness package; run from the repository root), run here with
other sizes; each prints its figures as JSON. The exit status is 1 when a check found a
problem (the known problems listed in docs/reliability.md excepted: they are reported,
not counted).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import apsw

from tests.harness import crash as crash_harness
from tests.harness import found
from tests.harness import soak as soak_harness
from tests.harness import stuck as stuck_harness

ROOT = Path(__file__).resolve().parents[1]

DOC = ROOT / "docs" / "reliability.md"
SUITE_KILLS = 32
SUITE_SECONDS = 45.0
# rows of the table this script owns (by their first cell); other rows are left alone
OWN_PREFIXES = ("crash", "soak", "stuck", "context", "client")
NOTE_BEGIN = "<!-- soak.py: begin -->"
NOTE_END = "<!-- soak.py: end -->"

Row = dict[str, str]


def _mib(kib: int) -> str:
    return f"{kib / 1024:.0f} MiB"


def _n(x: float) -> str:
    return f"{x:,.0f}"


def _problems(failures: list[str]) -> str:
    if not failures:
        return "0 problems"
    return f"**{len(failures)} problems**, first: {failures[0][:160]}"


def crash(tmp: Path, kills: int, seed: int) -> tuple[Row, bool]:
    stats, failures = crash_harness.run_crash(tmp / "crash", seed, kills, log=lambda s: None)
    print(json.dumps({"crash": dict(stats), "problems": failures[:20]}, indent=1), flush=True)
    resent = stats["resent_found_in_image"] + stats["resent_absent_from_image"]
    unacked = sum(v for k, v in stats.items() if k.startswith("unacked "))
    row = {
        "check": "crash: kill -9 under load",
        "tried": (
            "6 clients on zmq, JSON-RPC and WebSocket (3 agents with runs, tool calls, "
            "approvals and forced compactions; 3 writers sharing a session) and a large "
            "session compacted on demand; the daemon killed at a random moment "
            f"({stats['kills random']}), right after `context/compact` was sent "
            f"({stats['kills compact-send']}) or on a `$/progress` begin "
            f"({stats['kills progress-begin']}); after each kill the file is read "
            "read-only, after each restart the API, then lost requests are re-sent"
        ),
        "count": (
            f"{stats['kills']} kills in {stats['seconds']:.0f} s; "
            f"{_n(stats['acked_batches'])} batches / {_n(stats['acked_messages'])} "
            f"messages acknowledged; {stats['approvals_requested']} approvals; "
            f"{stats['compactions_committed_before_kill']} compactions committed, "
            f"{stats['compactions_cut_short']} cut short by a kill "
            f"({stats['kills_mid_compaction']} kills mid-compaction)"
        ),
        "observed": (
            f"{_problems(failures)}: every acknowledged message stored once, in client "
            "order; no half batch; contexts valid (counts and tokens recounted, tail, "
            "tool pairs, summary pointers, version = committed compactions); pending "
            f"approvals still pending. {resent} unacknowledged batches re-sent: "
            f"{stats['resent_found_in_image']} returned the stored ids, "
            f"{stats['resent_absent_from_image']} were appended once; "
            f"{unacked} other requests lost and settled"
        ),
        "command": f"`python -m bench.soak --kills {kills} --seed {seed}`",
    }
    return row, not failures


def soak(tmp: Path, seconds: float, seed: int) -> tuple[Row, bool]:
    stats, failures = soak_harness.run_soak(tmp / "soak", seconds, seed, log=lambda s: None)
    print(json.dumps({"soak": stats, "problems": failures[:20]}, indent=1), flush=True)
    rss = stats["rss_kib"]
    growth = rss["second_half_peak"] - rss["first_half_peak"]
    allowed = max(
        soak_harness.SOAK_RSS_FLOOR_KIB,
        soak_harness.SOAK_RSS_TREND * (rss["first_half_peak"] - rss["start"]),
    )
    ok = not failures and rss["vm_hwm"] < soak_harness.SOAK_RSS_LIMIT_KIB and growth <= allowed
    trips = stats["round_trips"]
    events = stats["events"]["zmq"]
    row = {
        "check": "soak: every wire, shared and own sessions",
        "tried": (
            f"{stats['writers']} writers (4 sharing a session over zmq, JSON-RPC, "
            "WebSocket; 5 with a session each running agent turns that auto-compact), "
            "a client searching, polling status, checking contexts and forcing "
            f"compactions, {stats['subscribers']} subscribers (one per wire) on every "
            "session, a round-trip probe"
        ),
        "count": (
            f"{seconds:.0f} s; {_n(stats['acked_batches'])} batches / "
            f"{_n(stats['acked_messages'])} messages; {_n(sum(events.values()))} events "
            f"per subscriber; {stats['auto_compactions_scheduled']} auto-compactions "
            f"scheduled; {stats['ops'].get('searches', 0)} searches"
        ),
        "observed": (
            f"{_problems(failures)}: no lost or duplicated message, client order kept, "
            "every subscriber got every `session/didAppend` (ids compared with the "
            f"archive). Peak RSS (VmHWM) {_mib(rss['vm_hwm'])}; peak "
            f"{_mib(rss['first_half_peak'])} in the first half, "
            f"{_mib(rss['second_half_peak'])} in the second. Round trip median "
            f"{trips['median_ms']} ms, max {trips['max_ms']} ms"
        ),
        "command": f"`python -m bench.soak --seconds {seconds:g} --seed {seed}`",
    }
    return row, ok


def stuck(tmp: Path) -> tuple[list[Row], bool]:
    rows: list[Row] = []
    ok = True
    mib = stuck_harness.STUCK_EVENT_MIB
    limit = stuck_harness.STUCK_RSS_GROWTH_KIB
    stats, failures = stuck_harness.stuck_run(tmp / "tcp", "tcp", 5, 1500, mib)
    print(json.dumps({"stuck tcp": stats, "problems": failures}, indent=1), flush=True)
    ok &= (
        not failures
        and stats["stuck_end"] == "notice"
        and stats["stuck_events_read"] + stats["stuck_missed"] == stats["events_published"]
        and stats["rss_big_growth_kib"] < limit
        and stats["daemon_log_drops"] == 0
    )
    trips = stats["round_trips"]
    rows.append(
        {
            "check": "stuck: JSON-RPC TCP subscriber stops reading",
            "tried": (
                "a raw TCP client authenticates, subscribes to a busy session and reads "
                "nothing until the load is over; a separate process floods the session "
                "with small appends, then asks for and resolves approvals with long "
                "Chinese arguments and reasons (the largest events); a WebSocket client "
                "in another process measures round trips"
            ),
            "count": (
                f"{_n(stats['small_appends'])} messages appended, "
                f"{_n(stats['approval_rounds'])} approvals, "
                f"{stats['approval_event_bytes'] / 2**20:.0f} MiB of approval events, "
                f"{_n(stats['events_published'])} events, {stats['seconds']:.0f} s"
            ),
            "observed": (
                f"{_problems(failures)}: the stuck client kept its connection; past 6 MiB "
                "of unread output its events were dropped, and reading again it got "
                f"{_n(stats['stuck_events_read'])} events "
                f"({stats['stuck_bytes_read'] / 2**20:.1f} MiB), then "
                f"`session/didMissEvents` with missed {_n(stats['stuck_missed'])} (the two "
                "add up to what was published); daemon RSS grew "
                f"{_mib(stats['rss_big_growth_kib'])} while the approval events went out; "
                f"round trips median {trips['median_ms']} ms, max {trips['max_ms']} ms; a "
                "healthy subscriber got every event"
            ),
            "command": "`pytest tests/test_soak.py -k stuck_tcp`",
        }
    )
    stats, failures = stuck_harness.stuck_run(
        tmp / "zmq", "zmq", 2, stuck_harness.stuck_zmq_events(), mib, big_first=True
    )
    print(json.dumps({"stuck zmq": stats, "problems": failures}, indent=1), flush=True)
    ok &= (
        not failures
        and stats["stuck_events_read"] < stats["events_published"]
        and stats["rss_big_growth_kib"] < limit
        and stats["rss_flood_growth_kib"] < limit
    )
    trips = stats["round_trips"]
    rows.append(
        {
            "check": "stuck: ZeroMQ SUB stops reading",
            "tried": (
                "a SUB socket subscribes to a busy session, reads its subscription probe "
                "and nothing more; approvals with long Chinese arguments and reasons fill "
                "its queue first, then a flood of small appends goes past the PUB "
                f"high-water mark ({stuck_harness.pub_hwm():,} messages)"
            ),
            "count": (
                f"{_n(stats['approval_rounds'])} approvals "
                f"({stats['approval_event_bytes'] / 2**20:.0f} MiB of events), "
                f"{_n(stats['small_appends'])} messages, {_n(stats['events_published'])} "
                f"events, {stats['seconds']:.0f} s"
            ),
            "observed": (
                f"{_problems(failures)}: the publisher dropped for the stuck SUB (it held "
                f"{_n(stats['stuck_events_read'])} of {_n(stats['events_published'])} "
                f"events); daemon RSS grew {_mib(stats['rss_big_growth_kib'])} while the "
                "large events went out; round trips median "
                f"{trips['median_ms']} ms, max {trips['max_ms']} ms; a healthy SUB got "
                "every event"
            ),
            "command": "`pytest tests/test_soak.py -k stuck_zmq`",
        }
    )
    return rows, ok


def regressions(tmp: Path) -> tuple[list[Row], bool]:
    """Problems the checks above once found, each with the test that keeps it fixed."""
    rows = []
    ok = True
    checks: list[tuple[str, str, str, Callable[[Path], None]]] = [
        (
            "context: late tool result in a shared session",
            "one client appends a tool call; another appends 30 turns (assistant only, then "
            "with user messages) and forces a compaction; then the result arrives",
            "`pytest tests/test_crash.py -k late_tool_result`",
            lambda p: [
                found.late_tool_result_keeps_its_call(p / m, m)
                for m in ("assistant", "user")
            ],
        ),
        (
            "client: close while a ZeroMQ call waits",
            "the daemon is killed while a ZeroMQ call waits to send; another thread closes "
            "the client",
            "`pytest tests/test_crash.py -k closing_a_client`",
            found.closing_a_client_fails_its_calls,
        ),
    ]
    for i, (name, tried, command, check) in enumerate(checks):
        try:
            check(tmp / f"regression{i}")
            if name.startswith("context"):
                observed = (
                    "passes: the call stays in context until the user speaks; a "
                    "result after that is refused; the context stays valid"
                )
            else:
                observed = "passes: the waiting call ends with ConnectionError"
        except AssertionError as exc:
            ok = False
            observed = "**fails again**: " + " ".join(str(exc).split())[:200]
        rows.append(
            {
                "check": name,
                "tried": tried,
                "count": "1 run each",
                "observed": observed,
                "command": command,
            }
        )
        print(json.dumps({name: observed}), flush=True)
    return rows, ok


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def rewrite_table(doc: Path, rows: list[Row], note: str) -> None:
    """Replace this script's rows of the table and the note between the markers.

    Its rows (first cell starting with one of `OWN_PREFIXES`) go where its first row
    was, as one block in the order they were run; every other row and line stays.
    """
    lines = doc.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| Check |"))
    end = start + 2
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    keys = ("check", "tried", "count", "observed", "command")
    new_rows = ["| " + " | ".join(_cell(r[k]) for k in keys) + " |" for r in rows]
    kept: list[str] = []
    placed = False
    for line in lines[start + 2 : end]:
        first = line.strip("|").split("|")[0].strip()
        if not first.startswith(OWN_PREFIXES):
            kept.append(line)
        elif not placed:
            kept += new_rows
            placed = True
    if not placed:
        kept += new_rows
    out = "\n".join(lines[: start + 2] + kept + lines[end:]) + "\n"
    out = re.sub(
        re.escape(NOTE_BEGIN) + r".*?" + re.escape(NOTE_END),
        f"{NOTE_BEGIN}\n{note}\n{NOTE_END}",
        out,
        flags=re.S,
    )
    doc.write_text(out)


def environment() -> str:
    load = os.getloadavg()[0]
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    return (
        f"Last measured {now} by `python -m bench.soak --report` on {os.cpu_count()} "
        f"cores, Python {platform.python_version()}, SQLite {apsw.sqlitelibversion()}"
        f" (load average {load:.1f} at the end: the machine is shared)."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--seconds", type=float, help="run the soak for this long")
    parser.add_argument("--kills", type=int, help="run the crash test with this many kills")
    parser.add_argument("--stuck", action="store_true", help="run the stuck-client checks")
    parser.add_argument(
        "--report",
        action="store_true",
        help="run every check and rewrite its rows in docs/reliability.md",
    )
    parser.add_argument("--seed", type=int, help="seed of the random choices")
    parser.add_argument("--tmp", help="directory for the scratch data (default: system temp)")
    args = parser.parse_args(argv)
    if not (args.seconds or args.kills or args.stuck or args.report):
        parser.error("say what to run: --seconds, --kills, --stuck or --report")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    rows: list[Row] = []
    ok = True
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=args.tmp, prefix="ctxd-soak-") as tmp:
        root = Path(tmp)
        if args.kills or args.report:
            row, good = crash(root, args.kills or SUITE_KILLS, seed)
            rows.append(row)
            ok &= good
        if args.seconds or args.report:
            row, good = soak(root, args.seconds or SUITE_SECONDS, seed)
            rows.append(row)
            ok &= good
        if args.stuck or args.report:
            stuck_rows, good = stuck(root)
            rows += stuck_rows
            ok &= good
        if args.report:
            regression_rows, good = regressions(root)
            rows += regression_rows
            ok &= good
    if args.report:
        rewrite_table(DOC, rows, environment())
        print(f"rewrote {len(rows)} rows of {DOC.relative_to(ROOT)}", file=sys.stderr)
    print(
        f"{'all checks passed' if ok else 'PROBLEMS FOUND'} in "
        f"{time.monotonic() - started:.0f} s (seed {seed})",
        file=sys.stderr,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
