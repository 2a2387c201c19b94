"""Write the web page's calls (`daemon/web/methods.js`) from the protocol's JSON Schema.

    python -m ctxd.protocol.gen_js            # (re)write daemon/web/methods.js
    python -m ctxd.protocol.gen_js --check    # exit 1 when the file is stale

The page has no build step, so the module is generated here and checked in, like the
docs. Each method becomes one function of `Methods`: the required params in the order
the schema declares them, then an object of the optional ones. A param the method does
not declare, or a missing required one, throws in the page before anything is sent.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ctxd.protocol.schema import build_schema

DEFAULT_OUTPUT = Path(__file__).resolve().parent.parent / "daemon" / "web" / "methods.js"

_JS_TYPES = {"string": "string", "integer": "number", "number": "number",
             "boolean": "boolean", "object": "Object", "array": "Array"}


# names a param cannot have in a strict-mode function (ES modules are strict)
_RESERVED = frozenset({
    "arguments", "eval", "break", "case", "catch", "class", "const", "continue", "debugger",
    "default", "delete", "do", "else", "export", "extends", "finally", "for", "function",
    "if", "import", "in", "instanceof", "let", "new", "return", "static", "super", "switch",
    "this", "throw", "try", "typeof", "var", "void", "while", "with", "yield", "await",
})


def _arg(param: str) -> str:
    """The JavaScript argument that carries `param`."""
    return f"{param}Value" if param in _RESERVED else param


def js_name(method: str) -> str:
    """`context/pins/add` -> `contextPinsAdd`."""
    words = [w for w in method.strip("$").split("/") if w]
    return words[0] + "".join(w[:1].upper() + w[1:] for w in words[1:])


def _js_type(prop: dict[str, Any]) -> str:
    options = prop.get("anyOf") or [prop]
    kinds = []
    for o in options:
        if o.get("type") == "null":
            continue
        if "enum" in o:
            kinds.append(" | ".join(json.dumps(v) for v in o["enum"]))
        else:
            kinds.append(_JS_TYPES.get(o.get("type", ""), "*"))
    return " | ".join(kinds) or "*"


def render() -> str:
    doc = build_schema()
    defs = doc["$defs"]
    table: dict[str, dict[str, list[str]]] = {}
    out = [
        "// The protocol's methods as the page calls them. Generated from the protocol's JSON",
        "// Schema (docs/protocol.schema.json) by `python -m ctxd.protocol.gen_js`; edit the",
        "// protocol table, not this file.",
        "",
    ]
    body: list[str] = []
    for name, entry in doc["methods"].items():
        params = defs[entry["params"]["$ref"].removeprefix("#/$defs/")]
        props: dict[str, Any] = params.get("properties", {})
        required = list(params.get("required", []))
        optional = [p for p in props if p not in required]
        table[name] = {"required": required, "optional": optional}
        fn = js_name(name)
        body.append("  /**")
        body.append(f"   * `{name}`: {entry['description']}")
        for p in required:
            body.append(f"   * @param {{{_js_type(props[p])}}} {_arg(p)} `{p}`")
        if optional:
            fields = ", ".join(f"{p}?: {_js_type(props[p])}" for p in optional)
            body.append(f"   * @param {{{{{fields}}}}} [options]")
        body.append("   */")
        args = [*map(_arg, required), *(["options = {}"] if optional else [])]
        passed = ", ".join([*map(_arg, required), "options" if optional else "{}"])
        body.append(f"  {fn}({', '.join(args)}) {{")
        body.append(f"    return this.send({json.dumps(name)}, [{passed}]);")
        body.append("  }")
        body.append("")
    out.append("export const METHODS = {")
    for name, spec in table.items():
        out.append(f"  {json.dumps(name)}: {json.dumps(spec)},")
    out += [
        "};",
        "",
        "// The params object of one call: the required ones by position, the optional ones",
        "// by name; a name the method does not declare is a bug in the page, caught here.",
        "export function params(method, args) {",
        "  const spec = METHODS[method];",
        "  const out = {};",
        "  spec.required.forEach((name, i) => {",
        "    if (args[i] === undefined || args[i] === null) {",
        "      throw new TypeError(`${method}: missing required parameter '${name}'`);",
        "    }",
        "    out[name] = args[i];",
        "  });",
        "  const options = args[spec.required.length] || {};",
        "  for (const [name, value] of Object.entries(options)) {",
        "    if (!spec.optional.includes(name)) {",
        "      throw new TypeError(`${method}: unknown parameter '${name}'; accepted: ` +",
        "        (spec.optional.join(\", \") || \"none\"));",
        "    }",
        "    if (value !== undefined && value !== null) out[name] = value;",
        "  }",
        "  return out;",
        "}",
        "",
        "// `rpc` is the page's connection (rpc.js): its `call(method, params)` sends one",
        "// request.",
        "export class Methods {",
        "  constructor(rpc) {",
        "    this.rpc = rpc;",
        "  }",
        "",
        "  send(method, args) {",
        "    return this.rpc.call(method, params(method, args));",
        "  }",
        "",
        *body[:-1],
        "}",
    ]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ctxd.protocol.gen_js",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when --output is stale")
    ap.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is stale: run python -m ctxd.protocol.gen_js", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
