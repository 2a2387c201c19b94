"""The ctxd archive as an MCP server, for Claude Code, Codex CLI or any MCP client.

Built on the official `mcp` SDK: `SERVER`, an `MCPServer` on which each tool and the
resource are registered as module-level functions. It is a thin client of the shared daemon,
like `ctxd stdio`: it never opens the database, so any number of agents can each spawn
one without racing on a file. The `ctxd mcp` command and its transports are in
`mcp_serve`.

Tools: `search_past_messages` (the daemon's own tool: same schema, same results),
`read_past_messages` (a message and its neighbours by id), `context_status` and
`pin_invariant`. Resources: `ctxd://session/<id>/context`, each session's active context
(pins, summary, recent tail) fitted to a token budget. Every read is bounded, and the
defaults stay far below the 10,000 tokens at which Claude Code starts to warn.
"""

from __future__ import annotations

import json
import re
import time
from typing import Annotated, Any, Literal

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp_types import Resource
from pydantic import Field

from ctxd import __version__
from ctxd.clients.client_methods import _Methods
from ctxd.clients.mcp_daemon import DaemonLink, SessionChoice
from ctxd.clients.message_refs import numbered
from ctxd.protocol.errors import CtxdError

SERVER_NAME = "ctxd"
# per message shown by read_past_messages, and the context resource's token budget
DEFAULT_MESSAGE_CHARS = 1500
MAX_MESSAGE_CHARS = 8000
MAX_NEIGHBOURS = 10
# what one read_past_messages answer may reach, in estimated tokens (Claude Code warns
# about tool output above 10,000)
READ_BUDGET_TOKENS = 8000
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uff00-\uffef]")
# pages of 5000 messages walked to find an ordinal the summary does not map
ORDINAL_PAGES = 40
CONTEXT_BUDGET_TOKENS = 6000
# sessions offered in resources/list (newest first)
LISTED_SESSIONS = 100

INSTRUCTIONS = (
    "ctxd keeps the full history of your past agent sessions (this project's Claude Code "
    "and Codex transcripts, and any agent using ctxd), including tool calls and their "
    "results. Search it before redoing work or when the user refers to something from "
    "earlier; read a hit with its neighbours before relying on it."
)

SEARCH_DESCRIPTION = (
    "Search past messages of this project's agent sessions, including tool calls and tool "
    "results that are no longer in your context. Use it when the user refers to something "
    "from before ('the error we saw', 'like last time'), before redoing work that may "
    "already have been done, or when a summary line is too short to act on. Query with plain "
    "words or a phrase, English or Chinese; scope 'session' (default) is this session, "
    "'all' every session. Each hit reads [msg ID · role · #N · time (· session S)] snippet "
    "(#N: the message's place in its session, as summary lines cite it): a "
    "hit is a pointer to one message, not the whole story; call read_past_messages with "
    "message_id=ID (and the session shown, if any) to read it and what surrounds it."
)


class ToolCalls(_Methods[Any]):
    """The protocol table's calls as a tool makes them: the daemon's errors become the
    tool's, which the model reads."""

    def __init__(self, link: DaemonLink) -> None:
        self._link = link

    def call(self, method: str, params: dict[str, Any] | None = None, *,
             timeout: float | None = None) -> Any:
        try:
            return self._link.call(method, params, timeout=timeout)
        except CtxdError as exc:
            raise ToolError(exc.message) from None
        except ConnectionError as exc:
            raise ToolError(f"the ctxd daemon cannot be reached: {exc}") from None


def estimate_tokens(text: str) -> int:
    """A cheap upper-bound-ish token estimate: a CJK character is about one token, other
    text about four characters per token."""
    cjk = len(_CJK.findall(text))
    return cjk + (len(text) - cjk) // 4 + 1


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f" […{len(text) - limit} more characters]"


def _when(ts: Any) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts)) if isinstance(ts, int | float) \
        else "?"


def render_message(m: dict[str, Any], limit: int) -> str:
    """One archived message as a model reads it: header, text, calls, result link."""
    from ctxd.daemon.messages import content_text

    meta = m.get("metadata") or {}
    # an imported message's own time, not when it was imported
    when = meta.get("timestamp") if isinstance(meta.get("timestamp"), int | float) \
        else m.get("createdAt")
    head = f"[msg {m['id']} · {m['role']}"
    if m.get("ordinal") is not None:  # its place in the session: the #N summaries cite
        head += f" · #{m['ordinal']}"
    head += f" · {_when(when)}" if when else ""
    if m.get("tool_call_id"):
        head += f" · result of {m['tool_call_id']}"
    if meta.get("isError"):
        head += " · error"
    lines = [head + "]"]
    text = content_text(m.get("content"), mark_other_parts=True)
    if text:
        lines.append(_clip(text, limit))
    for call in m.get("tool_calls") or ():
        fn = call["function"]
        lines.append(f"→ call {call['id']}: {fn['name']}({_clip(fn.get('arguments', ''), 600)})")
    return "\n".join(lines)


class CtxdMCPServer(MCPServer):
    """The MCP server of `ctxd mcp`: made once at import (`SERVER`), its tools and its
    resource registered on it below as module-level functions; `configure` gives it the
    daemon and the session choice before it serves."""

    def __init__(self) -> None:
        # the version tells a client which ctxd answers (`claude mcp list`, logs)
        super().__init__(SERVER_NAME, instructions=INSTRUCTIONS, version=__version__)
        self._link: DaemonLink | None = None
        self.choice = SessionChoice()

    def configure(self, link: DaemonLink, choice: SessionChoice) -> CtxdMCPServer:
        self._link, self.choice = link, choice
        # search_past_messages takes the same input schema as the daemon's tools/list
        # entry, word for word
        schema = next(t["function"]["parameters"] for t in link.list_tools()["tools"]
                      if t["function"]["name"] == "search_past_messages")
        tool = self._tool_manager.get_tool("search_past_messages")
        if tool is not None:
            tool.parameters = schema
        return self

    @property
    def link(self) -> DaemonLink:
        if self._link is None:
            raise RuntimeError("the MCP server serves only after configure()")
        return self._link

    @property
    def daemon(self) -> ToolCalls:
        """The table's calls, failing as the tool's own errors."""
        return ToolCalls(self.link)

    def session(self, given: str | None = None) -> str:
        return given or self.choice.resolve(self.link)

    async def list_resources(self) -> list[Any]:
        """The newest sessions' contexts (read through the resource template)."""
        page = await anyio.to_thread.run_sync(
            lambda: self.link.list_sessions(limit=LISTED_SESSIONS))
        return [*await super().list_resources(), *(
            Resource(
                uri=f"ctxd://session/{s['sessionId']}/context",
                name=f"context of {s['sessionId']}",
                title=f"Context: {s.get('title') or s['sessionId']}",
                description="The session's active context: pins, the summary of older "
                "history (with [msg N] pointers) and the recent messages.",
                mime_type="text/markdown",
            ) for s in page["sessions"])]


SERVER = CtxdMCPServer()


@SERVER.resource("ctxd://session/{session_id}/context", name="session context",
                 mime_type="text/markdown",
                 description="A session's active context: pins, summary, recent tail.")
def session_context(session_id: str) -> str:
    try:
        got = SERVER.link.context_get(session_id, include_metadata=True,
                                      budget_tokens=CONTEXT_BUDGET_TOKENS)
    except CtxdError as exc:
        raise ResourceError(exc.message) from None
    return context_text(session_id, got)


def context_text(sid: str, got: dict[str, Any]) -> str:
    """A `context/get` reply as the resource's Markdown."""
    parts = [f"# Context of session {sid}",
             f"{got['status']['activeMessages']} messages, about "
             f"{got['status']['estimatedTokens']} tokens in the active context; "
             f"{got['status']['archiveMessages']} in the archive."]
    if got.get("truncated"):
        t = got["truncated"]
        parts.append(f"(Left out to fit {CONTEXT_BUDGET_TOKENS} tokens: {t['messages']} "
                     f"messages, msg {t['fromId']}..{t['toId']}; read them with "
                     "read_past_messages.)")
    for mid, m in zip(got["messageIds"], got["messages"], strict=False):
        shown = {**m, "id": mid if mid is not None else "-"}
        parts.append(render_message(shown, DEFAULT_MESSAGE_CHARS))
    return "\n\n".join(parts)


@SERVER.tool(name="search_past_messages", description=SEARCH_DESCRIPTION)
def search_past_messages(
    query: Annotated[str, Field(description="Words or a phrase to find.")],
    scope: Annotated[Literal["session", "all"],
                     Field(description="This conversation only, or all.")] = "session",
    limit: Annotated[int, Field(ge=1, le=20)] = 5,
    role: Literal["user", "assistant", "tool", "system"] | None = None,
) -> str:
    args: dict[str, Any] = {"query": query, "scope": scope, "limit": limit}
    if role is not None:
        args["role"] = role
    out = SERVER.daemon.call_tool(SERVER.session(), "search_past_messages", args)
    text = out["content"]
    if out["data"]["hits"]:
        text += ("\n\nRead a hit in full with read_past_messages(message_id=ID"
                 + (", session_id=S" if scope == "all" else "") + ").")
    return str(text)


@SERVER.tool(description=(
    "Read one past message in full with the messages around it: by message_id, the "
    "N of a search hit's [msg N] (or of a [msg N] in the summary), or by ordinal, the "
    "N of the #N a summary line ends with (the N-th message of the session). Shows "
    "each message's role, time, text, tool calls with their arguments, and which call "
    "a tool result answers. Call again with the first or last id shown to read "
    "further back or on."))
def read_past_messages(
    message_id: Annotated[int | None, Field(
        ge=1, description="The archive id: N of [msg N].")] = None,
    ordinal: Annotated[int | None, Field(
        ge=1, description="The N of a summary's #N: the N-th message of the "
        "session.")] = None,
    before: Annotated[int, Field(ge=0, le=MAX_NEIGHBOURS,
                                 description="Messages to show before it.")] = 2,
    after: Annotated[int, Field(ge=0, le=MAX_NEIGHBOURS,
                                description="Messages to show after it.")] = 2,
    session_id: Annotated[str | None, Field(
        description="The session the hit named; default: this session.")] = None,
    max_chars: Annotated[int, Field(ge=200, le=MAX_MESSAGE_CHARS,
                                    description="Characters shown per message.")]
    = DEFAULT_MESSAGE_CHARS,
) -> str:
    sid = SERVER.session(session_id)
    if (message_id is None) == (ordinal is None):
        raise ToolError("give exactly one of message_id ([msg N]) and ordinal (#N)")
    daemon = SERVER.daemon
    if ordinal is not None:
        message_id = ordinal_to_id(daemon, sid, ordinal)
    assert message_id is not None
    msgs = numbered(daemon.read(sid, after_id=message_id - 1, limit=after + 1))
    if not msgs or msgs[0]["id"] != message_id:
        raise ToolError(
            f"message {message_id} is not in session {sid}; if the search hit named "
            "another session, pass it as session_id")
    if before:
        msgs = numbered(daemon.read(sid, before_id=message_id, limit=before)) + msgs
    return read_answer(sid, message_id, msgs, max_chars)


def read_answer(sid: str, message_id: int, msgs: list[dict[str, Any]], max_chars: int) -> str:
    """The messages read, each cut so that the whole answer stays within budget."""
    limit = max_chars
    body = "\n\n".join(render_message(m, limit) for m in msgs)
    while estimate_tokens(body) > READ_BUDGET_TOKENS and limit > 200:
        limit //= 2  # the whole answer stays within budget, whatever was asked
        body = "\n\n".join(render_message(m, limit) for m in msgs)
    note = "" if limit == max_chars else (
        f" (each cut to {limit} characters to stay under ~{READ_BUDGET_TOKENS} tokens; "
        "ask for fewer neighbours to see more of each)")
    span = f"msg {msgs[0]['id']}..{msgs[-1]['id']}"
    if msgs[0].get("ordinal") is not None:
        span = f"#{msgs[0]['ordinal']}..#{msgs[-1]['ordinal']} ({span})"
    return (f"Session {sid}, messages {span} "
            f"(asked for {message_id}){note}:\n\n{body}")


def ordinal_to_id(daemon: ToolCalls, sid: str, ordinal: int) -> int:
    """The archive id of the session's ordinal-th message: from the summary's own
    map when it cites it, else counted page by page (bounded)."""
    for item in daemon.explain(sid)["items"]:
        for src in item["sources"]:
            if src.get("ordinal") == ordinal and not src.get("broken"):
                return int(src["id"])
    after, seen = 0, 0
    for _ in range(ORDINAL_PAGES):
        page = daemon.read(sid, after_id=after, limit=5000)
        msgs = page["messages"]
        if ordinal <= seen + len(msgs):
            return int(msgs[ordinal - seen - 1]["id"])
        seen += len(msgs)
        if page["nextAfterId"] is None:
            break
        after = page["nextAfterId"]
    raise ToolError(f"session {sid} has no message #{ordinal} (it has {seen})")


@SERVER.tool(description=(
    "Show which ctxd session you are attached to and the state of its context: "
    "messages and tokens in the active context, messages in the archive, how often "
    "it was compacted, pins. Use it to know whether older history was summarized "
    "away (then search_past_messages can bring details back)."))
def context_status() -> str:
    sid = SERVER.session()
    daemon = SERVER.daemon
    st = daemon.context_status(sid)
    got = daemon.get_session(sid)["session"]
    pins = daemon.list_pins(sid)["pins"]
    return json.dumps({"sessionId": sid, "title": got.get("title"),
                       "chosen": SERVER.choice.how or "given with --session",
                       "cwd": (got.get("metadata") or {}).get("cwd"),
                       "pins": len(pins), **st}, ensure_ascii=False)


@SERVER.tool(description=(
    "Pin a short fact that must survive every compaction of this session's context: "
    "a rule the user set, a constraint, a decision that must not be revisited "
    "('never touch the production database'). Pinned text stays in the context "
    "verbatim; do not pin things that are merely interesting."))
def pin_invariant(
    text: Annotated[str, Field(min_length=1, max_length=4000,
                               description="The fact, in one or two sentences.")],
) -> str:
    sid = SERVER.session()
    pin = SERVER.daemon.add_pin(sid, text)["pin"]
    return f"Pinned as {pin['pinId']} in session {sid}."
