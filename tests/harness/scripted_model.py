"""A scripted model endpoint on loopback for driving the real agent CLIs in tests.

It speaks the Anthropic Messages API (Claude Code: `ANTHROPIC_BASE_URL`) and the OpenAI
Responses API (Codex: a model provider with this `base_url`), streamed as server-sent
events, and plays one short agent session, deciding each answer from the conversation
it is sent:

1. the user's prompt        -> a shell tool call, `echo hi`
2. that call's result       -> a call of ctxd's MCP tool `search_past_messages`
3. the search's result      -> a final text

Before answering each step it runs the test's `check` with the step and the request,
so the test can look into ctxd *while the agent's session runs* (the agent waits for
the answer). Requests that are not the conversation (a title, a quota probe: no tools)
get a short text. Everything it was sent is kept in `requests` for the test to read.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Check = Callable[[str, dict[str, Any]], None]

BASH_COMMAND = "echo hi"
FINAL_TEXT = "All done: the shell said hi and ctxd found the earlier session."


def _sse(event: str | None, data: dict[str, Any]) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


class ScriptedModel:
    def __init__(self, search_query: str, check: Check | None = None) -> None:
        self.search_query = search_query
        self.check = check
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.steps: list[str] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> ScriptedModel:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _run_check(self, step: str, body: dict[str, Any]) -> None:
        with self._lock:
            self.steps.append(step)
        if self.check is None:
            return
        try:
            self.check(step, body)
        except Exception as exc:  # noqa: BLE001 - reported to the test, which fails on it
            with self._lock:
                self.errors.append(f"{step}: {type(exc).__name__}: {exc}")

    # Anthropic Messages API

    def anthropic_step(self, body: dict[str, Any]) -> str | None:
        tools = {t.get("name") for t in body.get("tools") or () if isinstance(t, dict)}
        if "Bash" not in tools:
            return None
        results = [b for m in body.get("messages") or () if m.get("role") == "user"
                   and isinstance(m.get("content"), list)
                   for b in m["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]
        ids = [str(r.get("tool_use_id")) for r in results]
        if "toolu_search" in ids:
            return "final"
        if "toolu_bash" in ids:
            return "search"
        return "bash"

    def anthropic_reply(self, step: str | None, body: dict[str, Any]) -> list[bytes]:
        model = body.get("model") or "scripted"
        start = {"type": "message_start", "message": {
            "id": f"msg_{step or 'aux'}_{len(self.requests)}", "type": "message",
            "role": "assistant", "model": model, "content": [], "stop_reason": None,
            "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 1}}}
        events = [_sse("message_start", start)]
        if step in ("bash", "search"):
            name, call_id, args = (("Bash", "toolu_bash", {"command": BASH_COMMAND,
                                                           "description": "say hi"})
                                   if step == "bash" else
                                   ("mcp__ctxd__search_past_messages", "toolu_search",
                                    {"query": self.search_query, "scope": "all"}))
            events += [
                _sse("content_block_start", {"type": "content_block_start", "index": 0,
                     "content_block": {"type": "tool_use", "id": call_id, "name": name,
                                       "input": {}}}),
                _sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                     "delta": {"type": "input_json_delta", "partial_json": json.dumps(args)}}),
                _sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ]
            stop = "tool_use"
        else:
            text = FINAL_TEXT if step == "final" else "ok"
            events += [
                _sse("content_block_start", {"type": "content_block_start", "index": 0,
                     "content_block": {"type": "text", "text": ""}}),
                _sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                     "delta": {"type": "text_delta", "text": text}}),
                _sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ]
            stop = "end_turn"
        events += [
            _sse("message_delta", {"type": "message_delta", "delta": {
                "stop_reason": stop, "stop_sequence": None}, "usage": {"output_tokens": 5}}),
            _sse("message_stop", {"type": "message_stop"}),
        ]
        return events

    # OpenAI Responses API

    def responses_step(self, body: dict[str, Any]) -> str | None:
        items = body.get("input") or []
        outputs = [i for i in items if isinstance(i, dict)
                   and i.get("type") == "function_call_output"]
        ids = [str(o.get("call_id")) for o in outputs]
        tools = body.get("tools") or []
        if not tools:
            return None
        if "call_search" in ids:
            return "final"
        if "call_shell" in ids:
            return "search"
        return "bash"

    def responses_reply(self, step: str | None, body: dict[str, Any]) -> list[bytes]:
        rid = f"resp_{step or 'aux'}_{len(self.requests)}"
        model = body.get("model") or "scripted"
        base = {"id": rid, "object": "response", "model": model, "created_at": 0,
                "status": "in_progress", "output": []}
        events = [_sse("response.created", {"type": "response.created", "response": base})]
        if step in ("bash", "search"):
            if step == "bash":
                name, cid = self.shell_tool(body), "call_shell"
                args = ({"command": ["bash", "-lc", BASH_COMMAND]} if name == "shell"
                        else {"cmd": BASH_COMMAND})
            else:
                name, cid = self.search_tool(body), "call_search"
                args = {"query": self.search_query, "scope": "all"}
            item = {"type": "function_call", "id": f"fc_{cid}", "call_id": cid,
                    "name": name, "arguments": json.dumps(args), "status": "completed"}
            # an MCP server's tools come as a namespace: the call names both
            space = self.namespace_of(body, name)
            if space:
                item["namespace"] = space
        else:
            text = FINAL_TEXT if step == "final" else "ok"
            item = {"type": "message", "id": f"m_{rid}", "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}]}
        events.append(_sse("response.output_item.done", {
            "type": "response.output_item.done", "output_index": 0, "item": item}))
        done = {**base, "status": "completed", "output": [item], "usage": {
            "input_tokens": 10, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 15}}
        events.append(_sse("response.completed", {"type": "response.completed",
                                                  "response": done}))
        return events

    @staticmethod
    def _tool_names(body: dict[str, Any]) -> list[str]:
        names = []
        for t in body.get("tools") or ():
            if isinstance(t, dict):
                names.append(str(t.get("name") or (t.get("function") or {}).get("name")))
        return names

    def shell_tool(self, body: dict[str, Any]) -> str:
        names = self._tool_names(body)
        for n in ("shell", "exec_command", "shell_command", "local_shell"):
            if n in names:
                return n
        return "shell"

    @staticmethod
    def namespace_of(body: dict[str, Any], name: str) -> str | None:
        for t in body.get("tools") or ():
            if isinstance(t, dict) and t.get("type") == "namespace":
                if any(isinstance(x, dict) and x.get("name") == name for x in t.get("tools") or ()):
                    return str(t.get("name"))
        return None

    def search_tool(self, body: dict[str, Any]) -> str:
        for t in body.get("tools") or ():
            if isinstance(t, dict) and t.get("type") == "namespace":
                for x in t.get("tools") or ():
                    if isinstance(x, dict) and "search_past_messages" in str(x.get("name")):
                        return str(x["name"])
        for n in self._tool_names(body):
            if "search_past_messages" in n:
                return n
        return "mcp__ctxd__search_past_messages"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        model = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                body = b'{"data": [], "models": []}'
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:  # noqa: N802
                size = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(size) if size else b"{}"
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = {}
                path = self.path.split("?")[0]
                with model._lock:
                    model.requests.append((path, body))
                if path.endswith("/count_tokens"):
                    return self._json({"input_tokens": 10})
                if path.endswith("/messages"):
                    step = model.anthropic_step(body)
                    if step:
                        model._run_check(step, body)
                    return self._stream(model.anthropic_reply(step, body))
                if path.endswith("/responses"):
                    step = model.responses_step(body)
                    if step:
                        model._run_check(step, body)
                    return self._stream(model.responses_reply(step, body))
                self._json({"error": {"type": "not_found", "message": path}}, 404)

            def _json(self, data: dict[str, Any], status: int = 200) -> None:
                out = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def _stream(self, events: list[bytes]) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                self.send_header("connection", "close")
                self.end_headers()
                for e in events:
                    self.wfile.write(e)
                self.wfile.flush()
                self.close_connection = True

        return Handler
