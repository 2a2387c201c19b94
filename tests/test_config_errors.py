"""Configuration and start-up mistakes: one line naming the file (or variable), the key
and what is expected; exit code 2; never a traceback. The CLI runs as a subprocess."""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

TIMEOUT = 60


def ctxd(tmp_path: Path, *args: str, env: dict[str, str] | None = None,
         preexec: object = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("CTXD_") or k == "CTXD_LOG_LEVEL"}
    base["CTXD_RUNTIME_DIR"] = str(tmp_path / "run")
    return subprocess.run([sys.executable, "-m", "ctxd.daemon", *args],
                          env={**base, **(env or {})}, capture_output=True, text=True,
                          timeout=TIMEOUT, preexec_fn=preexec)  # type: ignore[arg-type]


def one_line_error(result: subprocess.CompletedProcess[str], *parts: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("ctxd: ")
    for part in parts:
        assert part in line, (part, line)
    return line


@pytest.mark.parametrize(("toml", "parts"), [
    ('summarizr = "openai"\n', ["unknown key summarizr", "did you mean summarizer"]),
    ("[compaction]\nmax_active_mesages = 3\n",
     ["unknown key compaction.max_active_mesages", "max_active_messages"]),
    ("port = \n", ["not valid TOML", "line 1"]),
    ('port = "eighty"\n', ["port: expected an integer", "'eighty'"]),
    ("[compaction]\nmax_active_messages = -5\n", ["max_active_messages", "at least 0"]),
    ('durability = "fast"\n', ["durability: expected one of 'normal', 'full'"]),
    ("compaction = 3\n", ["compaction: expected a table"]),
    ("[compaction]\nmax_active_messages = 10\nkeep_messages = 24\n",
     ["max_active_messages (10) is below", "keep_messages (24)"]),
])
def test_config_file_mistakes(tmp_path: Path, toml: str, parts: list[str]) -> None:
    path = tmp_path / "my-ctxd.toml"
    path.write_text(toml)
    result = ctxd(tmp_path, "serve", "--data-dir", str(tmp_path / "data"), "--config", str(path))
    one_line_error(result, str(path), *parts)
    assert not (tmp_path / "data" / "ctxd.db").exists()


def test_a_missing_config_file(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.toml"
    one_line_error(ctxd(tmp_path, "serve", "--config", str(missing)), str(missing),
                   "no such configuration file", "--config")
    one_line_error(ctxd(tmp_path, "status", env={"CTXD_CONFIG": str(missing)}),
                   str(missing), "CTXD_CONFIG")


def test_other_commands_report_config_mistakes_the_same_way(tmp_path: Path) -> None:
    path = tmp_path / "my-ctxd.toml"
    path.write_text('summarizr = "openai"\n')
    for command in ("config", "status", "sessions"):
        one_line_error(ctxd(tmp_path, command, "--config", str(path)), str(path),
                       "unknown key summarizr")


def test_environment_variable_mistakes(tmp_path: Path) -> None:
    for command in ("serve", "status"):
        one_line_error(
            ctxd(tmp_path, command, "--data-dir", str(tmp_path / "data"),
                 env={"CTXD_MAX_ACTIVE_MESSAGES": "abc"}),
            "environment variable CTXD_MAX_ACTIVE_MESSAGES",
            "compaction.max_active_messages", "expected an integer", "'abc'")
    one_line_error(ctxd(tmp_path, "serve", env={"CTXD_KEEP_MESSAGES": "500"}),
                   "max_active_messages (80) is below", "keep_messages (500)")


def test_a_data_dir_that_cannot_be_used(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    one_line_error(ctxd(tmp_path, "serve", "--data-dir", str(afile)), str(afile),
                   "not a directory")
    one_line_error(ctxd(tmp_path, "serve", "--data-dir", str(afile / "sub")),
                   str(afile / "sub"))


@pytest.mark.parametrize("limit", [0, 100_000])
def test_a_full_disk_at_start(tmp_path: Path, limit: int) -> None:
    """RLIMIT_FSIZE makes every write past `limit` bytes fail, as a full disk does."""

    def small_disk() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

    data = tmp_path / "data"
    line = one_line_error(ctxd(tmp_path, "serve", "--data-dir", str(data),
                               preexec=small_disk), str(data))
    assert "free space" in line


def test_a_full_disk_under_the_runtime_dir(tmp_path: Path) -> None:
    """The data dir has room but the connection file's disk is full: a tmpfs of 64 KiB
    filled to the last byte (the suite runs as root, as CI does; mounting is a test step
    that must work, not a reason to skip)."""
    full = tmp_path / "full"
    full.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(full)],
                   check=True, capture_output=True, timeout=30)
    try:
        fd = os.open(full / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        with contextlib.suppress(OSError):
            while os.write(fd, b"\0" * 512):
                pass
        os.close(fd)
        line = one_line_error(
            ctxd(tmp_path, "serve", "--data-dir", str(tmp_path / "data"),
                 "--connection-file", str(full / "ctxd.json")),
            str(full / "ctxd.json"))
        assert "No space left on device" in line and "free space" in line
    finally:
        subprocess.run(["umount", str(full)], capture_output=True, timeout=30)
