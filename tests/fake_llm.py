"""A scriptable OpenAI-compatible chat completions server on 127.0.0.1, for tests.

It is a real HTTP server in a background thread, so the summarizer under test goes
through its actual client code over a socket. Each request takes the next behaviour
from the script (then the default): a good summary built from the prompt (every
`[id N]` line cited, the previous summary's items kept), or one of the ways real
servers and models fail. Every request is recorded for assertions on the prompt.
"""

from __future__ import annotations

import gzip
import json
import re
import ssl
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

_ID_LINE = re.compile(r"^\[id (\d+)\] (\w+)", re.MULTILINE)
_ANCHOR = re.compile(r"<previous_summary>\n(.*?)\n</previous_summary>", re.DOTALL)

BEHAVIOURS = (
    "good",  # a valid summary of the prompt
    "fenced",  # the good summary in a ```json fence, with prose around it
    "malformed",  # text that is not JSON at all
    "truncated",  # JSON cut off mid-way, finish_reason "length"
    "wrong_ids",  # the good summary plus an item citing an id that was never given
    "huge",  # the good summary with every new item padded far past any budget
    "drop_anchor",  # only the new items: the previous summary's items are lost
    "slow",  # sleeps `slow_seconds`, then the good summary
    "http500",  # HTTP 500 with an OpenAI-style error body
    "http401",  # HTTP 401 whose message echoes the key, as some servers do
    "reject_response_format",  # HTTP 400 while the request has response_format
    "chunked",  # the good summary with Transfer-Encoding: chunked
    "newer_openai_model",  # 400 on max_tokens and on a non-default temperature
    "http429",  # HTTP 429 with `Retry-After: <retry_after>` (no header when it is None)
    "http503",  # HTTP 503 without Retry-After: the client backs off on its own
    "gzip",  # the good summary, gzip-encoded
    "gzip_bomb",  # a small gzip body that inflates to `bomb_bytes` of zeros
    "sse",  # the good summary as server-sent events, a few characters an event
    "sse_stall",  # server-sent events that stop after a few tokens for `slow_seconds`
    "sse_slow_steady",  # the good summary as events `token_gap` seconds apart
    "refuse_json_schema",  # HTTP 500 to the json_schema form, as llama-cpp-python does
)


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    # the request target as sent: an absolute URL when the server was used as a proxy
    target: str = ""
    # the client's port (one per connection: equal ports mean a kept-alive connection)
    client_port: int = 0
    # time.monotonic() when the request arrived
    at: float = 0.0

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages") or [])

    @property
    def prompt(self) -> str:
        """The first user message: the summary request proper."""
        return next((m["content"] for m in self.messages if m.get("role") == "user"), "")

    @property
    def system(self) -> str:
        return next((m["content"] for m in self.messages if m.get("role") == "system"), "")

    def ids(self) -> list[int]:
        """The archive ids of the messages shown in the prompt."""
        return [int(m.group(1)) for m in _ID_LINE.finditer(self.prompt)]

    def anchor(self) -> dict[str, Any] | None:
        """The previous summary the prompt carried, or None when it had none."""
        m = _ANCHOR.search(self.prompt)
        if not m:
            return None
        try:
            data = json.loads(m.group(1))
        except ValueError:
            return None
        return data if isinstance(data, dict) else None


Behaviour = str | Callable[[Recorded], str]

_SECTION_BY_ROLE = {"user": "goals", "assistant": "decisions", "tool": "tool_activity"}


def good_summary(rec: Recorded, *, keep_anchor: bool = True) -> dict[str, Any]:
    """The anchor's items, plus one item per message shown, citing it."""
    sections: dict[str, list[dict[str, Any]]] = {}
    anchor = rec.anchor() if keep_anchor else None
    if anchor:
        for name, items in (anchor.get("sections") or {}).items():
            sections.setdefault(name, []).extend(items)
    for m in _ID_LINE.finditer(rec.prompt):
        mid, role = int(m.group(1)), m.group(2)
        section = _SECTION_BY_ROLE.get(role, "open_items")
        sections.setdefault(section, []).append({"text": f"{role} message {mid}", "sources": [mid]})
    return {"sections": sections}


class FakeLLM:
    """`with FakeLLM() as llm:` serves on `llm.base_url` until the block ends."""

    def __init__(
        self,
        default: Behaviour = "good",
        *,
        slow_seconds: float = 5.0,
        tls: ssl.SSLContext | None = None,
        model: str = "fake-model",
        retry_after: str | None = "1",
        bomb_bytes: int = 64 * 1024 * 1024,
        token_gap: float = 0.05,
        models: list[dict[str, Any]] | None = None,
    ) -> None:
        self.default = default
        self.retry_after = retry_after
        self.bomb_bytes = bomb_bytes
        self.slow_seconds = slow_seconds
        self.token_gap = token_gap
        # what GET /v1/models lists (the configured model by default)
        self.models = models if models is not None else [{"id": model, "object": "model"}]
        self.model = model
        self.requests: list[Recorded] = []
        self._script: list[Behaviour] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.fake = self  # type: ignore[attr-defined]
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        self.port = self._server.server_address[1]
        # A path of its own before /v1: the summarizer remembers, per endpoint URL, which
        # structured output form it took, and a later test's server may get this port.
        self.prefix = f"/fake-{uuid.uuid4().hex[:8]}"
        self.base_url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}{self.prefix}/v1"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def script(self, *behaviours: Behaviour) -> None:
        """Behaviours for the next requests, in order; then the default again."""
        with self._lock:
            self._script.extend(behaviours)

    def close(self) -> None:
        self._stop.set()  # wakes slow handlers
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> FakeLLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _next(self, rec: Recorded) -> Behaviour:
        with self._lock:
            self.requests.append(rec)
            return self._script.pop(0) if self._script else self.default


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # keep test output clean

    def do_GET(self) -> None:  # noqa: N802
        fake: FakeLLM = self.server.fake  # type: ignore[attr-defined]
        if self.path.removeprefix(fake.prefix) == "/v1/models":
            self._send(200, {"object": "list", "data": fake.models})
        else:
            self._send(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:  # noqa: N802
        fake: FakeLLM = self.server.fake  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw)
        except ValueError:
            self._send(400, {"error": {"message": "request body is not JSON"}})
            return
        # A request through a proxy names the whole URL; serving it here makes this
        # server the proxy too (tests of proxy settings need no second server).
        path = urlsplit(self.path).path if "://" in self.path else self.path
        path = path.removeprefix(fake.prefix)
        rec = Recorded(
            path,
            {k.lower(): v for k, v in self.headers.items()},
            body,
            target=self.path,
            client_port=self.client_address[1],
            at=time.monotonic(),
        )
        behaviour = fake._next(rec)
        if path != "/v1/chat/completions":
            self._send(404, {"error": {"message": f"no route {path}"}})
            return
        try:
            self._answer(fake, rec, behaviour)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test)

    def _answer(self, fake: FakeLLM, rec: Recorded, behaviour: Behaviour) -> None:
        if callable(behaviour):
            self._completion(fake, behaviour(rec))
            return
        good = json.dumps(good_summary(rec))
        if behaviour == "good":
            self._completion(fake, good)
        elif behaviour == "fenced":
            self._completion(
                fake, f"Sure! Here is the summary:\n\n```json\n{good}\n```\n\nLet me know."
            )
        elif behaviour == "malformed":
            self._completion(fake, "The summary: goals were {to fix the thing, sources: 1")
        elif behaviour == "truncated":
            self._completion(fake, good[: len(good) // 2], finish_reason="length")
        elif behaviour == "wrong_ids":
            data = good_summary(rec)
            data["sections"].setdefault("errors", []).append(
                {"text": "an invented error", "sources": [99999]}
            )
            self._completion(fake, json.dumps(data))
        elif behaviour == "huge":
            data = good_summary(rec)
            shown = set(rec.ids())
            for items in data["sections"].values():
                for item in items:
                    if set(item["sources"]) <= shown:  # the new items, not the anchor's
                        item["text"] += " padding" * 400
            self._completion(fake, json.dumps(data))
        elif behaviour == "drop_anchor":
            self._completion(fake, json.dumps(good_summary(rec, keep_anchor=False)))
        elif behaviour == "slow":
            if fake._stop.wait(fake.slow_seconds):
                return
            self._completion(fake, good)
        elif behaviour == "http500":
            self._send(500, {"error": {"message": "model crashed", "type": "server_error"}})
        elif behaviour == "http401":
            key = rec.headers.get("authorization", "").removeprefix("Bearer ")
            self._send(401, {"error": {"message": f"Incorrect API key provided: {key}"}})
        elif behaviour == "reject_response_format":
            if "response_format" in rec.body:
                self._send(
                    400,
                    {"error": {"message": "Invalid parameter: 'response_format' of type "
                               "'json_object' is not supported with this model."}},
                )
            else:
                self._completion(fake, good)
        elif behaviour == "newer_openai_model":
            if "max_tokens" in rec.body:
                self._send(400, {"error": {"message": "Unsupported parameter: 'max_tokens' is "
                                           "not supported with this model. Use "
                                           "'max_completion_tokens' instead."}})
            elif rec.body.get("temperature", 1) != 1:
                self._send(400, {"error": {"message": "Unsupported value: 'temperature' does "
                                           "not support 0.2 with this model. Only the default "
                                           "(1) value is supported."}})
            else:
                self._completion(fake, good)
        elif behaviour == "chunked":
            self._completion(fake, good, chunked=True)
        elif behaviour == "http429":
            extra = {"Retry-After": fake.retry_after} if fake.retry_after is not None else {}
            self._send(429, {"error": {"message": "Rate limit reached", "type": "requests"}},
                       headers=extra)
        elif behaviour == "http503":
            self._send(503, {"error": {"message": "The server is overloaded"}})
        elif behaviour == "gzip":
            self._completion(fake, good, gzipped=True)
        elif behaviour == "sse":
            self._events(fake, good)
        elif behaviour == "sse_stall":
            self._events(fake, good, stall_after=3)
        elif behaviour == "sse_slow_steady":
            self._events(fake, good, gap=fake.token_gap, piece=max(1, len(good) // 40))
        elif behaviour == "refuse_json_schema":
            if (rec.body.get("response_format") or {}).get("type") == "json_schema":
                self._send(500, {"error": {"message": "Internal Server Error"}})
            else:
                self._events(fake, good)
        elif behaviour == "gzip_bomb":
            # deflate at level 9 packs zeros ~1000:1, so the bomb is small on the wire
            packer = zlib.compressobj(9, zlib.DEFLATED, 31)
            zeros = bytes(1 << 20)
            data = b"".join(packer.compress(zeros) for _ in range(fake.bomb_bytes >> 20))
            data += packer.flush()
            self._raw(200, data, {"Content-Encoding": "gzip"})
        else:
            raise ValueError(f"unknown behaviour {behaviour!r}")

    def _completion(
        self,
        fake: FakeLLM,
        content: str,
        finish_reason: str = "stop",
        chunked: bool = False,
        gzipped: bool = False,
    ) -> None:
        body = {
            "id": f"chatcmpl-{len(fake.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": fake.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": finish_reason,
                }
            ],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }
        if gzipped:
            self._raw(200, gzip.compress(json.dumps(body).encode()), {"Content-Encoding": "gzip"})
            return
        self._send(200, body, chunked=chunked)

    def _events(
        self,
        fake: FakeLLM,
        content: str,
        *,
        stall_after: int | None = None,
        gap: float = 0.0,
        piece: int = 7,
    ) -> None:
        """`content` as chat completion chunks over server-sent events, chunked."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def send(data: str) -> None:
            raw = data.encode()
            self.wfile.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
            self.wfile.flush()

        # a keep-alive comment, as sse-starlette sends: not a token
        send(": ping\n\n")
        pieces = [content[i : i + piece] for i in range(0, len(content), piece)]
        for n, text in enumerate(pieces):
            if stall_after is not None and n == stall_after:
                # keep the connection open, sending comments only, then give up
                deadline = time.monotonic() + fake.slow_seconds
                while time.monotonic() < deadline and not fake._stop.is_set():
                    send(": ping\n\n")
                    if fake._stop.wait(0.2):
                        break
                return
            if gap and fake._stop.wait(gap):
                return
            chunk = {
                "id": "chatcmpl-s",
                "object": "chat.completion.chunk",
                "model": fake.model,
                "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
            }
            send(f"data: {json.dumps(chunk)}\n\n")
        last = {
            "id": "chatcmpl-s",
            "object": "chat.completion.chunk",
            "model": fake.model,
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        }
        send(f"data: {json.dumps(last)}\n\n")
        send("data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")

    def _raw(self, status: int, data: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send(
        self,
        status: int,
        body: dict[str, Any],
        chunked: bool = False,
        headers: dict[str, str] | None = None,
    ) -> None:
        # Connections are kept alive (HTTP/1.1's default), as real endpoints do.
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(0, len(data), 700):
                piece = data[i : i + 700]
                self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
