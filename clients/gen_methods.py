"""Write the Python clients' typed calls (`client_methods.py`) from the protocol table.

    python -m ctxd.clients.gen_methods            # (re)write clients/client_methods.py
    python -m ctxd.clients.gen_methods --check    # exit 1 when the file is stale

One method per protocol method, named by its `client`, taking each param under its
snake_case name and sending it under its wire name: what a client can send is what the
table declares. The few client-side choices the table does not hold (an argument order
kept from earlier releases, a longer timeout) are below.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

from ctxd.protocol.declare import Field, Method
from ctxd.protocol.methods import METHODS

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "client_methods.py"

# sent by the clients' open(), which computes every param (the nonce, the proof); the
# clients also write their own subscribe and unsubscribe (ZeroMQ subscribes a SUB socket)
_BY_HAND = ("initialize",)
# argument orders that shipped before the calls were generated
_ORDER: dict[str, tuple[str, ...]] = {
    "context/get": ("session_id", "format", "include_metadata", "budget_tokens", "query"),
    "context/rebuild": ("session_id", "timeout", "dry_run"),
}
# a compaction waits for a summarizer (often a model call)
_TIMEOUTS = {"context/compact": "COMPACT_TIMEOUT", "context/rebuild": "COMPACT_TIMEOUT"}
# further params by wire name, as `search` took them before it named each one
_EXTRA = ("archive/search",)

_TYPES = {
    "string": "str",
    "integer": "int",
    "number": "float",
    "boolean": "bool",
    "object": "dict[str, Any]",
    "any": "Any",
}


def _annotation(f: Field) -> str:
    if f.choices is not None:
        base = "Literal[" + ", ".join(json.dumps(c) for c in f.choices) + "]"
    elif f.type == "array":
        base = "list[dict[str, Any]]"
    else:
        base = _TYPES[f.type]
    return base if f.required else f"{base} | None"


def _constant(m: Method) -> str:
    return "".join(c if c.isalnum() else "_" for c in m.name).strip("_").upper()


def _render_method(m: Method) -> list[str]:
    args = {
        f.attr: f"{f.attr}: {_annotation(f)}" + ("" if f.required else " = None") for f in m.fields
    }
    if m.name in _TIMEOUTS:
        args["timeout"] = f"timeout: float = {_TIMEOUTS[m.name]}"
    order = _ORDER.get(m.name, tuple(args))
    assert sorted(order) == sorted(args), m.name
    sig = ["self", *(args[a] for a in order)]
    if m.name not in _TIMEOUTS:
        # the client's own timeout unless given (seconds to wait for the answer)
        sig += ["*", "timeout: float | None = None"]
    if m.name in _EXTRA:
        sig.append("**extra: Any")
    out = [f"    def {m.client}("]
    out += [f"        {s}," for s in sig]
    out += ["    ) -> R:"]
    lines = textwrap.wrap(m.doc.replace('"""', "'''"), 88)
    lines[0] = '"""' + lines[0]
    lines[-1] += '"""'
    out += [f"        {line}" for line in lines]
    pairs = [f"{f.name}={f.attr}" for f in m.fields]
    out += ["        return self.call(", f"            {_constant(m)}.name,"]
    if pairs:
        out += ["            _drop_none("]
        out += [f"                {p}," for p in pairs]
        # a param given by wire name in `extra` counts over the same one left out
        if m.name in _EXTRA:
            out += ["            )", "            | _drop_none(**extra),"]
        else:
            out += ["            ),"]
    else:
        out += ["            {},"]
    out += ["            timeout=timeout,"]
    out += ["        )", ""]
    return out


def render() -> str:
    methods = [m for m in METHODS.values() if m.name not in _BY_HAND]
    constants = sorted(_constant(m) for m in methods)
    out = [
        '"""The Python clients\' typed calls, one per method of the protocol table.',
        "",
        "Generated from protocol/table_*.py by `python -m ctxd.clients.gen_methods`; edit the",
        'table (or that generator), not this file."""',
        "",
        "from __future__ import annotations",
        "",
        "from typing import Any, Generic, Literal, TypeVar",
        "",
        "from ctxd.clients.client_common import COMPACT_TIMEOUT",
        "from ctxd.protocol.methods import (",
        *(f"    {c}," for c in constants),
        ")",
        "",
        'R = TypeVar("R")',
        "",
        "",
        "def _drop_none(**params: Any) -> dict[str, Any]:",
        "    # an absent param and one sent as null mean the same: send neither",
        "    return {k: v for k, v in params.items() if v is not None}",
        "",
        "",
        "class _Methods(Generic[R]):",
        '    """Calls over `call`: R is `Any` for `Client`, `Awaitable[Any]` for `AsyncClient`."""',
        "",
        "    def call(",
        "        self, method: str, params: dict[str, Any] | None = None, *,"
        " timeout: float | None = None",
        "    ) -> R:",
        "        raise NotImplementedError",
        "",
    ]
    for m in methods:
        out += _render_method(m)
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m ctxd.clients.gen_methods", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--check", action="store_true", help="exit 1 when --output is stale")
    ap.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(
                f"{args.output} is stale: run python -m ctxd.clients.gen_methods", file=sys.stderr
            )
            return 1
        return 0
    args.output.write_text(text, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
