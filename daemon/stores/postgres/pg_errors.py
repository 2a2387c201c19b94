"""PostgreSQL's failures as ctxd's typed errors: the server's and the connection's
(`StorageError`), a bound reached (`StorageTimeout`), a duplicate key another daemon
wrote at the same moment (`Conflict`)."""

from __future__ import annotations

import psycopg
from psycopg import errors as pgerr

from ctxd.protocol.errors import Conflict, StorageError, StorageTimeout


def _storage(exc: Exception) -> StorageError:
    if isinstance(exc, pgerr.DiskFull):
        what = "the database server's disk is full"
    elif isinstance(exc, pgerr.ReadOnlySqlTransaction):
        what = "the database is read-only (a standby, or default_transaction_read_only)"
    elif isinstance(exc, psycopg.OperationalError):
        what = f"the PostgreSQL server cannot be reached ({str(exc).strip() or type(exc).__name__})"
    else:
        what = f"the database could not be written ({type(exc).__name__}: {exc})"
    return StorageError(
        f"{what}; nothing was written: fix it and send the request again",
        {"reason": type(exc).__name__},
    )


_STORAGE = (psycopg.OperationalError, pgerr.DiskFull, pgerr.ReadOnlySqlTransaction,
            pgerr.InsufficientResources)


def _timeout(exc: Exception, lock_s: float, statement_s: float) -> StorageTimeout:
    if isinstance(exc, pgerr.LockNotAvailable):
        what, bound, name = "a lock another connection holds", lock_s, "lock_timeout"
    else:
        what, bound, name = "the database server's answer", statement_s, "statement_timeout"
    return StorageTimeout(
        f"waited {bound:g} s ({name}) for {what}; nothing was written: send the request "
        "again (if it keeps happening, look for a stuck connection in pg_stat_activity)",
        {"reason": type(exc).__name__, "timeoutSeconds": bound},
    )


def _duplicate(exc: pgerr.UniqueViolation) -> Conflict:
    """A row another daemon stored at the same moment (the engine checked before the
    write lock that none existed): the retry is answered as any duplicate is."""
    what = getattr(exc.diag, "constraint_name", None) or "a unique key"
    return Conflict(
        f"another daemon stored the same ids at the same moment ({what}); nothing of this "
        "request was written: read the session (archive/read) before sending it again",
        {"reason": "UniqueViolation"},
    )
