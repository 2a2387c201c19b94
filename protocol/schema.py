"""The protocol as one JSON Schema.

    python -m ctxd.protocol                 # print the JSON Schema
    python -m ctxd.protocol --write         # (re)write docs/protocol.schema.json
    python -m ctxd.protocol --check         # exit 1 when that file is stale

Each method's params are declared once, as a msgspec Struct in its `table_*.py` (names,
types, bounds, choices, defaults, docs), and `validate_params` converts requests into that
same Struct, so the schema says exactly what the daemon accepts. Results and
notifications come from `types.py`. The document has every type under `$defs` and, under
`methods` and `notifications`, which type each method takes and returns.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from ctxd.protocol import types
from ctxd.protocol.errors import ErrorCode
from ctxd.protocol.methods import (
    COMMON_ERRORS,
    METHODS,
    NOTIFICATIONS,
    PROTOCOL_VERSION,
    RESULTS,
)

DEFAULT_OUTPUT = Path(__file__).resolve().parent.parent / "docs" / "protocol.schema.json"

def struct_name(method: str, suffix: str) -> str:
    words = [w for part in method.strip("$/").split("/") for w in [part] if w]
    return "".join(w[:1].upper() + w[1:] for w in words) + suffix


PARAMS: dict[str, type[msgspec.Struct]] = {name: m.params for name, m in METHODS.items()}


def build_schema() -> dict[str, Any]:
    """The whole protocol as one JSON Schema document (draft 2020-12)."""
    methods = list(METHODS.values())
    roots: list[Any] = [PARAMS[m.name] for m in methods]
    roots += [RESULTS[m.name] for m in methods]
    roots += list(types.NOTIFICATIONS.values())
    _, defs = msgspec.json.schema_components(roots, ref_template="#/$defs/{name}")

    def ref(t: Any) -> dict[str, str]:
        return {"$ref": f"#/$defs/{t.__name__}"}

    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"ctxd protocol {PROTOCOL_VERSION}",
        "description": "Methods, params, results and notifications of the ctxd daemon "
        "(docs/protocol.md). Each method's `params` and `result` name a type in `$defs`.",
        "protocolVersion": PROTOCOL_VERSION,
        "methods": {
            m.name: {
                "description": m.doc,
                "params": ref(PARAMS[m.name]),
                "result": ref(RESULTS[m.name]),
                "errors": [c.name for c in m.errors],
            }
            for m in methods
        },
        "notifications": {
            name: {"description": n.doc, "params": ref(types.NOTIFICATIONS[name])}
            for name, n in NOTIFICATIONS.items()
        },
        "errors": {c.name: int(c) for c in ErrorCode},
        "commonErrors": [c.name for c in COMMON_ERRORS],
        "$defs": dict(sorted(defs.items())),
    }


def render() -> str:
    return json.dumps(build_schema(), indent=2, ensure_ascii=False, sort_keys=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ctxd.protocol", description=__doc__.split("\n")[0])
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help="write --output")
    group.add_argument("--check", action="store_true", help="exit 1 when --output is stale")
    ap.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is stale: run python -m ctxd.protocol --write", file=sys.stderr)
            return 1
        return 0
    if args.write:
        args.output.write_text(text, encoding="utf-8")
        print(f"wrote {args.output}")
        return 0
    sys.stdout.write(text)
    return 0
