"""Taking the data dir and opening its engine: the first step of a daemon's start.

What stops either (a path that is not a directory, another user's files, no permission,
a full disk, a database that is not ctxd's, a PostgreSQL server out of reach) becomes
one `StartupError` line naming the path; a data dir another daemon serves is
`AlreadyRunning`.
"""

from __future__ import annotations

from pathlib import Path

import apsw

from ctxd.daemon.config import Config, StartupError
from ctxd.daemon.engine import Engine
from ctxd.daemon.ownership import PidLock, check_data_dir


class AlreadyRunning(RuntimeError):
    pass


def data_dir_lock(data_dir: Path) -> PidLock:
    """An flock on `<data dir>/daemon.lock` holding the owner's pid."""
    return PidLock(
        data_dir / "daemon.lock",
        lambda owner: AlreadyRunning(
            f"another ctxd daemon (pid {owner}) serves {data_dir}; use it, or stop it first"
        ),
    )


def open_data_dir(cfg: Config) -> tuple[PidLock, Engine]:
    """Take the data dir's lock and open the engine on the configured store."""
    where = cfg.data_dir
    try:
        if cfg.data_dir.exists() and not cfg.data_dir.is_dir():
            raise NotADirectoryError(20, "it is a file, not a directory")
        # refuses a data dir, database or lock file another user owns or may write to
        check_data_dir(cfg.data_dir)
        lock = data_dir_lock(cfg.data_dir)
        where = lock.path
        lock.acquire()
    except OSError as exc:
        raise StartupError(
            f"{where}: {reason(exc)}; expected a writable data directory of yours with free "
            "space (data_dir, --data-dir or CTXD_DATA_DIR)"
        ) from None
    if cfg.store == "postgres":
        return lock, _open_postgres(cfg, lock)
    try:
        return lock, Engine(cfg)
    except (OSError, apsw.Error) as exc:
        lock.release()
        raise StartupError(
            f"{cfg.db_path}: cannot open the database ({reason(exc)}); expected a ctxd "
            "database on a writable disk with free space"
        ) from None


def _open_postgres(cfg: Config, lock: PidLock) -> Engine:
    """The engine on the PostgreSQL store (the data dir still holds this daemon's own
    connection file and log); a server that cannot be reached is a StartupError."""
    import psycopg

    from ctxd.daemon.stores.postgres.factory import store_from_config
    from ctxd.protocol.errors import StorageError

    try:
        return Engine(cfg, store=store_from_config(cfg))
    except StorageError as exc:
        lock.release()
        raise StartupError(f"postgres.dsn: {exc.message}") from None
    except (psycopg.Error, RuntimeError) as exc:  # e.g. no right to create the tables
        lock.release()
        raise StartupError(f"postgres.dsn: cannot prepare the database ({exc})") from None


def store_description(cfg: Config) -> str:
    """Where the archive lives, for people: the SQLite file, or the PostgreSQL database
    (its dsn never holds a password: config refuses one)."""
    if cfg.store == "postgres":
        from psycopg.conninfo import conninfo_to_dict

        params = conninfo_to_dict(cfg.postgres.dsn)
        where = params.get("host") or "local socket"
        port = f":{params['port']}" if params.get("port") else ""
        return f"postgresql database {params.get('dbname') or '(default)'} on {where}{port}"
    return f"sqlite {cfg.db_path}"


def reason(exc: BaseException) -> str:
    """Why a start-up step failed, in a few words for the one line a person reads."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    if isinstance(exc, apsw.FullError):
        return "the disk is full"
    if isinstance(exc, apsw.IOError):
        return f"I/O error, is the disk full? {exc}"
    return str(exc) or type(exc).__name__
