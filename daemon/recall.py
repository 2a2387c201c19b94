"""What lets an agent and its user look past the active context: the
`search_past_messages` tool and `context/explain` (summary items resolved to sources).
"""

from __future__ import annotations

import json
import time
from typing import Any

import msgspec

from ctxd.daemon.engine import Engine
from ctxd.daemon.messages import content_text
from ctxd.daemon.stores.sql.search_text import MAX_QUERY_TERMS, check_terms
from ctxd.protocol.errors import InvalidParams, NotFound
from ctxd.protocol.handlers import serves
from ctxd.protocol.methods import CONTEXT_EXPLAIN, QUERY_MAX, TOOLS_CALL
from ctxd.protocol.types import ArchiveSearchResult, ExplainResult, ToolsCallResult

SEARCH_TOOL_NAME = "search_past_messages"

SEARCH_TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": SEARCH_TOOL_NAME,
        "description": (
            "Search earlier messages of this conversation, including tool calls and tool "
            "results, that may no longer be in your context (older history is summarized; "
            "[msg N] in the summary are message ids). Plain words or a phrase, English or "
            "Chinese. Returns the best matches with their message ids."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "query": {
                    "type": "string",
                    "maxLength": QUERY_MAX,
                    "description": (
                        f"Words or a phrase to find (at most {MAX_QUERY_TERMS} words). "
                        "Messages with all the words come first; when none has them all, "
                        "messages with some of them are returned and the result says so."
                    ),
                },
                "scope": {
                    "type": "string",
                    "enum": ["session", "all"],
                    "default": "session",
                    "description": "This conversation only, or all conversations.",
                },
                "limit": {"type": "integer", "minimum": 1, "maximum": 20, "default": 5},
                "role": {
                    "type": "string",
                    "enum": ["user", "assistant", "tool", "system"],
                    "description": "Only messages of this role.",
                },
            },
            "required": ["query"],
            "additionalProperties": False,
        },
    },
}

_SNIPPET_CHARS = 300


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, str):  # the model's own JSON string, passed through
        try:
            raw = json.loads(raw) if raw.strip() else {}
        except ValueError:
            raise InvalidParams("tool arguments are not valid JSON") from None
    if not isinstance(raw, dict):
        raise InvalidParams("tool arguments must be an object")
    unknown = set(raw) - set(SEARCH_TOOL_SCHEMA["function"]["parameters"]["properties"])
    if unknown:
        raise InvalidParams(f"unknown argument(s) {sorted(unknown)} for {SEARCH_TOOL_NAME}")
    query = raw.get("query")
    if not isinstance(query, str) or not query.strip():
        raise InvalidParams(f"{SEARCH_TOOL_NAME} needs a non-empty 'query' string")
    if len(query) > QUERY_MAX:
        raise InvalidParams(
            f"{SEARCH_TOOL_NAME}: 'query' has {len(query)} characters; at most {QUERY_MAX}",
            {"param": "query"},
        )
    scope = raw.get("scope", "session")
    if scope not in ("session", "all"):
        raise InvalidParams("scope must be 'session' or 'all'")
    limit = raw.get("limit", 5)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 20:
        raise InvalidParams("limit must be an integer from 1 to 20")
    role = raw.get("role")
    if role is not None and role not in ("user", "assistant", "tool", "system"):
        raise InvalidParams("role must be user, assistant, tool or system")
    return {"query": query, "scope": scope, "limit": limit, "role": role}


def _tool_search(name: str, session_id: str, arguments: Any) -> dict[str, Any]:
    """The tool's arguments as search keywords (its query held to the term cap)."""
    if name != SEARCH_TOOL_NAME:
        raise NotFound(f"no tool {name!r}; tools/list names the tools ctxd serves")
    args = _arguments(arguments)
    check_terms(args["query"])
    return {
        "query": args["query"],
        "session_id": session_id if args["scope"] == "session" else None,
        "role": args["role"],
        "limit": args["limit"],
    }


def call_tool(engine: Engine, session_id: str, name: str, arguments: Any) -> ToolsCallResult:
    """For library users: the search runs on the caller's thread."""
    kw = _tool_search(name, session_id, arguments)
    return _tool_result(engine.search_result(**kw), kw["query"], session_id)


@serves(TOOLS_CALL)
async def call_tool_async(
    engine: Engine, session_id: str, name: str, arguments: Any
) -> ToolsCallResult:
    """The daemon's path: the search runs beside the event loop."""
    await engine.beside_loop_if_shared(lambda: engine.require_session(session_id))
    kw = _tool_search(name, session_id, arguments)
    return _tool_result(await engine.search_async(**kw), kw["query"], session_id)


def _tool_result(found: ArchiveSearchResult, query: str, session_id: str) -> ToolsCallResult:
    hits = found.hits
    # What already left the context is what the agent cannot see: list it first.
    hits.sort(key=lambda h: h.in_active_context)
    if not hits:
        text = f'No earlier messages match "{query}".'
    elif found.matched == "any":
        lines = [
            f'No message has all the words of "{query}"; {len(hits)} message(s) have '
            "some of them (best first):"
        ]
    else:
        lines = [f'{len(hits)} message(s) match "{query}":']
    if hits:
        for h in hits:
            when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(h.created_at))
            where = "" if h.session_id == session_id else f" · session {h.session_id}"
            seen = " · still in context" if h.in_active_context else ""
            if h.superseded_by is not msgspec.UNSET:
                seen += f" · superseded by msg {h.superseded_by}"
            snippet = " ".join(h.snippet.split())[:_SNIPPET_CHARS]
            # "#N": the message's place in its session, as the summary cites it
            n = f"#{h.ordinal} · " if h.ordinal is not None else ""
            lines.append(
                f"[msg {h.message_id} · {h.role} · {n}{when}{where}{seen}] {snippet}"
            )
        text = "\n".join(lines)
    return ToolsCallResult(content=text, data={"hits": hits, "matched": found.matched})


@serves(CONTEXT_EXPLAIN)
def explain(engine: Engine, session_id: str) -> ExplainResult:
    """Each summary item with its sources resolved from the archive; broken ones flagged."""
    st = engine.context_state(session_id)
    ids = sorted(st.summary.all_sources())
    found = engine.archive.get_many(ids)
    # every source gets its #N, also those cited before the summary kept ordinals
    ends = [i for i in (st.summary.covers_from, st.summary.covers_to) if i is not None]
    ordinals = engine.ordinals(session_id, [i for i in ids if i in found] + ends)
    items = []
    broken = 0
    # the instruction preambles the summary message carries verbatim come first, as there
    carried = [("preambles", p) for p in st.summary.preambles]
    for section, item in [*carried, *st.summary.items()]:
        sources = []
        for sid in item.sources:
            m = found.get(sid)
            if m is None:
                broken += 1
                sources.append({"id": sid, "broken": True})
                continue
            text = content_text(m.get("content"))
            if not text and m.get("tool_calls"):
                text = " ".join(c["function"]["name"] for c in m["tool_calls"])
            sources.append(
                {
                    "id": sid,
                    "role": m["role"],
                    "createdAt": m["createdAt"],
                    "snippet": (text or "")[:200],
                }
            )
            sources[-1]["ordinal"] = ordinals[sid]  # the #N the model reads for it
        entry = {"section": section, "text": item.text, "status": item.status, "sources": sources}
        entry.update({k: v for k, v in item.to_dict().items() if k not in ("text", "sources")})
        items.append(entry)
    return ExplainResult(
        session_id=session_id,
        pins=engine.pins(session_id),
        items=items,
        broken_pointers=broken,
        provenance={
            "compactionIds": st.summary.compaction_ids,
            "coversFrom": st.summary.covers_from,
            "coversTo": st.summary.covers_to,
            "coversFromOrdinal": ordinals.get(st.summary.covers_from or -1),
            "coversToOrdinal": ordinals.get(st.summary.covers_to or -1),
            "summarizer": st.summary.summarizer,
        },
    )
