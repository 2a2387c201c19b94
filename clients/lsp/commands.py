"""The commands of `ctxd lsp` (workspace/executeCommand), and the code actions and code
lenses that offer them, each a module-level handler registered on `SERVER`. Each
command takes one optional argument: an object of named fields (a bare string counts as
`sessionId`); every command runs in the server."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from lsprotocol import types as t
from pygls.uris import to_fs_path

from ctxd.clients.lsp import documents as docs
from ctxd.clients.lsp.core import BadArgument, DaemonGone
from ctxd.clients.lsp.documents import DocKey
from ctxd.clients.lsp.errors import lsp_errors
from ctxd.clients.lsp.language_server import SERVER, CtxdServer
from ctxd.protocol.errors import CtxdError

COMMANDS = (
    "ctxd.compact",
    "ctxd.rebuild",
    "ctxd.pin",
    "ctxd.unpin",
    "ctxd.openSession",
    "ctxd.chooseSession",
    "ctxd.resolveApproval",
    "ctxd.fileHistory",
    "ctxd.search",
)
CHOICES_SHOWN = 10


def one_arg(args: tuple[Any, ...]) -> dict[str, Any]:
    """The command's named arguments from its `arguments` array."""
    if not args:
        return {}
    if len(args) > 1:
        raise BadArgument(f"expected one argument (an object), got {len(args)}")
    arg = args[0]
    if arg is None:
        return {}
    if isinstance(arg, str):
        return {"sessionId": arg}
    if not isinstance(arg, dict):
        raise BadArgument(f"expected an object argument, got {type(arg).__name__}")
    return arg


def _str(args: dict[str, Any], name: str, required: bool = True) -> str | None:
    value = args.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise BadArgument(f"{name} must be a non-empty string")
    return value


def _range_text(ls: CtxdServer, uri: str, rng: Any) -> str:
    try:
        start = t.Position(int(rng["start"]["line"]), int(rng["start"]["character"]))
        end = t.Position(int(rng["end"]["line"]), int(rng["end"]["character"]))
    except (KeyError, TypeError, ValueError):
        raise BadArgument("range must be {start: {line, character}, end: {...}}") from None
    try:
        doc = ls.workspace.get_text_document(uri)
        source = doc.source
    except OSError as exc:
        raise BadArgument(f"cannot read {uri}: {exc}") from None
    return source[doc.offset_at_position(start):doc.offset_at_position(end)]


async def show(ls: CtxdServer, key: DocKey) -> dict[str, Any]:
    """Open `key` in the editor when it can be asked to; its URI either way."""
    uri = await ls.materialize(key)
    shown = False
    if ls.can_show_document:
        result = await ls.window_show_document_async(t.ShowDocumentParams(uri, take_focus=True))
        shown = bool(result and result.success)
    return {"uri": uri, "shown": shown}


@SERVER.command("ctxd.compact")
async def compact(ls: CtxdServer, *args: Any) -> Any:
    with lsp_errors():
        a = one_arg(args)
        instructions = _str(a, "instructions", required=False)
        force = a.get("force", True)
        if not isinstance(force, bool):
            raise BadArgument("force must be true or false")
        return await ls.bridge.daemon.compact(ls.bridge.session_of(a), force=force,
                                              instructions=instructions)


@SERVER.command("ctxd.rebuild")
async def rebuild(ls: CtxdServer, *args: Any) -> Any:
    with lsp_errors():
        a = one_arg(args)
        return await ls.bridge.daemon.rebuild(ls.bridge.session_of(a))


@SERVER.command("ctxd.pin")
async def pin(ls: CtxdServer, *args: Any) -> Any:
    with lsp_errors():
        a = one_arg(args)
        text = a.get("text")
        if text is None:
            uri = _str(a, "uri")
            assert uri is not None
            text = _range_text(ls, uri, a.get("range"))
        if not isinstance(text, str) or not text.strip():
            raise BadArgument("nothing to pin: select some text (or pass text)")
        return await ls.bridge.daemon.add_pin(ls.bridge.session_of(a), text)


@SERVER.command("ctxd.unpin")
async def unpin(ls: CtxdServer, *args: Any) -> Any:
    with lsp_errors():
        a = one_arg(args)
        pin_id = _str(a, "pinId")
        assert pin_id is not None
        return await ls.bridge.daemon.remove_pin(ls.bridge.session_of(a), pin_id)


@SERVER.command("ctxd.openSession")
async def open_session(ls: CtxdServer, *args: Any) -> Any:
    with lsp_errors():
        a = one_arg(args)
        kind = a.get("document", "context")
        if kind not in ("context", "transcript"):
            raise BadArgument("document must be 'context' or 'transcript'")
        start = a.get("from")
        if start is not None and (not isinstance(start, int) or isinstance(start, bool)
                                  or start < 1):
            raise BadArgument("from must be a message id (a positive integer)")
        sid = ls.bridge.session_of(a)
        await ls.bridge.title(sid)  # SessionNotFound before anything is written
        return await show(ls, DocKey(kind, sid, start if kind == "transcript" else None))


@SERVER.command("ctxd.chooseSession")
async def choose_session(ls: CtxdServer, *args: Any) -> Any:
    with lsp_errors():
        sid = one_arg(args).get("sessionId")
        if sid is None:
            if not ls.can_ask:
                raise BadArgument("pass sessionId (this editor cannot show a choice)")
            sessions = await ls.bridge.sessions(CHOICES_SHOWN)
            if not sessions:
                raise BadArgument("the daemon has no sessions yet")
            labels = {f"{s.get('title') or s['sessionId']} ({s['sessionId']})": s["sessionId"]
                      for s in sessions}
            item = await ls.window_show_message_request_async(t.ShowMessageRequestParams(
                t.MessageType.Info, "ctxd: choose the current session",
                [t.MessageActionItem(label) for label in labels]))
            if item is None or item.title not in labels:
                return None
            sid = labels[item.title]
        return await ls.bridge.choose(ls.bridge.session_of({"sessionId": sid}))


@SERVER.command("ctxd.resolveApproval")
async def resolve_approval(ls: CtxdServer, *args: Any) -> Any:
    with lsp_errors():
        a = one_arg(args)
        decision = a.get("decision")
        if decision not in ("approved", "denied"):
            raise BadArgument("decision must be 'approved' or 'denied'")
        aid = _str(a, "approvalId")
        assert aid is not None
        return await ls.bridge.resolve(aid, decision)


@SERVER.command("ctxd.fileHistory")
async def file_history(ls: CtxdServer, *args: Any) -> Any:
    with lsp_errors():
        path = _str(one_arg(args), "path")
        assert path is not None
        history = await ls.bridge.file_history(path)
        shown = await show(ls, DocKey("search", query=path)) if history["hits"] else None
        return {**{k: v for k, v in history.items() if k != "hits"}, "document": shown}


@SERVER.command("ctxd.search")
async def search(ls: CtxdServer, *args: Any) -> Any:
    with lsp_errors():
        query = _str(one_arg(args), "query")
        assert query is not None
        return await show(ls, DocKey("search", query=query))


@SERVER.feature(t.TEXT_DOCUMENT_CODE_ACTION, t.CodeActionOptions(
    code_action_kinds=[t.CodeActionKind.Empty, t.CodeActionKind.QuickFix,
                       t.CodeActionKind.Source]))
async def code_action(ls: CtxdServer, params: t.CodeActionParams) -> list[t.CodeAction]:
    uri, rng = params.text_document.uri, params.range
    out = []
    if rng.start != rng.end:
        where = {"start": {"line": rng.start.line, "character": rng.start.character},
                 "end": {"line": rng.end.line, "character": rng.end.character}}
        pin = t.Command("Pin to agent context", "ctxd.pin",
                        arguments=[{"uri": uri, "range": where}])
        out.append(t.CodeAction("Pin to agent context", kind=t.CodeActionKind.Empty,
                                command=pin))
    for aid, approval in list(ls.bridge.unanswered.items()):
        tool = approval.get("toolName") or "tool call"
        for verb, decision in (("approve", "approved"), ("deny", "denied")):
            title = f"ctxd: {verb} {tool} ({aid})"
            out.append(t.CodeAction(title, kind=t.CodeActionKind.QuickFix,
                                    command=t.Command(title, "ctxd.resolveApproval", arguments=[
                                        {"approvalId": aid, "decision": decision}])))
    key = ls.key_of(uri)
    if key is not None and key.session_id:
        for title, cmd in (("ctxd: compact this session", "ctxd.compact"),
                           ("ctxd: rebuild the summary", "ctxd.rebuild"),
                           ("ctxd: make this the current session", "ctxd.chooseSession")):
            out.append(t.CodeAction(title, kind=t.CodeActionKind.Source, command=t.Command(
                title, cmd, arguments=[{"sessionId": key.session_id}])))
    return out


@SERVER.feature(t.TEXT_DOCUMENT_CODE_LENS)
async def code_lens(ls: CtxdServer, params: t.CodeLensParams) -> list[t.CodeLens]:
    uri = params.text_document.uri
    r = await ls.rendered_for(uri)
    if r is not None:
        return [t.CodeLens(t.Range(t.Position(lens.line, 0), t.Position(lens.line, 0)),
                           t.Command(lens.title, lens.command, arguments=[lens.arguments]))
                for lens in r.lenses]
    rel = relative_path(ls, uri)
    if rel is None:
        return []
    try:
        history = await ls.bridge.file_history(rel)
    except (DaemonGone, CtxdError, TimeoutError):
        return []  # a lens is decoration: never an error popup per file
    if not history["sessions"]:
        return []
    n = history["sessions"]
    title = (f"ctxd: {n} session{'s' if n != 1 else ''}, last "
             f"{docs.ago(history['lastAt'], time.time())}")
    return [t.CodeLens(t.Range(t.Position(0, 0), t.Position(0, 0)),
                       t.Command(title, "ctxd.fileHistory", arguments=[{"path": rel}]))]


def relative_path(ls: CtxdServer, uri: str) -> str | None:
    """`uri`'s path relative to the workspace folder holding it (None outside them)."""
    if not uri.startswith("file:"):
        return None
    path = to_fs_path(uri)
    if not path:
        return None
    p = Path(path)
    if ls.cache_dir in p.parents:
        return None
    roots = [f.uri for f in ls.workspace.folders.values()] or [ls.workspace.root_uri]
    for root in roots:
        root_path = to_fs_path(root) if root else None
        if root_path:
            try:
                return p.relative_to(root_path).as_posix()
            except ValueError:
                continue
    return None
