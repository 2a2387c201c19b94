"""A result built and encoded as a dict (camelCase keys) against the same result as its
Struct (protocol/types.py), on both wires' encoders: what handlers returning Structs cost.

    python -m bench.bench_struct_encode [--rounds N] [--calls N]

Three results: `context/status` (a Status), an `archive/read` page of 40 short messages
(an ArchiveReadResult holding the messages as dicts, as the store returns them) and
`session/get` (the store's session record and the status). JSON is `codec.dumps_json`
of the reply, as rpc_core writes it; msgpack is `large.pack_reply`, as the ZeroMQ wire
writes it (msgpack of the dict before, msgspec's msgpack for a Struct now). Each row
checks first that both forms encode to the same bytes, then times build + encode,
alternating the two forms round by round; medians in µs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from ctxd.protocol.codec import dumps_json
from ctxd.protocol.large import pack_reply
from ctxd.protocol.types import ArchiveReadResult, SessionGetResult, Status


def status_dict(i: int) -> dict[str, Any]:
    return {
        "sessionId": "ses_0123456789abcdef", "activeMessages": 40 + i, "estimatedTokens": 3210,
        "archiveMessages": 5000, "compactionCount": 3, "lastCompactedAt": 1764620000.5,
        "pendingApprovals": 0, "activeRunId": None, "compacting": False,
        "autoCompactionPaused": False, "version": 7, "summarizer": "builtin",
        "summarizerLastFailureAt": None, "summarizerLastFailure": None,
    }


def status_struct(i: int) -> Status:
    return Status(
        session_id="ses_0123456789abcdef", active_messages=40 + i, estimated_tokens=3210,
        archive_messages=5000, compaction_count=3, last_compacted_at=1764620000.5,
        pending_approvals=0, active_run_id=None, compacting=False,
        auto_compaction_paused=False, version=7, summarizer="builtin",
        summarizer_last_failure_at=None, summarizer_last_failure=None,
    )


MESSAGES = [{"role": "user" if n % 2 else "assistant", "content": f"message {n} " * 12}
            for n in range(40)]
SESSION = {"sessionId": "ses_0123456789abcdef", "title": "t", "metadata": {},
           "createdAt": 1764620000.25}

CASES: dict[str, tuple[Callable[[int], Any], Callable[[int], Any]]] = {
    "context/status": (status_dict, status_struct),
    "archive/read, 40 messages": (
        lambda i: {"messages": MESSAGES, "nextAfterId": 1039 + i, "firstOrdinal": 1},
        lambda i: ArchiveReadResult(messages=MESSAGES,  # type: ignore[arg-type]
                                    next_after_id=1039 + i, first_ordinal=1),
    ),
    "session/get": (
        lambda i: {"session": SESSION, "status": status_dict(i)},
        lambda i: SessionGetResult(session=SESSION,  # type: ignore[arg-type]
                                   status=status_struct(i)),
    ),
}

WIRES: dict[str, Callable[[Any], bytes]] = {
    "JSON-RPC": lambda r: dumps_json({"jsonrpc": "2.0", "id": 1, "result": r}),
    "ZeroMQ": lambda r: pack_reply(1, r),
}


def timed(build: Callable[[int], Any], encode: Callable[[Any], bytes], calls: int) -> float:
    t0 = time.perf_counter()
    for i in range(calls):
        encode(build(i))
    return (time.perf_counter() - t0) / calls * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=3000)
    args = ap.parse_args(argv)
    print("| Result | Wire | dict µs | Struct µs | Struct/dict |")
    print("|---|---|---|---|---|")
    for case, (as_dict, as_struct) in CASES.items():
        for wire, encode in WIRES.items():
            assert encode(as_dict(0)) == encode(as_struct(0)), f"{case} {wire}: bytes differ"
            dicts: list[float] = []
            structs: list[float] = []
            for r in range(args.rounds):
                pair = [(dicts, as_dict), (structs, as_struct)]
                for out, build in pair if r % 2 == 0 else reversed(pair):
                    out.append(timed(build, encode, args.calls))
            d, s = statistics.median(dicts), statistics.median(structs)
            print(f"| {case} | {wire} | {d:.2f} | {s:.2f} | {s / d:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
