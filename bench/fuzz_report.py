"""Robustness report: the fuzz, security and disk-error tests with larger example counts.

    python -m bench.fuzz_report                 # every example count x10
    python -m bench.fuzz_report --scale 3 --only wires

Runs tests/test_fuzz_wires.py, test_fuzz_engine.py, test_security.py and
test_disk_errors.py in this process with `CTXD_FUZZ_SCALE` (the multiplier of every
property's example count) and collects what each test counted (`CTXD_FUZZ_STATS`), then
prints one markdown row per test: what was tried, how many cases, what was observed,
and the command that reproduces it. Tests marked xfail are known bugs: their row says so.
The exit status is 1 when a test failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FILES = {
    "wires": "tests/test_fuzz_wires.py",
    "engine": "tests/test_fuzz_engine.py",
    "security": "tests/test_security.py",
    "disk": "tests/test_disk_errors.py",
}

AFTER_EVERY_WIRE_CASE = (
    "after every case the daemon was alive, a separate client got correct answers and the "
    "archive rows were unchanged"
)

# what each test tries, by test function name
TRIED: dict[str, str] = {
    # wires
    "test_tcp_requests_of_every_wrong_shape_get_their_code":
        "JSON-RPC over TCP: requests and batches of every wrong shape (unknown methods, "
        "params as arrays or scalars, wrong types, unknown and out-of-range params, "
        "missing or non-string method, ids of odd JSON types, notifications), with and "
        "without `initialize`",
    "test_tcp_broken_headers_get_an_error_then_close":
        "JSON-RPC over TCP: broken Content-Length headers (no colon, not a number, "
        "negative, missing, above max_request_bytes up to 10^30, no end within 8 KiB)",
    "test_tcp_truncated_append_writes_nothing":
        "JSON-RPC over TCP: a valid `messages/append` cut at a random byte, or declaring "
        "more bytes than it sends, then half-close",
    "test_tcp_frames_split_anywhere_are_reassembled":
        "JSON-RPC over TCP: one request split into up to 8 writes at random offsets",
    "test_tcp_invalid_json_gets_parse_errors_and_the_connection_lives":
        "JSON-RPC over TCP: 1-4 well-framed bodies of invalid JSON (random bytes and text, "
        "mutated and cut requests), then a valid request on the same connection",
    "test_ws_requests_of_every_wrong_shape_get_their_code":
        "WebSocket: the same generated requests and batches as on TCP",
    "test_ws_garbage_text_and_binary_frames_get_parse_errors":
        "WebSocket: 1-4 text and binary frames of random text or bytes, then a valid request",
    "test_ws_port_garbage_bytes_are_dropped":
        "WebSocket port: random bytes instead of an HTTP handshake",
    "test_ws_port_malformed_handshakes_get_http_errors":
        "WebSocket port: complete HTTP requests with random method, path and header lines "
        "(some from a real handshake, never a valid key)",
    "test_refused_handshakes_cost_a_bounded_log":
        "WebSocket port: 20 refused handshakes, measuring the daemon's log growth",
    "test_ws_frame_above_the_limit_closes_only_that_connection":
        "WebSocket: one frame above max_request_bytes beside another connected client",
    "test_zmq_frames_that_are_not_msgpack_requests_get_typed_errors":
        "ZeroMQ: one frame of random bytes or truncated msgpack",
    "test_zmq_requests_of_every_wrong_shape_get_their_code":
        "ZeroMQ: msgpack of every wrong shape (not a map, missing, empty or non-string "
        "method, params not a map, missing or wrong token of any type, unknown methods, "
        "array params, wrong types, unknown and out-of-range params, ids of any msgpack type)",
    "test_zmq_missing_and_extra_frames":
        "ZeroMQ: 1-5 frames per message mixing empty delimiters, garbage and a valid request",
    "test_zmq_huge_frames":
        "ZeroMQ: a frame just above max_request_bytes and one above the socket's size cap",
    "test_deeply_nested_json_gets_a_parse_error_and_keeps_the_connection":
        "JSON-RPC over TCP and WebSocket: 100 000 nested arrays",
    "test_deeply_nested_msgpack_gets_a_parse_error": "ZeroMQ: 100 000 nested msgpack arrays",
    "test_lone_surrogates_get_typed_errors":
        "JSON-RPC over TCP: lone surrogates (`\\ud800` escapes) in content, session id, "
        "search query and token",
    "test_deeply_nested_metadata_over_zmq_is_an_invalid_message":
        "ZeroMQ: an append whose metadata is nested 1000 deep",
    "test_values_stored_over_zmq_read_back_as_strict_json":
        "ZeroMQ: an append with NaN and Infinity in metadata, read back over JSON-RPC",
    "test_session_metadata_stored_over_zmq_reads_back_as_strict_json":
        "ZeroMQ: session/create with NaN and -Infinity in metadata, then session/get over "
        "JSON-RPC read with a strict JSON parser",
    "test_non_json_number_tokens_get_a_parse_error":
        "JSON-RPC over TCP: requests with the non-JSON tokens NaN and -Infinity (id, params)",
    "test_daemon_survived_and_archive_is_intact":
        "After all the wire fuzzing: the daemon process, the canary session, a clean stop",
    # engine
    "test_plain_search_never_raises":
        "Engine search, plain mode: random Unicode mixed with FTS5 syntax (quotes, *, ^, "
        ":, NEAR, AND/OR/NOT, column filters, NUL, zero-width characters), random limit, "
        "offset, order and scope",
    "test_advanced_search_fails_only_with_invalid_params":
        "Engine search, advanced mode: the same random text",
    "test_advanced_search_runs_every_well_formed_query":
        "Engine search, advanced mode: generated well-formed FTS5 queries (terms, "
        "prefixes, phrases, NEAR, nested AND/OR/NOT)",
    "test_plain_search_of_syntax_matches_the_words_literally":
        "Engine search: a plain query equal to a stored text full of operators",
    "test_search_text_with_lone_surrogates_gets_a_typed_answer":
        "Engine search with lone surrogates in the text, plain and advanced",
    "test_append_stores_a_batch_whole_or_refuses_it_whole":
        "Engine append: batches of 1-9 messages mixing valid ones (text, parts, tool calls "
        "and results with colliding ids) and 20 kinds of invalid ones (roles, content "
        "types, tool call shapes, odd metadata, unencodable values, lone surrogates, deep "
        "nesting, oversized), into fresh, shared and approval-pending sessions",
    "test_one_invalid_message_refuses_the_batch_and_names_it":
        "Engine append: valid messages followed by one invalid message",
    "test_metadata_of_odd_json_values_round_trips":
        "Engine append: metadata with null, booleans, big integers, tiny floats, Unicode, "
        "nested containers; NaN and +/-Infinity",
    # security
    "test_every_method_is_refused_before_initialize":
        "Every method, `shutdown` included, with valid params before `initialize` "
        "(TCP, WebSocket)",
    "test_wrong_tokens_are_refused":
        "`initialize` with wrong string tokens (near misses included) and non-string "
        "tokens (TCP, WebSocket)",
    "test_a_lone_surrogate_token_is_refused": "`initialize` with a lone-surrogate token",
    "test_zmq_needs_the_token_in_every_request":
        "ZeroMQ: every method without a token and with 8 wrong tokens (prefix, suffix, "
        "bytes, list, map, integer); a good request does not authenticate the socket",
    "test_connection_file_and_runtime_dir_are_private":
        "Modes of the connection file and runtime dir, token length",
    "test_ipc_sockets_live_in_the_private_runtime_dir":
        "Place of the ZeroMQ ipc sockets (default transport)",
    "test_the_archive_is_not_readable_by_other_users":
        "Modes of the data dir and the database files",
    "test_every_tcp_endpoint_listens_on_127_0_0_1_only":
        "Bound address of all four TCP endpoints (ZeroMQ on TCP): connection file, "
        "/proc/net/tcp{,6}, connects via 127.0.0.2 and ::1",
    "test_other_local_addresses_do_not_reach_the_daemon":
        "Connects to every endpoint via this machine's non-loopback addresses",
    "test_foreign_origins_are_refused_at_the_handshake":
        "WebSocket handshakes with foreign Origins (other host, `null`, other port, https, "
        "look-alike host, file://), the daemon's own Origins (then session/list, an empty "
        "token, a made-up page key, a forged login first) and none",
    "test_plain_http_requests_get_nothing":
        "Plain HTTP GET, OPTIONS (CORS preflight) and POST to the WebSocket and JSON-RPC "
        "TCP ports",
    "test_plain_search_text_is_never_fts5_syntax":
        "archive/search plain vs advanced: OR, NOT, column filter, prefix, NEAR, and "
        "syntax fragments",
    "test_no_sql_is_built_from_user_text":
        "Session id, title, metadata, content, name, clientBatchId, pin and cursor set to "
        "`x'; DROP TABLE messages; --`",
    "test_a_request_above_max_request_bytes":
        "An append above max_request_bytes on TCP, WebSocket and ZeroMQ",
    "test_batches_and_messages_above_the_limits_write_nothing":
        "Batches above max_batch_messages and above 10 000, a message above "
        "max_message_bytes alone and inside a batch (each wire)",
    "test_too_many_connections_are_refused_and_the_others_keep_working":
        "max_connections = 4: a fifth TCP and a fifth WebSocket connection",
    "test_idle_connections_without_the_token_cannot_lock_clients_out":
        "max_connections = 4 TCP sockets that never send a byte, then a client with the token",
    # disk
    "test_disk_full_append_is_all_or_nothing_and_recovers":
        "Engine: max_page_count = size + 4 pages, appends until one fails, 5 more, then "
        "the cap lifted",
    "test_what_survived_a_full_disk_reopens_intact": "Engine reopened after a full disk",
    "test_disk_full_gives_a_typed_error":
        "Engine: the error type of an append on a full disk, then of a pin, a session and "
        "a run",
    "test_disk_full_during_compaction_leaves_the_context_as_it_was":
        "Engine: compaction of 600 messages with no free page",
    "test_read_only_database_refuses_appends_and_recovers":
        "Engine: append with `PRAGMA query_only`, then writable again",
    "test_read_only_database_gives_a_typed_error":
        "Engine: the error type of an append, a pin, a session and a run on a read-only "
        "database",
    "test_a_read_only_data_dir_is_refused_at_open":
        "Engine on a chmod 0444/0555 data dir (not as root)",
    "test_daemon_on_a_full_disk_answers_errors_serves_reads_and_recovers":
        "Daemon: RLIMIT_FSIZE lowered on the running process, 20 KiB appends until one "
        "fails, reads over another wire meanwhile, the limit restored, an append, then the "
        "stopped daemon's database checked",
}


@dataclass
class Result:
    nodeids: list[str] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)  # passed, failed, xfailed, ...
    reasons: list[str] = field(default_factory=list)
    seconds: float = 0.0


class Collector:
    """A pytest plugin that keeps the outcome of every test, grouped by function."""

    def __init__(self) -> None:
        self.results: dict[tuple[str, str], Result] = {}

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.when != "call" and not (report.when == "setup" and not report.passed):
            return
        path, _, name = report.nodeid.partition("::")
        key = (path, name.split("[", 1)[0])
        res = self.results.setdefault(key, Result())
        res.nodeids.append(report.nodeid)
        res.seconds += report.duration
        if hasattr(report, "wasxfail"):
            res.outcomes["xfailed" if report.skipped else "xpassed"] += 1
            reason = str(report.wasxfail).removeprefix("reason: ")
            if reason and reason not in res.reasons:
                res.reasons.append(reason)
        else:
            res.outcomes[report.outcome] += 1
            if report.skipped and isinstance(report.longrepr, tuple):
                res.reasons.append(str(report.longrepr[2]).removeprefix("Skipped: "))


def run(paths: list[str], scale: float, extra: list[str]) -> tuple[Collector, list[dict]]:
    import pytest

    with tempfile.TemporaryDirectory(prefix="ctxd-fuzz-") as tmp:
        stats = Path(tmp) / "stats.jsonl"
        os.environ["CTXD_FUZZ_SCALE"] = f"{scale:g}"
        os.environ["CTXD_FUZZ_STATS"] = str(stats)
        collector = Collector()
        os.chdir(ROOT)
        # pytest's own output goes to stderr: stdout carries only the table
        with contextlib.redirect_stdout(sys.stderr):
            pytest.main([*paths, "-q", "-p", "no:cacheprovider", "--rootdir", str(ROOT),
                         *extra], plugins=[collector])
        lines = stats.read_text().splitlines() if stats.exists() else []
    return collector, [json.loads(line) for line in lines]


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def short_reason(reason: str) -> str:
    """The first clause of an xfail reason: it names the bug."""
    return re.split(r":\s", reason, maxsplit=1)[0]


def rows(collector: Collector, stats: list[dict], scale: float) -> list[str]:
    counted: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for s in stats:
        path, _, name = s["test"].partition("::")
        counted[(path, name.split("[", 1)[0])][s["outcome"]] += s["n"]
    out = []
    for (path, name), res in collector.results.items():
        notes = counted.get((path, name), Counter())
        cases = sum(notes.values()) or len(res.nodeids)
        seen = "; ".join(f"{o} x{n}" for o, n in notes.most_common())
        if res.outcomes["failed"] or res.outcomes["xpassed"]:
            observed = "FAILED" + (f" ({seen})" if seen else "")
        elif res.outcomes["xfailed"]:
            bugs = "; ".join(short_reason(r) for r in res.reasons)
            observed = f"known bug (test marked xfail): {bugs}" + (f"; seen: {seen}" if seen
                                                                   else "")
        elif res.outcomes["skipped"] and not res.outcomes["passed"]:
            observed = "skipped: " + "; ".join(res.reasons)
        else:
            observed = seen or "as expected"
            if path.endswith("test_fuzz_wires.py") and cases > 1:
                observed += f"; {AFTER_EVERY_WIRE_CASE}"
        env = f"CTXD_FUZZ_SCALE={scale:g} " if path in (FILES["wires"], FILES["engine"]) else ""
        command = f"`{env}python -m pytest '{path}::{name}' -q`"
        tried = TRIED.get(name, name.removeprefix("test_").replace("_", " "))
        out.append(f"| {cell(tried)} | {cases} | {cell(observed)} | {command} |")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz_report",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=10.0,
                        help="multiplier of every property's example count (default 10)")
    parser.add_argument("--only", choices=sorted(FILES), action="append",
                        help="run only these test files (repeatable)")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression")
    args = parser.parse_args(argv)
    paths = [FILES[k] for k in (args.only or FILES)]
    extra = ["-k", args.keyword] if args.keyword else []
    started = time.perf_counter()
    collector, stats = run(paths, args.scale, extra)
    lines = [
        "| What was tried | Cases | What was observed | Reproduce |",
        "|---|---|---|---|",
        *rows(collector, stats, args.scale),
    ]
    print("\n".join(lines))
    failed = any(r.outcomes["failed"] or r.outcomes["xpassed"]
                 for r in collector.results.values())
    print(f"fuzz report: {len(collector.results)} tests in "
          f"{time.perf_counter() - started:.0f} s at scale {args.scale:g}"
          + ("; SOME FAILED" if failed else ""), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
