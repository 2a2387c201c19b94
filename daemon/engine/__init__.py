"""The engine: sessions, appends, reads, runs and approvals over one store.

`core` holds the `Engine` class (sessions, appends, status); `reads`, `runs` and
`compaction_calls` are its parts for the model input, archive and search, for runs and
approvals, and for the compaction entry points; `context_view`, `run_book` and
`archive_sizes` are what it keeps between requests. `Engine` is re-exported here:
`from ctxd.daemon.engine import Engine`.
"""

from ctxd.daemon.engine.core import Engine

__all__ = ["Engine"]
