"""Render the protocol table to `docs/protocol.md`.

    python -m ctxd.protocol.gen_docs            # (re)write docs/protocol.md
    python -m ctxd.protocol.gen_docs --check    # exit 1 when the file is stale
    python -m ctxd.protocol.gen_docs --stdout   # print instead of writing

The document is a pure function of the table (`table_*.py`), `types.py`, `errors.py` and
`connection.py`, so the check catches a table change committed without its documentation.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ctxd.protocol.connection import CONNECTION_KEYS
from ctxd.protocol.errors import ErrorCode
from ctxd.protocol.methods import (
    COMMON_ERRORS,
    ERROR_DOCS,
    METHODS,
    NOTIFICATIONS,
    PROTOCOL_VERSION,
    RESULTS,
    SERVER_NAME,
    Field,
    Method,
)
from ctxd.protocol.schema import PARAMS

# protocol/ sits next to docs/ in the source tree; an installed copy has no docs/ and
# must be given --output.
DEFAULT_OUTPUT = Path(__file__).resolve().parent.parent / "docs" / "protocol.md"

CONNECTION_KEY_DOCS: dict[str, str] = {
    "pid": "Process id of the daemon; a client may check it is alive before connecting.",
    "jsonrpc_tcp": "Address of the JSON-RPC 2.0 TCP listener (Content-Length framing).",
    "jsonrpc_unix": "Path of the same JSON-RPC listener on a Unix socket (mode 0600, in the "
    "private runtime dir), or null; only this user can connect to it, so local clients "
    "(`ctxd stdio`) prefer it.",
    "websocket": "URL of the JSON-RPC 2.0 WebSocket listener.",
    "http": "Address of the web page, served on the WebSocket port (`ctxd ui` opens it "
    "with a one-time login added).",
    "zmq_router": "ZeroMQ endpoint of the ROUTER socket that serves requests.",
    "zmq_pub": "ZeroMQ endpoint of the PUB socket that publishes notifications.",
    "token": "Secret every client proves: in `initialize`, or in each ZeroMQ request.",
    "data_dir": "Data directory (the archive) this daemon serves.",
    "store": "Where the archive lives, for people: `sqlite <file>` or `postgresql database "
    "<name> on <host>`.",
    "version": "Version of the daemon.",
}

_OVERVIEW = f"""\
`{SERVER_NAME}` keeps an agent's full chat history in an append-only archive, apart from
the model context it hands back for each model request. Every client speaks the same
methods, parameters, results and errors, on either of two wires.

Protocol version: `{PROTOCOL_VERSION}` (returned by `initialize` as `protocolVersion`).

## Wires

### JSON-RPC 2.0

Standard JSON-RPC 2.0 requests, responses and notifications, UTF-8 JSON, on three
transports:

- **TCP**: each message is framed as in LSP: `Content-Length: N\\r\\n\\r\\n` followed by
  N bytes of JSON. A broken header closes the connection.
- **WebSocket**: one JSON message per text frame, no extra framing. A browser page is
  refused unless its `Origin` is allowed.
- **stdio**: `ctxd stdio` speaks the TCP framing on its stdin and stdout, for clients
  that would rather start a process than open a socket.

Params are always an object of named parameters; a positional array is refused with
`INVALID_PARAMS`. Batches (a JSON array of requests) are accepted: the replies come
back as one array in request order. Requests of one connection start in the order they
arrive, so appends keep their order, but replies may come back in any order: match
them by `id`. Notifications from the daemon arrive as JSON-RPC notifications once the
connection has called `session/subscribe` for the session.

### ZeroMQ + msgpack

- **Requests**: a DEALER (or REQ) socket connected to the `zmq_router` endpoint sends
  one frame, a msgpack map `{{id, method, params, token}}`. The reply is one frame,
  `{{id, result}}` or `{{id, error: {{code, message, data}}}}`. On a DEALER socket replies
  can come back out of order: match them by `id`.
- **Notifications**: a SUB socket connected to the `zmq_pub` endpoint receives two-frame
  messages `[b"session/<sessionId>", msgpack {{method, params}}]`. Subscribe to the topic
  `session/<sessionId>` for one session, or to `session/` for all. ZeroMQ topics match
  by prefix, so `session/abc` also receives `session/abcd`: check `params.sessionId`.
- **Subscription probe**: a ZeroMQ subscription takes effect some time after it is made.
  To know when, also subscribe to a topic of your own starting with `probe/` (say
  `probe/<random>`): the daemon answers it with one message `{{method: "$/probe",
  params: {{topic}}}}` on that topic, and once it arrives every subscription made before
  it is in effect.

Both wires carry the same methods, params, results and error objects.

## Authentication

The daemon writes a random token into its connection file, which only its user can
read. On TCP and WebSocket the first request must be `initialize` with that token:
every other request before a successful `initialize` is refused with `UNAUTHORIZED`.
A ZeroMQ request carries the token in its `token` key each time, so `initialize` is not
needed there (it may still be called to read versions and capabilities).

**Mutual authentication.** A client should also check that what answers is the daemon
that wrote the connection file (after a crash, another process may hold its port):

1. pick a fresh random `nonce` (16 to 128 characters) and send `initialize` with `nonce`
   and `proof` = hex HMAC-SHA256 with the token as key of `"ctxd-client:" + nonce`,
   instead of `token` (the token itself never reaches a server that is not the daemon);
2. the daemon answers with `nonceMac` = hex HMAC-SHA256 with the token as key of
   `"ctxd-daemon:" + nonce`;
3. compare it with your own computation and close the connection when it differs;
   send nothing else before.

On ZeroMQ, send that `initialize` without `token` in the envelope; once `nonceMac` checks
out, put the token in every request. Clients that send `token` and no `nonce` keep
working. Check the connection file too: accept it only when it and its directory belong
to you and are not writable by others (anyone who can write there can send you elsewhere).

**ZeroMQ over TCP** (`--zmq-transport tcp`) is authenticated at the socket with CURVE:
both sockets are CURVE servers whose key pair is derived from the token, and a ZAP
handler admits only peers with the client key pair derived from the token, so nothing is
accepted or published to anyone else. Key derivation: the secret key is the 32-byte
HMAC-SHA256 with the token as key of `"ctxd-zmq-curve-server"` (daemon) or
`"ctxd-zmq-curve-client"` (clients), the public key is its Curve25519 public key
(`zmq.curve_public`). A peer that has not completed the handshake within 5 s is
disconnected. Over ipc the sockets sit in the daemon's private runtime directory.

**The web page** (a browser on the daemon's own origin, `http` in the connection file)
never holds the token and is never authenticated by a cookie (browsers send a loopback
cookie to every port of the host, so another user's server on another port would get
it). It logs in with its first WebSocket message, `initialize` with one of:

* `pageLogin`: a one-time login secret, `EXPIRY.NONCE.MAC`, where `EXPIRY` is unix
  seconds at most 120 s ahead and `MAC` the unpadded base64url HMAC-SHA256 with the token
  as key of `"ctxd web page one-time login v2"`, a zero byte, then `EXPIRY "." NONCE`.
  `ctxd ui` mints it and passes it in the address's fragment (`#login=…`, never sent to
  a server) through a 0600 redirect file in the private runtime directory, never on a
  command line. The daemon takes each one once, before it expires;
* `pageKey`: the key the reply to a `pageLogin` carried (`pageKey` in the result). The
  page keeps it in its origin's `localStorage` and sends it when it connects again. It
  stays good while a connection that used it is open and for 15 minutes after the last
  one closed; a restarted daemon knows none.

Both are refused (`UNAUTHORIZED`) from a program (no `Origin`) or any other origin.

**Run leases on ZeroMQ.** ZeroMQ does not tell the daemon when a client goes away. A
client that opened a run over ZeroMQ must send some request at least every
`runLeaseSeconds` (from `initialize`'s `capabilities`; `heartbeat` will do), or its runs
are marked interrupted. Runs left open by a daemon that died are marked interrupted when
the next daemon starts.

## Connection file

A running daemon writes a JSON file (mode 0600, in a 0700 runtime directory) telling
clients where to find it. Its keys:

"""

_CONVENTIONS = """\
## Conventions

- JSON keys are camelCase. Timestamps are unix seconds (numbers).
- An optional parameter sent as `null` counts as absent and gets its default.
- `params` left out, sent as `null` or as an empty array `[]` (what Lua's empty table
  and some clients send) means no parameters; a non-empty array is refused: parameters
  are named.
- Unknown parameter names are refused with `INVALID_PARAMS`, so a misspelt name never
  passes silently.
- `integer` parameters refuse booleans; an integral float such as `5.0` is accepted.
  `number` parameters take integers or finite floats.
- String lengths count characters; array bounds count items.
- Ids (`sessionId`, `runId`, `approvalId`, `pinId`, `toolCallId`, `clientBatchId`) are
  non-empty strings of at most 200 characters. Archive message ids are integers that
  grow in append order.
- Two numbers name a message, and every reader-facing text keeps them apart. `#N` is
  the message's **ordinal**: its position among its session's archived messages,
  counted from 1 (the summary's pointers, `ctxd show`, `ctxd explain`, `ctxd search`,
  the web page, the `search_past_messages` and MCP tools all show the same `#N` for the
  same message). The archive id, where shown, is written `msg N`. On the wire the
  ordinal is `ordinal` (search hits, `context/explain` sources) or `firstOrdinal`
  (`archive/read`: the others follow one by one).
- Messages are OpenAI chat-completion messages (`role`, `content`, `tool_calls`,
  `tool_call_id`, `name`).
- Every method's params and result, every notification's params and the message shapes
  are also one JSON Schema (draft 2020-12): `docs/protocol.schema.json`, printed by
  `python -m ctxd.protocol`. Each method below names its types there; a client in
  another language can be generated from it.
"""


def _cell(text: str) -> str:
    """Make text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def _code(value: Any) -> str:
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, str):
        return f'`"{value}"`'
    return f"`{value}`"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _constraints(p: Field) -> str:
    parts: list[str] = []
    if p.choices is not None:
        parts.append("one of " + ", ".join(_code(c) for c in p.choices))
    unit = {"string": " chars", "array": " items"}.get(p.type, "")
    if p.min is not None and p.max is not None:
        parts.append(f"{_num(p.min)}..{_num(p.max)}{unit}")
    elif p.min is not None:
        parts.append(f"≥ {_num(p.min)}{unit}")
    elif p.max is not None:
        parts.append(f"≤ {_num(p.max)}{unit}")
    return "; ".join(parts)


def _error_name(code: ErrorCode) -> str:
    return f"`{code.name}` ({int(code)})"


def _anchor(name: str) -> str:
    # GitHub's heading anchors: lowercase, punctuation other than - and _ dropped.
    return "".join(c for c in name.lower() if c.isalnum() or c in "-_")


def _render_method(m: Method) -> list[str]:
    out = [f"### `{m.name}`", "", m.doc, ""]
    if m.fields:
        out += [
            "| Param | Type | Required | Default | Constraints | Description |",
            "|---|---|---|---|---|---|",
        ]
        for p in m.fields:
            default = "" if p.default is None else _code(p.default)
            out.append(
                f"| `{p.name}` | {p.type} | {'yes' if p.required else 'no'} | {default} "
                f"| {_cell(_constraints(p))} | {_cell(p.doc)} |"
            )
    else:
        out.append("No params (send `{}` or omit `params`).")
    out += [
        "",
        f"**Result:** {m.result}",
        "",
        f"**Types:** params `{PARAMS[m.name].__name__}`, "
        f"result `{RESULTS[m.name].__name__}` (in `protocol.schema.json`).",
        "",
    ]
    if m.errors:
        out.append("**Errors:** " + ", ".join(_error_name(c) for c in m.errors) + ".")
    else:
        out.append("**Errors:** only the common ones.")
    out.append("")
    return out


def render() -> str:
    """The whole of docs/protocol.md as text."""
    missing = [k for k in CONNECTION_KEYS if k not in CONNECTION_KEY_DOCS]
    undocumented = [c.name for c in ErrorCode if c not in ERROR_DOCS]
    # Fail loudly so a new key or code cannot ship without its documentation.
    if missing or undocumented:
        raise RuntimeError(f"undocumented connection keys {missing} or error codes {undocumented}")

    out: list[str] = [
        "# ctxd protocol",
        "",
        "<!-- Generated from protocol/table_*.py by `python -m ctxd.protocol.gen_docs`;"
        " edit the table there, not this file. -->",
        "",
        _OVERVIEW.rstrip("\n"),
        "",
        "| Key | Meaning |",
        "|---|---|",
    ]
    out += [f"| `{k}` | {_cell(CONNECTION_KEY_DOCS[k])} |" for k in CONNECTION_KEYS]
    out += ["", _CONVENTIONS.rstrip("\n"), ""]

    out += ["## Methods", "", "| Method | Summary |", "|---|---|"]
    out += [f"| [`{m.name}`](#{_anchor(m.name)}) | {_cell(m.doc)} |" for m in METHODS.values()]
    out += [
        "",
        "Any method can also fail with the common errors: "
        + ", ".join(_error_name(c) for c in COMMON_ERRORS)
        + ". The errors listed under a method are the ones particular to it.",
        "",
    ]
    for m in METHODS.values():
        out += _render_method(m)

    out += [
        "## Notifications",
        "",
        "Sent to JSON-RPC connections subscribed to the session (`session/subscribe`) and "
        "published on the ZeroMQ PUB socket under the topic `session/<sessionId>`. Every "
        "notification's params include `sessionId`.",
        "",
        "| Notification | Params | Meaning |",
        "|---|---|---|",
    ]
    out += [
        f"| `{n.name}` | {_cell(n.params_doc)} | {_cell(n.doc)} |" for n in NOTIFICATIONS.values()
    ]
    out += [
        "",
        "## Errors",
        "",
        "An error is `{code, message, data?}`. The message is meant for people and says what "
        "to change; `data` carries details for programs (such as `param` for "
        "`INVALID_PARAMS`).",
        "",
        "| Code | Name | Meaning | What to do |",
        "|---|---|---|---|",
    ]
    for code in ErrorCode:
        meaning, action = ERROR_DOCS[code]
        out.append(f"| {int(code)} | `{code.name}` | {_cell(meaning)} | {_cell(action)} |")
    out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ctxd.protocol.gen_docs",
        description="Write docs/protocol.md from the protocol table.",
    )
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="file to write")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    mode.add_argument("--stdout", action="store_true", help="print instead of writing")
    args = parser.parse_args(argv)

    text = render()
    if args.stdout:
        sys.stdout.write(text)
        return 0
    path: Path = args.output
    if args.check:
        try:
            current = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            current = None
        if current != text:
            print(
                f"{path} is stale; run `python -m ctxd.protocol.gen_docs` and commit it",
                file=sys.stderr,
            )
            return 1
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    # newline="\n" keeps the bytes identical on every platform, so --check is stable.
    path.write_text(text, encoding="utf-8", newline="\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
