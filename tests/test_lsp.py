"""`ctxd lsp` driven by pygls's own LanguageClient against a real daemon process."""

from __future__ import annotations

import ast
import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import DaemonProcess, agent_turn
from lsp_harness import Editor, lsp_command
from lsprotocol import types as t
from pygls.exceptions import JsonRpcException
from pygls.uris import to_fs_path

from ctxd.clients.lsp import documents as docs


@pytest.fixture
def daemon(tmp_path: Path):
    d = DaemonProcess(tmp_path).start()
    yield d
    d.stop()


def _seed(daemon: DaemonProcess, turns: int = 8, title: str = "demo") -> str:
    with daemon.client("jsonrpc") as c:
        sid = c.create_session(title=title)["sessionId"]
        for i in range(turns):
            c.append(sid, agent_turn(i))
        c.append(sid, [{"role": "user", "content": "别再修改生产数据库的配置"},
                       {"role": "assistant", "content": "Understood: the staging database only."}])
    return str(sid)


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


def test_symbols_documents_links_hover(daemon: DaemonProcess, tmp_path: Path) -> None:
    sid = _seed(daemon)
    with daemon.client("jsonrpc") as c:
        c.compact(sid, force=True)

    async def go() -> None:
        ed = Editor()
        init = await ed.start(daemon, tmp_path / "cache")
        assert list(init.capabilities.workspace.text_document_content.schemes) == ["ctxd"]
        commands = set(init.capabilities.execute_command_provider.commands)
        assert {"ctxd.compact", "ctxd.rebuild", "ctxd.pin", "ctxd.unpin", "ctxd.openSession",
                "ctxd.chooseSession"} <= commands
        await ed.connected()
        try:
            assert await ed.symbols("") == []
            zh = await ed.symbols("生产数据库")
            assert len(zh) == 1 and "生产数据库" in zh[0].name and "demo" in zh[0].container_name
            en = await ed.symbols("staging database")
            assert [s.name for s in en] == ["Understood: the staging database only."]
            loc = en[0].location
            assert docs.parse_uri(loc.uri).session_id == sid
            text = await ed.content(loc.uri)
            line = text.split("\n")[loc.range.start.line]
            assert line.startswith("## #") and "assistant" in line
            assert "the staging database only" in text.split("\n")[loc.range.start.line + 1]

            ctx_uri = f"ctxd:/sessions/{sid}/context.md"
            ctx = await ed.content(ctx_uri)
            assert "## Summary" in ctx and "## Tail" in ctx and "## Pins (0)" in ctx
            links = await ed.client.text_document_document_link_async(
                t.DocumentLinkParams(t.TextDocumentIdentifier(ctx_uri)))
            ctx_lines = ctx.split("\n")
            summary_at = ctx_lines.index(next(x for x in ctx_lines if x.startswith("## Summary")))
            pointer = next(lk for lk in links if lk.range.start.line > summary_at)
            span = ctx_lines[pointer.range.start.line][
                pointer.range.start.character:pointer.range.end.character]
            assert span.startswith("#") and span[1:].isdigit()
            cited = int(span[1:])
            assert pointer.target == docs.page_of(sid, cited).uri()
            where = await ed.client.text_document_definition_async(t.DefinitionParams(
                t.TextDocumentIdentifier(ctx_uri), pointer.range.start))
            page = await ed.content(where.uri)
            assert page.split("\n")[where.range.start.line].startswith(f"## #{cited} ")
            hover = await ed.client.text_document_hover_async(t.HoverParams(
                t.TextDocumentIdentifier(ctx_uri), pointer.range.start))
            assert f"#{cited}" in hover.contents.value
            cited_text = page.split("\n")[where.range.start.line + 1]
            assert cited_text[:20] in hover.contents.value

            with pytest.raises(JsonRpcException) as err:
                await ed.content("ctxd:/sessions/nope/context.md")
            assert err.value.code == -32010
            # live: an append elsewhere refreshes the documents the editor has read
            with daemon.client("jsonrpc") as c:
                c.append(sid, [{"role": "user", "content": "one more thing"}])
            await ed.wait(lambda: ctx_uri in ed.refreshed)
            assert "one more thing" in await ed.content(ctx_uri)
        finally:
            assert await ed.stop() == 0

    _run(go())


def test_file_documents_kept_current_and_paged(daemon: DaemonProcess, tmp_path: Path) -> None:
    """Without ctxd: URIs, documents are read-only files; a long transcript is paged."""
    with daemon.client("jsonrpc") as c:
        sid = c.create_session(title="long")["sessionId"]
        for start in range(0, 450, 150):
            c.append(sid, [{"role": "user", "content": f"note {i} about kiwis"}
                           for i in range(start, start + 150)])
    cache = tmp_path / "cache"

    async def go() -> None:
        ed = Editor(virtual_docs=False)
        init = await ed.start(daemon, cache)
        assert init.capabilities.workspace.text_document_content is None
        await ed.connected()
        try:
            opened = await ed.command("ctxd.openSession", {"sessionId": sid,
                                                           "document": "transcript"})
            assert ed.shown == [opened["uri"]] and opened["uri"].startswith("file:")
            path = Path(to_fs_path(opened["uri"]))
            assert cache in path.parents and path.stat().st_mode & 0o222 == 0
            first = path.read_text()
            assert first.count("\n## #") == docs.PAGE_SIZE and "note 0 about" in first
            assert f"note {docs.PAGE_SIZE} about" not in first
            links = await ed.client.text_document_document_link_async(
                t.DocumentLinkParams(t.TextDocumentIdentifier(opened["uri"])))
            nxt = Path(to_fs_path(links[-1].target))
            assert f"note {docs.PAGE_SIZE} about" in nxt.read_text()

            hits = await ed.symbols("note 420 kiwis")
            assert len(hits) == 1
            target = Path(to_fs_path(hits[0].location.uri))
            line = target.read_text().split("\n")[hits[0].location.range.start.line + 1]
            assert line == "note 420 about kiwis"

            ctx = await ed.command("ctxd.openSession", sid)
            ctx_path = Path(to_fs_path(ctx["uri"]))
            assert "note 449 about kiwis" in ctx_path.read_text()
            with daemon.client("jsonrpc") as c:
                c.append(sid, [{"role": "user", "content": "kept current: 新的消息"}])
            await ed.wait(lambda: "新的消息" in ctx_path.read_text())
        finally:
            await ed.stop()

    _run(go())


def test_approvals_from_another_client(daemon: DaemonProcess, tmp_path: Path) -> None:
    sid = _seed(daemon, 2)
    with daemon.client("jsonrpc") as agent:
        run = agent.start_run(sid)["runId"]

        def request(call_id: str) -> str:
            agent.append(sid, [{"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function", "function": {
                    "name": "drop_table", "arguments": '{"table": "users"}'}}]}], run_id=run)
            return str(agent.request_approval(sid, run, call_id, "drop_table",
                                              {"table": "users", "pad": "x" * 5000})["approvalId"])

        gate = asyncio.Event()

        async def answer(p: t.ShowMessageRequestParams) -> t.MessageActionItem:
            if "late" in ed.__dict__:
                await gate.wait()  # a slower human: another client answers first
            return t.MessageActionItem("Approve")

        ed = Editor(answer=answer)

        async def go() -> None:
            await ed.start(daemon, tmp_path / "cache")
            await ed.connected()
            try:
                aid = await asyncio.to_thread(request, "c1")
                await ed.wait(lambda: any(a["approvalId"] == aid and a["status"] == "approved"
                                          for a in agent.list_approvals(sid)["approvals"]))
                assert "drop_table" in ed.asked[0] and len(ed.asked[0]) < 600
                await ed.wait(lambda: any("drop_table approved" in m for m in ed.messages))

                ed.__dict__["late"] = True
                aid2 = await asyncio.to_thread(request, "c2")
                await ed.wait(lambda: len(ed.asked) == 2)
                await asyncio.to_thread(agent.resolve_approval, aid2, "denied", "not today")
                gate.set()
                msg = await ed.wait(lambda: next(
                    (m for m in ed.messages if "another client answered first" in m), None))
                assert "denied" in msg and "not today" in msg
                statuses = {a["approvalId"]: a["status"]
                            for a in agent.list_approvals(sid)["approvals"]}
                assert statuses == {aid: "approved", aid2: "denied"}
            finally:
                await ed.stop()

        _run(go())


def test_no_show_message_request_falls_back(daemon: DaemonProcess, tmp_path: Path) -> None:
    sid = _seed(daemon, 1)

    async def go() -> None:
        ed = Editor(can_ask=False)
        await ed.start(daemon, tmp_path / "cache")
        await ed.connected()
        try:
            with daemon.client("jsonrpc") as agent:
                run = agent.start_run(sid)["runId"]
                agent.append(sid, [{"role": "assistant", "content": None, "tool_calls": [
                    {"id": "k", "type": "function",
                     "function": {"name": "rm", "arguments": "{}"}}]}], run_id=run)
                aid = agent.request_approval(sid, run, "k", "rm", {})["approvalId"]
                msg = await ed.wait(lambda: next((m for m in ed.messages if aid in m), None))
                assert ed.asked == [] and "ctxd.resolveApproval" in msg

                async def approval_actions() -> list[dict]:
                    got = await ed.client.text_document_code_action_async(t.CodeActionParams(
                        t.TextDocumentIdentifier(f"ctxd:/sessions/{sid}/context.md"),
                        t.Range(t.Position(0, 0), t.Position(0, 0)), t.CodeActionContext([])))
                    return [code_action_command(a) for a in got or []
                            if a.title.startswith(("ctxd: approve", "ctxd: deny"))]

                actions = await approval_actions()
                assert [a["arguments"][0]["decision"] for a in actions] == ["approved", "denied"]
                deny = actions[1]
                out = await ed.command(deny["command"], *deny["arguments"])
                assert out["status"] == "denied"
                assert await approval_actions() == []
                assert agent.list_approvals(sid)["approvals"][0]["status"] == "denied"
        finally:
            await ed.stop()

    _run(go())


def test_cli_compaction_shows_progress_and_status(daemon: DaemonProcess, tmp_path: Path) -> None:
    sid = _seed(daemon, 10)

    async def go() -> None:
        ed = Editor()
        await ed.start(daemon, tmp_path / "cache")
        first = await ed.connected()
        try:
            assert first["sessionId"] == sid and first["compactionCount"] == 0
            cli = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "ctxd.clients.cli", "compact", sid, "--force",
                "--connection-file", str(daemon.connection_file), env=daemon.env,
                stdout=subprocess.DEVNULL)
            assert await cli.wait() == 0
            await ed.wait(lambda: any(v.get("kind") == "end" for _, v in ed.progress))
            kinds = [v["kind"] for _, v in ed.progress]
            assert kinds[0] == "begin" and kinds[-1] == "end"
            assert {tok for tok, _ in ed.progress} <= set(ed.created)
            status = await ed.wait(lambda: next(
                (s for s in ed.status if s.get("compactionCount") == 1), None))
            assert status["lastCompactedAt"] and status["activeMessages"] < 42
        finally:
            await ed.stop()

    _run(go())


def test_commands_actions_and_lenses(daemon: DaemonProcess, tmp_path: Path) -> None:
    sid = _seed(daemon, 3)
    work = tmp_path / "work"
    (work / "src").mkdir(parents=True)
    touched = work / "src" / "mod1.py"
    touched.write_text("def handler(x):\n    return x * 2\n")
    untouched = work / "src" / "other.py"
    untouched.write_text("pass\n")

    async def go() -> None:
        ed = Editor()
        await ed.start(daemon, tmp_path / "cache", root=work)
        await ed.connected()
        c = ed.client
        try:
            for f in (touched, untouched):
                c.text_document_did_open(t.DidOpenTextDocumentParams(t.TextDocumentItem(
                    f.as_uri(), "python", 1, f.read_text())))
            lens = await c.text_document_code_lens_async(
                t.CodeLensParams(t.TextDocumentIdentifier(touched.as_uri())))
            assert len(lens) == 1 and lens[0].command.title.startswith("ctxd: 1 session, last")
            assert not await c.text_document_code_lens_async(
                t.CodeLensParams(t.TextDocumentIdentifier(untouched.as_uri())))
            hist = await ed.command(lens[0].command.command, *lens[0].command.arguments)
            assert hist["sessions"] == 1 and ed.shown[-1].startswith("ctxd:/search.md")
            assert "src/mod1.py" in await ed.content(ed.shown[-1])

            actions = await c.text_document_code_action_async(t.CodeActionParams(
                t.TextDocumentIdentifier(touched.as_uri()),
                t.Range(t.Position(1, 4), t.Position(1, 16)), t.CodeActionContext([])))
            pin = code_action_command(next(a for a in actions
                                           if a.title == "Pin to agent context"))
            assert pin["command"] == "ctxd.pin"
            await ed.command(pin["command"], *pin["arguments"])
            with daemon.client("jsonrpc") as cl:
                pins = cl.list_pins(sid)["pins"]
            assert [p["text"] for p in pins] == ["return x * 2"]

            ctx_uri = f"ctxd:/sessions/{sid}/context.md"
            lenses = await c.text_document_code_lens_async(
                t.CodeLensParams(t.TextDocumentIdentifier(ctx_uri)))
            titles = {ln.command.title for ln in lenses}
            assert {"Compact", "Rebuild", "Open transcript", "Unpin"} <= titles
            unpin = next(ln for ln in lenses if ln.command.title == "Unpin")
            await ed.command(unpin.command.command, *unpin.command.arguments)
            with daemon.client("jsonrpc") as cl:
                assert cl.list_pins(sid)["pins"] == []
            out = await ed.command("ctxd.compact", {"sessionId": sid,
                                                    "instructions": "keep the file names"})
            assert out["effective"] is True
            out = await ed.command("ctxd.rebuild", sid)
            assert out["trigger"] == "rebuild"

            other = _seed(daemon, 1, title="other")
            chosen = await ed.command("ctxd.chooseSession", other)
            assert chosen["title"] == "other"
            with pytest.raises(JsonRpcException) as err:
                await ed.command("ctxd.chooseSession", "ses_missing")
            assert err.value.code == -32010
            st = await ed.wait(lambda: next(
                (s for s in reversed(ed.status) if s.get("sessionId")), None))
            assert st["sessionId"] == other
            with pytest.raises(JsonRpcException) as err:
                await ed.command("ctxd.compact", {"sessionId": sid}, {"x": 1})
            assert err.value.code == -32602
            with pytest.raises(JsonRpcException) as err:
                await ed.command("ctxd.openSession", {"sessionId": sid, "document": "diff"})
            assert err.value.code == -32602
        finally:
            await ed.stop()

    _run(go())


def code_action_command(action: t.CodeAction | t.Command) -> dict:
    """The command of a code action as the server sent it. pygls's client decodes the
    `(Command | CodeAction)[]` union as Command and keeps the CodeAction's command object
    as its repr in `command`: read it back from there."""
    if isinstance(action, t.CodeAction):
        return {"command": action.command.command, "arguments": action.command.arguments}
    assert isinstance(action.command, str) and action.command.startswith("{")
    return ast.literal_eval(action.command)


def _frame(body: bytes) -> bytes:
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def _read_frame(stream) -> dict:
    import json

    header = b""
    while not header.endswith(b"\r\n\r\n"):
        ch = stream.read(1)
        assert ch, "the server closed stdout"
        header += ch
    n = int(header.split(b":")[1].split(b"\r")[0])
    return json.loads(stream.read(n))


def test_positional_params_typed_errors_and_exit_on_stdin_close(
        daemon: DaemonProcess, tmp_path: Path) -> None:
    proc = subprocess.Popen(lsp_command(daemon, tmp_path / "cache"), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=daemon.env)
    try:
        send = [b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"capabilities":{}}}',
                b'{"jsonrpc":"2.0","method":"initialized","params":{}}',
                b'{"jsonrpc":"2.0","id":2,"method":"workspace/symbol","params":[]}',
                b'{"jsonrpc":"2.0","id":3,"method":"workspace/executeCommand","params":[]}',
                b'{"jsonrpc":"2.0","id":4,"method":"workspace/symbol"}',
                b'{"jsonrpc":"2.0","id":5,"method":"workspace/executeCommand",'
                b'"params":{"command":"ctxd.rebuild"}}',
                b'{"jsonrpc":"2.0","id":6,"method":"workspace/symbol","params":{"query":"zz"}}']
        for body in send:
            proc.stdin.write(_frame(body))
        proc.stdin.flush()
        replies = {}
        while len(replies) < 6:
            msg = _read_frame(proc.stdout)
            if "id" in msg:
                replies[msg["id"]] = msg
        for i in (2, 3, 4):
            assert replies[i]["error"]["code"] == -32602
        # no session exists yet: a clear typed error, not a crash
        assert replies[5]["error"]["code"] == -32602
        assert "sessionId" in replies[5]["error"]["message"]
        assert replies[6]["result"] == []
        proc.stdin.close()
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
        proc.stderr.close()


def test_daemon_gone_then_back(daemon: DaemonProcess, tmp_path: Path) -> None:
    sid = _seed(daemon, 1)

    async def go() -> None:
        ed = Editor()
        await ed.start(daemon, tmp_path / "cache")
        await ed.connected()
        try:
            assert len(await ed.symbols("staging")) == 1
            await asyncio.to_thread(daemon.kill)
            await ed.wait(lambda: any("lost the daemon" in m for m in ed.messages))
            with pytest.raises(JsonRpcException) as err:
                await ed.symbols("staging")
            assert err.value.code == -32803 and "reconnect" in err.value.message
            assert ed.status[-1]["connected"] is False
            await asyncio.to_thread(daemon.start)
            await ed.wait(lambda: any("connected to the daemon again" in m for m in ed.messages))
            assert len(await ed.symbols("staging")) == 1
            # events of the new daemon flow again
            with daemon.client("jsonrpc") as c:
                c.append(sid, [{"role": "user", "content": "after the restart"}])
            await ed.wait(lambda: any(s.get("archiveMessages") == 7 for s in ed.status))
        finally:
            await ed.stop()

    _run(go())


def test_starts_the_daemon_when_none_runs(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path)  # not started: `ctxd lsp` starts it

    async def go() -> None:
        ed = Editor()
        await ed.start(daemon, tmp_path / "cache")
        try:
            await ed.connected()
            assert daemon.connection_file.exists()
            assert await ed.symbols("anything") == []
        finally:
            await ed.stop()
            with daemon.client("jsonrpc") as c:
                c.call("shutdown", {})
            deadline = time.monotonic() + 10
            while daemon.connection_file.exists() and time.monotonic() < deadline:
                time.sleep(0.05)

    _run(go())


def test_tcp_for_debugging(daemon: DaemonProcess, tmp_path: Path) -> None:
    import socket

    _seed(daemon, 1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([*lsp_command(daemon, tmp_path / "cache"), "--tcp", "--port",
                             str(port)], env=daemon.env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    async def go() -> None:
        ed = Editor()
        deadline = time.monotonic() + 20
        while True:
            try:
                await ed.client.start_tcp("127.0.0.1", port)
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline
                await asyncio.sleep(0.05)
        await ed.client.initialize_async(t.InitializeParams(
            capabilities=ed.capabilities(), process_id=None))
        ed.client.initialized(t.InitializedParams())
        await ed.connected()
        hits = await ed.symbols("staging")
        assert len(hits) == 1 and "staging" in hits[0].name
        await ed.client.shutdown_async(None)
        ed.client.exit(None)
        await ed.client.stop()

    try:
        _run(go())
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
