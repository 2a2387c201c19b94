"""`ctxd migrate` and `ctxd copy`: preparing a store and moving an archive between stores.

Neither talks to a daemon: they open the databases themselves (a daemon may keep
running on the target; the source of a copy should not be written meanwhile, or run
the copy again afterwards to pick up what came later).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

Common = Callable[[argparse.ArgumentParser], None]


def _startup_error(message: str) -> Exception:
    from ctxd.daemon.config import StartupError

    return StartupError(message)


def _password(args: argparse.Namespace, cfg: Any) -> str | None:
    name = args.password_env or (cfg.postgres.password_env if cfg else "")
    if not name:
        return None  # libpq's own ways still apply: PGPASSWORD, ~/.pgpass, peer auth
    if name not in os.environ:
        raise _startup_error(
            f"--password-env names the environment variable {name!r}, which is not set"
        )
    return os.environ[name]


def cmd_migrate(args: argparse.Namespace) -> int:
    cfg = args.load_config(args)
    store = args.store or cfg.store
    if store == "sqlite":
        from ctxd.daemon.stores.sqlite.schema import SCHEMA_VERSION, open_database

        cfg.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        open_database(cfg.db_path).close()
        print(f"{cfg.db_path}: schema version {SCHEMA_VERSION}")
        return 0
    dsn = args.dsn or cfg.postgres.dsn
    if not dsn:
        raise _startup_error("migrate --store postgres: no DSN (give --dsn or postgres.dsn)")
    try:
        import psycopg

        from ctxd.daemon.stores.postgres import schema
        from ctxd.daemon.stores.postgres.connection import PgConnection
    except ImportError:
        raise _startup_error("the postgres store needs psycopg: pip install 'ctxd[postgres]'") \
            from None
    conn = PgConnection(dsn, _password(args, cfg))
    try:
        before = schema.current_version(conn.raw())
        after = schema.migrate(conn.raw())
    except (psycopg.Error, RuntimeError) as exc:
        raise _startup_error(f"migrate: {exc}") from None
    except Exception as exc:  # StorageError: the server cannot be reached
        raise _startup_error(f"migrate: {getattr(exc, 'message', exc)}") from None
    finally:
        conn.close()
    print(f"postgres: schema version {after}" + (f" (was {before})" if before != after else
                                                   " (already current)"))
    return 0


def _endpoint(text: str, kind: str) -> str:
    prefix = kind + ":"
    if not text.startswith(prefix) or not text[len(prefix):].strip():
        raise _startup_error(f"expected {prefix}{'DIR' if kind == 'sqlite' else 'DSN'}, "
                             f"got {text!r}")
    return text[len(prefix):]


def cmd_copy(args: argparse.Namespace) -> int:
    src = Path(_endpoint(args.source, "sqlite")).expanduser()
    dsn = _endpoint(args.target, "postgres")
    cfg = args.load_config(args) if args.config else None
    try:
        import psycopg

        from ctxd.daemon.stores.copy import CopyError, copy_sqlite_to_postgres
    except ImportError:
        raise _startup_error("the postgres store needs psycopg: pip install 'ctxd[postgres]'") \
            from None
    try:
        counts = copy_sqlite_to_postgres(src, dsn, _password(args, cfg))
    except (CopyError, psycopg.Error, RuntimeError) as exc:
        raise _startup_error(f"copy: {exc}") from None
    except Exception as exc:
        if hasattr(exc, "message"):  # StorageError
            raise _startup_error(f"copy: {exc.message}") from None
        raise
    if args.json:
        json.dump(counts, sys.stdout)
        print()
    else:
        print("copied " + ", ".join(f"{v} {k}" for k, v in counts.items())
              + " (archived rows new to the target; the others refreshed)")
    return 0


def register(sub: Any, common: Common, load_config: Callable[[argparse.Namespace], Any]) -> None:
    """`load_config`: the CLI's effective configuration from the parsed flags."""
    p = sub.add_parser("migrate", help="create or upgrade a store's schema (numbered "
                       "migrations; safe to run again, and beside running daemons)")
    common(p)
    p.add_argument("--store", choices=["sqlite", "postgres"],
                   help="which store (default: the configuration's `store`)")
    p.add_argument("--dsn", help="the PostgreSQL connection string (default: postgres.dsn)")
    p.add_argument("--password-env", dest="password_env", default="",
                   help="the environment variable holding the password (default: "
                   "postgres.password_env)")
    p.set_defaults(func=cmd_migrate, load_config=load_config)

    p = sub.add_parser("copy", help="copy an embedded archive into PostgreSQL (idempotent: "
                       "run it again to resume or to pick up what came later)")
    p.add_argument("--from", dest="source", required=True, metavar="sqlite:DIR",
                   help="the data directory of the embedded archive")
    p.add_argument("--to", dest="target", required=True, metavar="postgres:DSN",
                   help="the PostgreSQL database (the password: --password-env)")
    p.add_argument("--password-env", dest="password_env", default="",
                   help="the environment variable holding the password")
    p.add_argument("--config", type=Path, default=argparse.SUPPRESS,
                   help="TOML configuration file (for postgres.password_env)")
    p.add_argument("--json", action="store_true", help="print the counts as JSON")
    p.set_defaults(func=cmd_copy, data_dir=None, load_config=load_config)
