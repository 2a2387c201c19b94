"""The `ctxd` commands by job; clients/cli/parser.py registers them with the parser."""
