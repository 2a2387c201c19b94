"""What `ctxd import` prints on real transcripts: a progress line on a terminal, a
summary, details only under --verbose, and nothing "still being written" for a
transcript at rest."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import DaemonProcess
from import_real import (
    CC,
    CODEX,
    archive,
    copy_at_rest,
    import_json,
    records,
    run_import,
    sessions_by_path,
)

from ctxd.clients.client import Client


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path_factory.mktemp("import-output")).start()
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> Iterator[Client]:
    with daemon.client() as c:
        yield c


# what the command prints


def test_output_is_a_summary_with_details_under_verbose(daemon: DaemonProcess, client: Client,
                                                        tmp_path: Path) -> None:
    folder = tmp_path / "out"
    for src in sorted(CC.glob("*.jsonl")):
        copy_at_rest(src, folder / f"copy-{src.name}")
    r = run_import(daemon, "claude-code", str(folder))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    m = re.fullmatch(r"imported (\d+) messages into (\d+) sessions \((\d+) new\) from (\d+) "
                     r"files; (\d+) lines read, (\d+) skipped(, \d+ messages? repaired)?",
                     lines[0])
    assert m, lines
    by_path = sessions_by_path(client)
    mine = [s for p, s in by_path.items() if Path(p).parent == folder.resolve()]
    assert int(m.group(4)) == len(mine) == len(list(CC.glob("*.jsonl")))
    stored = sum(len(archive(client, s["sessionId"])) for s in client.list_sessions(
        limit=200)["sessions"] if str(Path(s["metadata"].get("sourcePath", "/")).parent)
        == str(folder.resolve()))
    assert int(m.group(1)) == stored
    assert int(m.group(5)) == sum(len(p.read_text().splitlines()) for p in folder.iterdir())
    # no line-by-line diagnostics, nothing "still being written" for finished transcripts
    assert not [ln for ln in lines if ".jsonl:" in ln]
    assert "still being written" not in r.stdout and len(lines) <= 2
    # under --verbose, the details (a re-import reads nothing new: a grown copy does)
    grown = folder / "copy-reliability-hello-world-script.jsonl"
    extra = dict(next(x for x in records(grown) if x.get("type") == "user"), uuid="v1",
                 type="some-new-record")
    with open(grown, "a", encoding="utf-8") as f:
        f.write(json.dumps(extra) + "\n")
    r = run_import(daemon, "claude-code", str(folder), "--verbose")
    assert f"{grown}:{len(grown.read_text().splitlines())}: unknown line type " \
           "'some-new-record'" in r.stdout


def test_old_transcripts_are_never_still_being_written(daemon: DaemonProcess, client: Client,
                                                       tmp_path: Path) -> None:
    # which real rollouts end on a tool call waiting for its output
    fresh = tmp_path / "fresh"
    for src in CODEX.glob("*.jsonl"):
        fresh.mkdir(exist_ok=True)
        shutil.copyfile(src, fresh / f"fresh-{src.name}")
    now = import_json(daemon, "codex", str(fresh))
    assert now["deferred"] >= 1  # written a moment ago: its writer may still be on it
    old = tmp_path / "old"
    for src in CODEX.glob("*.jsonl"):
        copy_at_rest(src, old / f"old-{src.name}")
    rest = import_json(daemon, "codex", str(old))
    assert rest["deferred"] == 0
    assert rest["messages"] == now["messages"] + now["deferred"]
    r = run_import(daemon, "codex", str(old))  # nothing new, and nothing unfinished
    assert r.returncode == 0 and "still being written" not in r.stdout


@pytest.mark.parametrize("fmt", ["claude-code", "codex"])
def test_every_record_of_the_real_transcripts_is_known(daemon: DaemonProcess, tmp_path: Path,
                                                       fmt: str) -> None:
    # the agents' own bookkeeping records are skipped as such, not reported as unknown
    src = CC if fmt == "claude-code" else CODEX
    for f in src.glob("*.jsonl"):
        copy_at_rest(f, tmp_path / f"known-{f.name}")
    report = import_json(daemon, fmt, str(tmp_path))
    assert report["files"] == len(list(src.glob("*.jsonl")))
    assert report["unmappable"] == {} and sum(report["skipped"].values()) > 0


def test_progress_is_one_line_rewritten_on_a_terminal(daemon: DaemonProcess,
                                                      tmp_path: Path) -> None:
    folder = tmp_path / "tty"
    for src in sorted(CC.glob("reliability-*.jsonl")):
        copy_at_rest(src, folder / src.name)
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ctxd.clients.cli", "import", "claude-code", str(folder),
             "--connection-file", str(daemon.connection_file)],
            env=daemon.env, stdout=subprocess.PIPE, stderr=slave, text=True)
        os.close(slave)
        seen = b""
        while True:
            ready, _, _ = select.select([master], [], [], 60)
            assert ready, "no output on the terminal"
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the other end closed
                break
            if not chunk:
                break
            seen += chunk
        out, _ = proc.communicate(timeout=60)
    finally:
        os.close(master)
    assert proc.returncode == 0
    shown = seen.decode()
    n = len(list(folder.glob("*.jsonl")))
    # one line, rewritten: carriage returns and no newline, one update per file, cleared
    assert "\n" not in shown
    assert [f"importing {i}/{n}" in shown for i in range(1, n + 1)] == [True] * n
    assert shown.endswith("\r\x1b[K")
    assert out.startswith("imported ") and "\r" not in out
