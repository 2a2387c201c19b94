"""The `ctxd` commands by job; clients/commands.py registers them with the parser."""
