"""The PostgreSQL store a configuration names."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ctxd.daemon.stores.postgres.store import PostgresStore


def store_from_config(cfg: Any) -> PostgresStore:
    """The PostgreSQL store a config names (`store = "postgres"`, `[postgres]`): the
    password comes from the environment variable `postgres.password_env` names."""
    from ctxd.daemon.stores.postgres.store import PostgresStore

    pg = cfg.postgres
    password = os.environ.get(pg.password_env) if pg.password_env else None
    return PostgresStore(
        pg.dsn, password=password, search_budget_seconds=cfg.search_budget_seconds,
        lock_timeout=pg.lock_timeout_seconds, statement_timeout=pg.statement_timeout_seconds,
    )
