"""Drive `ctxd lsp` as a subprocess with pygls's own LanguageClient, against a real daemon."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from helpers import DaemonProcess
from lsprotocol import types as t
from pygls.lsp.client import LanguageClient


def lsp_command(daemon: DaemonProcess, cache_dir: Path) -> list[str]:
    return [sys.executable, "-m", "ctxd.clients.cli", "lsp", "--connection-file",
            str(daemon.connection_file), "--data-dir", str(daemon.data_dir),
            "--cache-dir", str(cache_dir)]


def plain(value: Any) -> Any:
    """pygls hands custom params over as named tuples: make them dicts again."""
    if hasattr(value, "_asdict"):
        value = value._asdict()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


class Editor:
    """A pygls LanguageClient that records what the server sends and answers prompts."""

    def __init__(self, *, virtual_docs: bool = True, can_ask: bool = True,
                 answer: Callable[[t.ShowMessageRequestParams], Any] | None = None) -> None:
        self.client = LanguageClient("ctxd-test-editor", "1")
        self.virtual_docs = virtual_docs
        self.can_ask = can_ask
        self.answer = answer or (lambda p: t.MessageActionItem("Approve"))
        self.messages: list[str] = []
        self.asked: list[str] = []
        self.progress: list[tuple[str, dict[str, Any]]] = []
        self.created: list[str] = []
        self.status: list[dict[str, Any]] = []
        self.shown: list[str] = []
        self.refreshed: list[str] = []
        c = self.client

        @c.feature(t.WINDOW_SHOW_MESSAGE)
        def show_message(p: t.ShowMessageParams) -> None:
            self.messages.append(p.message)

        @c.feature(t.WINDOW_SHOW_MESSAGE_REQUEST)
        async def ask(p: t.ShowMessageRequestParams) -> Any:
            self.asked.append(p.message)
            result = self.answer(p)
            return await result if asyncio.iscoroutine(result) else result

        @c.feature(t.WINDOW_WORK_DONE_PROGRESS_CREATE)
        def create(p: t.WorkDoneProgressCreateParams) -> None:
            self.created.append(str(p.token))

        @c.feature(t.PROGRESS)
        def progress(p: Any) -> None:
            self.progress.append((str(p.token), plain(p.value)))

        @c.feature("ctxd/status")
        def status(p: Any) -> None:
            self.status.append(plain(p))

        @c.feature(t.WINDOW_SHOW_DOCUMENT)
        def show_document(p: t.ShowDocumentParams) -> t.ShowDocumentResult:
            self.shown.append(p.uri)
            return t.ShowDocumentResult(True)

        @c.feature(t.WORKSPACE_TEXT_DOCUMENT_CONTENT_REFRESH)
        def refresh(p: t.TextDocumentContentRefreshParams) -> None:
            self.refreshed.append(p.uri)

    def capabilities(self) -> t.ClientCapabilities:
        return t.ClientCapabilities(
            workspace=t.WorkspaceClientCapabilities(
                text_document_content=t.TextDocumentContentClientCapabilities()
                if self.virtual_docs else None),
            window=t.WindowClientCapabilities(
                show_message=t.ShowMessageRequestClientCapabilities() if self.can_ask else None,
                work_done_progress=True,
                show_document=t.ShowDocumentClientCapabilities(True)))

    async def start(self, daemon: DaemonProcess, cache_dir: Path,
                    root: Path | None = None) -> t.InitializeResult:
        cmd = lsp_command(daemon, cache_dir)
        await self.client.start_io(*cmd, env=daemon.env)
        result = await self.client.initialize_async(t.InitializeParams(
            capabilities=self.capabilities(), root_uri=(root or cache_dir).as_uri(),
            process_id=None))
        self.client.initialized(t.InitializedParams())
        self.result = result
        return result

    async def wait(self, what: Callable[[], Any], timeout: float = 15.0) -> Any:
        async with asyncio.timeout(timeout):
            while not (value := what()):
                await asyncio.sleep(0.02)
        return value

    async def connected(self) -> dict[str, Any]:
        """Until the server has reached the daemon: its `ctxd/status` says connected."""
        return await self.wait(lambda: next(
            (s for s in reversed(self.status) if s.get("connected")), None), 20.0)

    async def command(self, name: str, *args: Any) -> Any:
        return plain(await self.client.workspace_execute_command_async(
            t.ExecuteCommandParams(name, list(args))))

    async def content(self, uri: str) -> str:
        result = await self.client.protocol.send_request_async(
            t.WORKSPACE_TEXT_DOCUMENT_CONTENT, t.TextDocumentContentParams(uri))
        return str(result.text)

    async def symbols(self, query: str) -> list[t.SymbolInformation]:
        return list(await self.client.workspace_symbol_async(t.WorkspaceSymbolParams(query=query))
                    or [])

    async def stop(self) -> int | None:
        try:
            async with asyncio.timeout(10):
                await self.client.shutdown_async(None)
                self.client.exit(None)
        except (TimeoutError, Exception):
            pass
        server = self.client._server
        try:
            async with asyncio.timeout(10):
                await self.client.stop()
        except TimeoutError:
            if server is not None and server.returncode is None:
                server.kill()
        return server.returncode if server is not None else None
