"""`ctxd lsp`: the LSP features, each a module-level handler registered on `SERVER`
(`language_server.py`) that calls the core (`core.Bridge`) and shapes the answer.

Standard LSP only: workspace/symbol searches the archive; session documents are served
through `workspace/textDocumentContent` on `ctxd:` URIs when the client advertises it,
else as read-only files under ctxd's cache dir kept current on events; documentLink,
definition and hover follow summary source pointers; approvals arrive as
showMessageRequest (showMessage when the client cannot answer one); compactions show as
work-done progress; `ctxd/status` carries the current session's numbers. Every command
(`commands.py`, registered on the same object) runs here and is listed in
executeCommandProvider.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lsprotocol import types as t
from pygls.exceptions import JsonRpcInvalidParams

from ctxd.clients.lsp import commands
from ctxd.clients.lsp import documents as docs
from ctxd.clients.lsp.errors import lsp_errors
from ctxd.clients.lsp.language_server import SERVER, STATUS_NOTIFICATION, CtxdServer

__all__ = ["SERVER", "STATUS_NOTIFICATION", "run"]

# the commands registered on SERVER as their module was imported: the ones it lists
if set(SERVER.protocol.fm.commands) != set(commands.COMMANDS):
    raise RuntimeError(f"ctxd lsp registers {sorted(SERVER.protocol.fm.commands)}, "
                       f"not the commands listed: {sorted(commands.COMMANDS)}")
FILE_MODE_SYMBOLS = 50  # in file mode every hit's page is written before answering


@SERVER.feature(t.INITIALIZE)
def initialize(ls: CtxdServer, params: t.InitializeParams) -> None:
    ls.read_client(params.capabilities)
    ls.bridge.start()


@SERVER.feature(t.SHUTDOWN)
async def shutdown(ls: CtxdServer, *_: Any) -> None:
    await ls.bridge.close()


@SERVER.feature(t.WORKSPACE_SYMBOL)
async def workspace_symbol(ls: CtxdServer,
                           params: t.WorkspaceSymbolParams) -> list[t.SymbolInformation]:
    query = (params.query or "").strip()
    if not query:
        return []  # editors ask with "" first; the archive has no "everything" answer
    with lsp_errors():
        limit = None if ls.virtual_docs else FILE_MODE_SYMBOLS
        hits = await ls.bridge.search(query, **({"limit": limit} if limit else {}))
        keys = [docs.page_of(h["sessionId"], h["messageId"]) for h in hits]
        if not ls.virtual_docs:
            await asyncio.gather(*(ls.materialize(k) for k in set(keys)))
        return [t.SymbolInformation(
            name=docs.clean_snippet(hit.get("snippet", ""))[:200] or f"msg {hit['messageId']}",
            kind=t.SymbolKind.String,
            location=await ls.location(key, hit["messageId"]),
            container_name=f"{hit['title']} · {hit['role']} "
            f"#{hit.get('ordinal', '?')} · msg {hit['messageId']}")
            for hit, key in zip(hits, keys, strict=True)]


@SERVER.feature(t.WORKSPACE_TEXT_DOCUMENT_CONTENT)
async def text_document_content(
        ls: CtxdServer, params: t.TextDocumentContentParams) -> t.TextDocumentContentResult:
    key = docs.parse_uri(params.uri)
    if key is None:
        raise JsonRpcInvalidParams(message=f"not a ctxd document: {params.uri}")
    with lsp_errors():
        return t.TextDocumentContentResult((await ls.bridge.render(key)).text)


@SERVER.feature(t.TEXT_DOCUMENT_DOCUMENT_LINK)
async def document_link(ls: CtxdServer, params: t.DocumentLinkParams) -> list[t.DocumentLink]:
    r = await ls.rendered_for(params.text_document.uri)
    if r is None:
        return []
    with lsp_errors():
        targets = {k: await ls.materialize(k) for k in {link.target for link in r.links}}
    return [t.DocumentLink(ls.span(r, link.line, link.start, link.end),
                           target=targets[link.target], tooltip=link.tooltip or None)
            for link in r.links]


@SERVER.feature(t.TEXT_DOCUMENT_DEFINITION)
async def definition(ls: CtxdServer, params: t.DefinitionParams) -> t.Location | None:
    r = await ls.rendered_for(params.text_document.uri)
    link = r.link_at(params.position.line, ls.index(r, params.position)) if r else None
    if link is None:
        return None
    with lsp_errors():
        return await ls.location(link.target, link.message_id or -1)


@SERVER.feature(t.TEXT_DOCUMENT_HOVER)
async def hover(ls: CtxdServer, params: t.HoverParams) -> t.Hover | None:
    r = await ls.rendered_for(params.text_document.uri)
    link = r.link_at(params.position.line, ls.index(r, params.position)) if r else None
    if r is None or link is None or link.message_id is None:
        return None
    body = r.bodies.get(link.message_id)
    if body is None:
        with lsp_errors():
            page = await ls.bridge.rendered(docs.page_of(link.target.session_id,
                                                         link.message_id))
        body = page.bodies.get(link.message_id, "(not in the archive)")
    # the pointer as shown (#N, the message's place in its session) and its archive id
    shown = r.lines[link.line][link.start:link.end]
    head = f"{shown} · msg {link.message_id}" if shown.startswith("#") \
        else f"msg {link.message_id}"
    return t.Hover(t.MarkupContent(t.MarkupKind.Markdown,
                                   f"**ctxd message {head}**\n\n{body}"),
                   ls.span(r, link.line, link.start, link.end))


def run(connection_file: Path, cache_dir: Path, start_daemon: Callable[[], None] | None,
        tcp: tuple[str, int] | None = None) -> int:
    """Serve one editor on stdio (or TCP for debugging); returns when stdin closes."""
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING,
                        format="ctxd lsp: %(levelname)s %(name)s: %(message)s")
    # typed error replies are answers, not server faults: keep pygls from logging each
    # one with a traceback
    logging.getLogger("pygls.protocol.json_rpc").setLevel(logging.CRITICAL)
    cache_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    SERVER.configure(connection_file, cache_dir, start_daemon)
    if tcp is not None:
        SERVER.start_tcp(*tcp)
        return 0
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    # stdout carries only protocol: anything printed by mistake goes to stderr instead
    sys.stdout = sys.stderr
    SERVER.start_io(stdin, stdout)
    return 0
