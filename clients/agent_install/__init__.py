"""`ctxd install claude-code|codex`: write ctxd's hooks and MCP server entry into an
agent's own configuration, keeping what was there (docs/agents.md)."""
