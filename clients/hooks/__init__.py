"""Live capture from coding agents through their own extension points: `ctxd hook
claude-code` (Claude Code's hooks) and `ctxd hook codex` (Codex's `notify` program and
its hooks). See docs/agents.md."""
