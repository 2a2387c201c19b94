"""The language server object of `ctxd lsp`: `SERVER`, on which `server.py` and
`commands.py` register their handlers at import, as module-level functions.

`CtxdServer` holds what every handler shares: the bridge to the daemon (`core.Bridge`),
what the client declared it can do, and the mapping between session documents and the
URIs this client reads. `EditorUI` is what the core asks of the editor, said in LSP.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lsprotocol import types as t
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.language_server import lsp_method
from pygls.uris import from_fs_path, to_fs_path

from ctxd import __version__
from ctxd.clients.lsp import documents as docs
from ctxd.clients.lsp.core import Bridge
from ctxd.clients.lsp.documents import DocKey, Rendered
from ctxd.clients.lsp.errors import lsp_errors

log = logging.getLogger("ctxd.lsp")

STATUS_NOTIFICATION = "ctxd/status"


class _Dropped:
    """A message already answered while being decoded: `handle_message` skips it."""

    jsonrpc = "dropped"


class CtxdProtocol(LanguageServerProtocol):
    """pygls's protocol, plus two things: `workspace.textDocumentContent` (LSP 3.18) in the
    capabilities, and a typed error reply to a request whose params do not decode (pygls
    would only show a message, and the client would wait forever for its reply)."""

    def structure_message(self, data: dict[str, Any]) -> Any:
        try:
            return super().structure_message(data)
        except JsonRpcException:
            method = data.get("method")
            if "jsonrpc" not in data or not isinstance(method, str):
                raise
            if "id" in data:
                self._send_response(data["id"], error=JsonRpcInvalidParams(
                    message=f"invalid params for {method}: expected the object the LSP "
                            "specification defines for it",
                ).to_response_error())
            log.warning("dropped %s: its params do not decode", method)
            return _Dropped()

    @lsp_method(t.INITIALIZE)
    def lsp_initialize(self, params: t.InitializeParams) -> Any:
        result = yield from super().lsp_initialize(params)
        server = self._server
        if isinstance(server, CtxdServer) and server.virtual_docs:
            workspace = result.capabilities.workspace or t.WorkspaceOptions()
            workspace.text_document_content = t.TextDocumentContentOptions(schemes=[docs.SCHEME])
            result.capabilities.workspace = workspace
        return result


class CtxdServer(LanguageServer):
    """Made once at import (`SERVER`); `configure` gives it its daemon and cache dir
    before it serves."""

    def __init__(self) -> None:
        super().__init__("ctxd", __version__, protocol_cls=CtxdProtocol,
                         text_document_sync_kind=t.TextDocumentSyncKind.Full)
        self.cache_dir = Path()
        self._bridge: Bridge | None = None
        self.virtual_docs = False
        self.can_ask = False
        self.can_show_document = False
        self.can_progress = False
        self._progress: asyncio.Queue[tuple[str, dict[str, Any]]] | None = None

    def configure(self, connection_file: Path, cache_dir: Path,
                  start_daemon: Callable[[], None] | None) -> None:
        self.cache_dir = cache_dir
        self._bridge = Bridge(connection_file, EditorUI(self), start_daemon)

    @property
    def bridge(self) -> Bridge:
        if self._bridge is None:
            raise RuntimeError("the language server serves only after configure()")
        return self._bridge

    # capabilities the client declared

    def read_client(self, caps: t.ClientCapabilities) -> None:
        ws, win = caps.workspace, caps.window
        self.virtual_docs = bool(ws and ws.text_document_content is not None)
        self.can_ask = bool(win and win.show_message is not None)
        self.can_show_document = bool(win and win.show_document and win.show_document.support)
        self.can_progress = bool(win and win.work_done_progress)

    # documents: a DocKey <-> the URI this client reads

    def uri_of(self, key: DocKey) -> str:
        if self.virtual_docs:
            return key.uri()
        return from_fs_path(str(self.cache_dir / key.file_name())) or ""

    def key_of(self, uri: str) -> DocKey | None:
        key = docs.parse_uri(uri)
        if key is None and uri.startswith("file:"):
            path = to_fs_path(uri)
            if path:
                key = docs.parse_file(self.cache_dir, Path(path))
        return key

    async def rendered_for(self, uri: str) -> Rendered | None:
        """The rendered session document at `uri`; None when it is not one of ours."""
        key = self.key_of(uri)
        if key is None:
            return None
        with lsp_errors():
            return await self.bridge.rendered(key)

    async def materialize(self, key: DocKey) -> str:
        """The URI of `key`, its file written first when the client reads files."""
        if not self.virtual_docs:
            path = self.cache_dir / key.file_name()
            if key not in self.bridge.live or not path.exists():
                docs.write_file(self.cache_dir, key, (await self.bridge.render(key)).text)
        return self.uri_of(key)

    def col(self, line: str, index: int) -> int:
        return int(self.workspace.position_codec.client_num_units(line[:index]))

    def span(self, rendered: Rendered, line: int, start: int, end: int) -> t.Range:
        lines = rendered.lines
        text = lines[line] if line < len(lines) else ""
        return t.Range(t.Position(line, self.col(text, start)),
                       t.Position(line, self.col(text, end)))

    def index(self, rendered: Rendered, pos: t.Position) -> int:
        lines = rendered.lines
        text = lines[pos.line] if pos.line < len(lines) else ""
        units = 0
        for i, ch in enumerate(text):
            if units >= pos.character:
                return i
            units += self.col(ch, 1)
        return len(text)

    async def location(self, key: DocKey, message_id: int) -> t.Location:
        """Where message `message_id` is: the page starting at it has it on a fixed line."""
        line = docs.FIRST_MESSAGE_LINE if key.start == message_id else 0
        return t.Location(await self.materialize(key),
                          t.Range(t.Position(line, 0), t.Position(line, 0)))

    # progress, one worker so create/begin/report/end keep their order

    def queue_progress(self, token: str, value: dict[str, Any]) -> None:
        if self._progress is None:
            self._progress = asyncio.Queue()
            asyncio.ensure_future(self._progress_worker(self._progress))
        self._progress.put_nowait((token, value))

    async def _progress_worker(self, queue: asyncio.Queue[tuple[str, dict[str, Any]]]) -> None:
        created: set[str] = set()
        while True:
            token, value = await queue.get()
            kind = value.get("kind")
            try:
                if kind == "begin":
                    await self.work_done_progress.create_async(token)
                    created.add(token)
                    self.work_done_progress.begin(token, t.WorkDoneProgressBegin(
                        title=str(value.get("title") or "ctxd: compacting"),
                        message=value.get("message"), percentage=value.get("percentage"),
                        cancellable=False))
                elif token not in created:
                    continue
                elif kind == "report":
                    self.work_done_progress.report(token, t.WorkDoneProgressReport(
                        message=value.get("message"), percentage=value.get("percentage")))
                elif kind == "end":
                    created.discard(token)
                    self.work_done_progress.end(
                        token, t.WorkDoneProgressEnd(message=value.get("message")))
            except Exception as exc:  # the client refused the token: no progress shown
                log.info("progress %s not shown: %s", token, exc)


class EditorUI:
    """What the core asks of the editor, in LSP."""

    def __init__(self, server: CtxdServer) -> None:
        self.server = server

    async def ask_approval(self, approval: dict[str, Any]) -> str | None:
        ls = self.server
        prompt = str(approval["prompt"])
        if not ls.can_ask:
            ls.window_show_message(t.ShowMessageParams(
                t.MessageType.Warning,
                f"{prompt} Answer with the code action 'ctxd: approve' or 'ctxd: deny' "
                f"(on any file), or the command ctxd.resolveApproval "
                f"{{\"approvalId\": \"{approval.get('approvalId')}\", "
                f"\"decision\": \"approved\"}}"))
            return None
        item = await ls.window_show_message_request_async(t.ShowMessageRequestParams(
            t.MessageType.Warning, prompt,
            [t.MessageActionItem("Approve"), t.MessageActionItem("Deny")]))
        if item is None:
            return None
        return {"Approve": "approved", "Deny": "denied"}.get(item.title)

    def show(self, level: str, text: str) -> None:
        kind = {"error": t.MessageType.Error, "warning": t.MessageType.Warning}.get(
            level, t.MessageType.Info)
        self.server.window_show_message(t.ShowMessageParams(kind, text))

    def progress(self, session_id: str, token: str, value: dict[str, Any]) -> None:
        if self.server.can_progress:
            self.server.queue_progress(token, value)

    def status(self, params: dict[str, Any]) -> None:
        self.server.protocol.notify(STATUS_NOTIFICATION, params)

    def documents_changed(self, rendered: list[Rendered]) -> None:
        ls = self.server
        for r in rendered:
            if ls.virtual_docs:
                ls.workspace_text_document_content_refresh(
                    t.TextDocumentContentRefreshParams(r.key.uri()))
            else:
                docs.write_file(ls.cache_dir, r.key, r.text)


# every handler of `ctxd lsp` is registered on this object where it is written
SERVER = CtxdServer()
