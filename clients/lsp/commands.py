"""The commands of `ctxd lsp` (workspace/executeCommand), and the code actions and code
lenses that offer them. Each command takes one optional argument: an object of named
fields (a bare string counts as `sessionId`); every command runs in the server."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from lsprotocol import types as t
from pygls.exceptions import JsonRpcException
from pygls.uris import to_fs_path

from ctxd.clients.lsp import documents as docs
from ctxd.clients.lsp.core import BadArgument, Bridge, DaemonGone
from ctxd.clients.lsp.documents import DocKey, Rendered
from ctxd.clients.lsp.errors import lsp_error
from ctxd.protocol.errors import CtxdError


class CtxdServer(Protocol):
    """What the commands use of the language server (server.CtxdServer is one)."""

    cache_dir: Path
    can_ask: bool
    can_show_document: bool
    workspace: Any

    def command(self, name: str) -> Callable[..., Any]: ...

    def feature(self, *args: Any, **kw: Any) -> Callable[..., Any]: ...

    def key_of(self, uri: str) -> DocKey | None: ...

    async def materialize(self, key: DocKey) -> str: ...

    def window_show_document_async(self, params: Any) -> Awaitable[Any]: ...

    def window_show_message_request_async(self, params: Any) -> Awaitable[Any]: ...

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


def register(ls: CtxdServer, bridge: Bridge,
             rendered_for: Callable[[str], Awaitable[Rendered | None]]) -> None:

    def command(name: str) -> Callable[[Callable[[dict[str, Any]], Awaitable[Any]]], Any]:
        def wrap(fn: Callable[[dict[str, Any]], Awaitable[Any]]) -> Any:
            async def handler(*args: Any) -> Any:
                try:
                    return await fn(one_arg(args))
                except (BadArgument, DaemonGone, CtxdError, TimeoutError) as exc:
                    raise lsp_error(exc) from None

            ls.command(name)(handler)
            return fn
        return wrap

    @command("ctxd.compact")
    async def compact(a: dict[str, Any]) -> Any:
        instructions = _str(a, "instructions", required=False)
        force = a.get("force", True)
        if not isinstance(force, bool):
            raise BadArgument("force must be true or false")
        return await bridge.daemon.compact(bridge.session_of(a), force=force,
                                           instructions=instructions)

    @command("ctxd.rebuild")
    async def rebuild(a: dict[str, Any]) -> Any:
        return await bridge.daemon.rebuild(bridge.session_of(a))

    @command("ctxd.pin")
    async def pin(a: dict[str, Any]) -> Any:
        text = a.get("text")
        if text is None:
            uri = _str(a, "uri")
            assert uri is not None
            text = _range_text(ls, uri, a.get("range"))
        if not isinstance(text, str) or not text.strip():
            raise BadArgument("nothing to pin: select some text (or pass text)")
        return await bridge.daemon.add_pin(bridge.session_of(a), text)

    @command("ctxd.unpin")
    async def unpin(a: dict[str, Any]) -> Any:
        pin_id = _str(a, "pinId")
        assert pin_id is not None
        return await bridge.daemon.remove_pin(bridge.session_of(a), pin_id)

    async def show(key: DocKey) -> dict[str, Any]:
        uri = await ls.materialize(key)
        shown = False
        if ls.can_show_document:
            result = await ls.window_show_document_async(
                t.ShowDocumentParams(uri, take_focus=True))
            shown = bool(result and result.success)
        return {"uri": uri, "shown": shown}

    @command("ctxd.openSession")
    async def open_session(a: dict[str, Any]) -> Any:
        kind = a.get("document", "context")
        if kind not in ("context", "transcript"):
            raise BadArgument("document must be 'context' or 'transcript'")
        start = a.get("from")
        if start is not None and (not isinstance(start, int) or isinstance(start, bool)
                                  or start < 1):
            raise BadArgument("from must be a message id (a positive integer)")
        sid = bridge.session_of(a)
        await bridge.title(sid)  # SessionNotFound before anything is written
        return await show(DocKey(kind, sid, start if kind == "transcript" else None))

    @command("ctxd.chooseSession")
    async def choose_session(a: dict[str, Any]) -> Any:
        sid = a.get("sessionId")
        if sid is None:
            if not ls.can_ask:
                raise BadArgument("pass sessionId (this editor cannot show a choice)")
            sessions = await bridge.sessions(CHOICES_SHOWN)
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
        return await bridge.choose(bridge.session_of({"sessionId": sid}))

    @command("ctxd.resolveApproval")
    async def resolve_approval(a: dict[str, Any]) -> Any:
        decision = a.get("decision")
        if decision not in ("approved", "denied"):
            raise BadArgument("decision must be 'approved' or 'denied'")
        aid = _str(a, "approvalId")
        assert aid is not None
        return await bridge.resolve(aid, decision)

    @command("ctxd.fileHistory")
    async def file_history(a: dict[str, Any]) -> Any:
        path = _str(a, "path")
        assert path is not None
        history = await bridge.file_history(path)
        shown = await show(DocKey("search", query=path)) if history["hits"] else None
        return {**{k: v for k, v in history.items() if k != "hits"}, "document": shown}

    @command("ctxd.search")
    async def search(a: dict[str, Any]) -> Any:
        query = _str(a, "query")
        assert query is not None
        return await show(DocKey("search", query=query))

    @ls.feature(t.TEXT_DOCUMENT_CODE_ACTION, t.CodeActionOptions(
        code_action_kinds=[t.CodeActionKind.Empty, t.CodeActionKind.QuickFix,
                           t.CodeActionKind.Source]))
    async def code_action(params: t.CodeActionParams) -> list[t.CodeAction]:
        uri, rng = params.text_document.uri, params.range
        out = []
        if rng.start != rng.end:
            where = {"start": {"line": rng.start.line, "character": rng.start.character},
                     "end": {"line": rng.end.line, "character": rng.end.character}}
            pin = t.Command("Pin to agent context", "ctxd.pin",
                            arguments=[{"uri": uri, "range": where}])
            out.append(t.CodeAction("Pin to agent context", kind=t.CodeActionKind.Empty,
                                    command=pin))
        for aid, approval in list(bridge.unanswered.items()):
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

    @ls.feature(t.TEXT_DOCUMENT_CODE_LENS)
    async def code_lens(params: t.CodeLensParams) -> list[t.CodeLens]:
        uri = params.text_document.uri
        r = await rendered_for(uri)
        if r is not None:
            return [t.CodeLens(t.Range(t.Position(lens.line, 0), t.Position(lens.line, 0)),
                               t.Command(lens.title, lens.command, arguments=[lens.arguments]))
                    for lens in r.lenses]
        rel = relative_path(ls, uri)
        if rel is None:
            return []
        try:
            history = await bridge.file_history(rel)
        except (DaemonGone, CtxdError, TimeoutError):
            return []  # a lens is decoration: never an error popup per file
        if not history["sessions"]:
            return []
        n = history["sessions"]
        title = (f"ctxd: {n} session{'s' if n != 1 else ''}, last "
                 f"{docs.ago(history['lastAt'], time.time())}")
        return [t.CodeLens(t.Range(t.Position(0, 0), t.Position(0, 0)),
                           t.Command(title, "ctxd.fileHistory", arguments=[{"path": rel}]))]

    _ = (compact, rebuild, pin, unpin, open_session, choose_session, resolve_approval,
         file_history, search, code_action, code_lens, JsonRpcException)


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
