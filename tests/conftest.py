"""Shared fixtures: a real engine on a real SQLite file in a temp dir; a real PostgreSQL
server (tests/pg.py) for the PostgreSQL store."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import make_config
from pg import PgCluster, PostgresMissing

from ctxd.daemon.engine import Engine


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    e = Engine(make_config(tmp_path / "data"))
    yield e
    e.close()


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    """One real PostgreSQL server for the whole run; each test takes its own database."""
    try:
        cluster = PgCluster()
    except PostgresMissing as exc:
        pytest.fail(str(exc))
    cluster.start()
    yield cluster
    cluster.stop()


_pg_db_counter = itertools.count()


@pytest.fixture
def pg_dsn(pg_cluster: PgCluster) -> str:
    """A fresh, empty database on the shared test server (its socket DSN)."""
    return pg_cluster.create_database(f"t{os.getpid()}_{next(_pg_db_counter)}")
