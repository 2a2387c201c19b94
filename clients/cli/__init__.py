"""The `ctxd` command.

`entry` builds the parser and runs a command (the daemon, the stdio bridge, the
configuration); `parser` registers the commands built on the Python client, whose bodies
are in `commands/` by job; `text` makes what the CLI prints safe for a terminal.
`main` and `build_parser` are re-exported: the console script is `ctxd.clients.cli:main`.
"""

from ctxd.clients.cli.entry import build_parser, main

__all__ = ["build_parser", "main"]
