"""`ctxd install claude-code|codex`: what it writes into the agents' configs, that it keeps
what was there, adds nothing twice, writes nothing on --dry-run, and that --uninstall
puts every file back byte for byte."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

# as the console script runs it, with this very interpreter
CTXD = [sys.executable, "-m", "ctxd.clients.cli"]

USER_SETTINGS = """{
    "model": "opus",
    "hooks": {
        "PostToolUse": [
            {"matcher": "Edit", "hooks": [{"type": "command", "command": "audit-edit"}]}
        ]
    }
}"""
USER_MCP = '{"mcpServers": {"docs": {"command": "docs-server", "args": []}}}\n'
USER_TOML = """# my Codex settings
model = "o4-mini"   # the fast one

[projects."/work/demo"]
trust_level = "trusted"

[mcp_servers.docs]
command = "docs-server\""""


def _after_mcp(args: list[str]) -> list[str]:
    """The options after `mcp` (before it: `-m ctxd.clients.cli` when ctxd was run so)."""
    assert "mcp" in args
    return args[args.index("mcp") + 1:]


def _run(*args: str, cwd: Path, home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLAUDE_", "CODEX_"))}
    env.update(HOME=str(home), CLAUDE_CONFIG_DIR=str(home / ".claude"),
               CODEX_HOME=str(home / ".codex"))
    return subprocess.run([*CTXD, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=60)


def _dirs(tmp_path: Path) -> tuple[Path, Path]:
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    return home, project


def test_claude_code_project_install_keeps_theirs_and_uninstall_restores(tmp_path: Path) -> None:
    home, project = _dirs(tmp_path)
    settings = project / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text(USER_SETTINGS)
    (project / ".mcp.json").write_text(USER_MCP)
    where = ["--data-dir", str(tmp_path / "data")]

    dry = _run("install", "claude-code", "--scope", "project", "--dry-run", *where,
               cwd=project, home=home)
    assert dry.returncode == 0, dry.stderr
    assert "+" in dry.stdout and "hook claude-code" in dry.stdout
    assert settings.read_text() == USER_SETTINGS  # a dry run writes nothing
    assert (project / ".mcp.json").read_text() == USER_MCP

    done = _run("install", "claude-code", "--scope", "project", *where, cwd=project, home=home)
    assert done.returncode == 0, done.stderr
    data = json.loads(settings.read_text())
    assert data["model"] == "opus"
    post = data["hooks"]["PostToolUse"]
    assert post[0]["hooks"][0]["command"] == "audit-edit"  # theirs, first, untouched
    assert post[1]["matcher"] == "*" and "hook claude-code" in post[1]["hooks"][0]["command"]
    # capture only: Claude Code runs it in the background; SessionStart answers, so it waits
    assert post[1]["hooks"][0]["async"] is True
    assert "async" not in data["hooks"]["SessionStart"][0]["hooks"][0]
    for event in ("SessionStart", "UserPromptSubmit", "Stop", "PreCompact", "SessionEnd"):
        (group,) = data["hooks"][event]
        assert group["hooks"][0]["command"].endswith(
            f"hook claude-code --data-dir {tmp_path / 'data'}")
    servers = json.loads((project / ".mcp.json").read_text())["mcpServers"]
    assert servers["docs"]["command"] == "docs-server"
    assert _after_mcp(servers["ctxd"]["args"]) == where
    assert (settings.parent / "settings.json.ctxd-backup").read_text() == USER_SETTINGS

    installed = settings.read_text()
    again = _run("install", "claude-code", "--scope", "project", *where, cwd=project, home=home)
    assert again.returncode == 0 and again.stdout.count("unchanged") == 2
    assert settings.read_text() == installed

    gone = _run("install", "claude-code", "--scope", "project", "--uninstall", *where,
                cwd=project, home=home)
    assert gone.returncode == 0, gone.stderr
    assert settings.read_text() == USER_SETTINGS
    assert (project / ".mcp.json").read_text() == USER_MCP


def test_claude_code_user_scope_creates_and_removes_its_files(tmp_path: Path) -> None:
    home, project = _dirs(tmp_path)
    done = _run("install", "claude-code", "--scope", "user", cwd=project, home=home)
    assert done.returncode == 0, done.stderr
    settings = home / ".claude" / "settings.json"
    state = home / ".claude" / ".claude.json"  # CLAUDE_CONFIG_DIR holds the user's MCP
    assert set(json.loads(settings.read_text())["hooks"]) == {
        "SessionStart", "UserPromptSubmit", "PostToolUse", "Stop", "PreCompact", "SessionEnd"}
    assert _after_mcp(json.loads(state.read_text())["mcpServers"]["ctxd"]["args"]) == []
    assert not (project / ".claude").exists()
    gone = _run("install", "claude-code", "--scope", "user", "--uninstall", cwd=project,
                home=home)
    assert gone.returncode == 0, gone.stderr
    assert not settings.exists() and not state.exists()


def test_claude_code_refuses_a_broken_settings_file(tmp_path: Path) -> None:
    home, project = _dirs(tmp_path)
    settings = project / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text('{"hooks": ')
    done = _run("install", "claude-code", "--scope", "project", cwd=project, home=home)
    assert done.returncode == 2
    assert "not valid JSON" in done.stderr
    assert settings.read_text() == '{"hooks": '
    assert not (project / ".mcp.json").exists()


def test_codex_install_keeps_comments_and_uninstall_restores_bytes(tmp_path: Path) -> None:
    home, project = _dirs(tmp_path)
    config = home / ".codex" / "config.toml"
    config.parent.mkdir()
    config.write_text(USER_TOML)  # no newline at its end, on purpose
    done = _run("install", "codex", cwd=project, home=home)
    assert done.returncode == 0, done.stderr
    text = config.read_text()
    assert "# my Codex settings" in text and '# the fast one' in text
    data = tomllib.loads(text)
    assert data["model"] == "o4-mini"
    assert data["notify"][-2:] == ["hook", "codex"]
    assert _after_mcp(data["mcp_servers"]["ctxd"]["args"]) == []
    assert data["mcp_servers"]["docs"]["command"] == "docs-server"
    assert data["projects"]["/work/demo"]["trust_level"] == "trusted"
    (post,) = data["hooks"]["PostToolUse"]
    assert post["matcher"] == "*" and post["hooks"][0]["command"].endswith("hook codex")
    again = _run("install", "codex", cwd=project, home=home)
    assert again.returncode == 0 and "unchanged" in again.stdout
    assert config.read_text() == text
    gone = _run("install", "codex", "--uninstall", cwd=project, home=home)
    assert gone.returncode == 0, gone.stderr
    assert config.read_text() == USER_TOML


def test_codex_leaves_a_notify_of_the_users_own(tmp_path: Path) -> None:
    home, project = _dirs(tmp_path)
    config = home / ".codex" / "config.toml"
    config.parent.mkdir()
    mine = 'notify = ["notify-send", "codex"]\n'
    config.write_text(mine)
    done = _run("install", "codex", cwd=project, home=home)
    assert done.returncode == 0, done.stderr
    assert "`notify` is set already" in done.stdout
    data = tomllib.loads(config.read_text())
    assert data["notify"] == ["notify-send", "codex"]
    assert _after_mcp(data["mcp_servers"]["ctxd"]["args"]) == []
    assert "hook codex" in data["hooks"]["Stop"][0]["hooks"][0]["command"]
    gone = _run("install", "codex", "--uninstall", cwd=project, home=home)
    assert gone.returncode == 0
    assert config.read_text() == mine


def test_codex_project_scope_has_hooks_and_no_notify(tmp_path: Path) -> None:
    home, project = _dirs(tmp_path)
    done = _run("install", "codex", "--scope", "project", cwd=project, home=home)
    assert done.returncode == 0, done.stderr
    assert "reads `notify` from the user's config only" in done.stdout
    data = tomllib.loads((project / ".codex" / "config.toml").read_text())
    assert "notify" not in data
    assert set(data["hooks"]) == {"SessionStart", "UserPromptSubmit", "PostToolUse", "Stop",
                                  "PreCompact", "SessionEnd"}
    assert not (home / ".codex" / "config.toml").exists()


def test_codex_on_no_config_creates_one_and_uninstall_removes_it(tmp_path: Path) -> None:
    home, project = _dirs(tmp_path)
    dry = _run("install", "codex", "--dry-run", cwd=project, home=home)
    assert dry.returncode == 0 and "[mcp_servers.ctxd]" in dry.stdout
    config = home / ".codex" / "config.toml"
    assert not config.exists()
    assert _run("install", "codex", cwd=project, home=home).returncode == 0
    assert tomllib.loads(config.read_text())["notify"][-2:] == ["hook", "codex"]
    assert _run("install", "codex", "--uninstall", cwd=project, home=home).returncode == 0
    assert not config.exists()
