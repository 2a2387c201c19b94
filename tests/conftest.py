"""Shared fixtures: a real engine on a real SQLite file in a temp dir; a real PostgreSQL
server (tests/pg.py) for the PostgreSQL store."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from helpers import DaemonProcess, make_config
from pg import PASSWORD, PgCluster, PostgresMissing

from ctxd.daemon.engine import Engine
from ctxd.daemon.stores.postgres.store import PostgresStore


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


PG_PASSWORD_VAR = "CTXD_TEST_PG_PASSWORD"


@pytest.fixture
def pg_daemons(tmp_path: Path, pg_cluster: PgCluster, pg_dsn: str) -> Iterator[list[DaemonProcess]]:
    """Two daemon processes, a and b, sharing one fresh PostgreSQL database over TCP with
    a password, as daemons on two hosts would."""
    dbname = psycopg.conninfo.conninfo_to_dict(pg_dsn)["dbname"]
    env = {"CTXD_STORE": "postgres", "CTXD_POSTGRES_DSN": pg_cluster.tcp_dsn(dbname),
           "CTXD_POSTGRES_PASSWORD_ENV": PG_PASSWORD_VAR, PG_PASSWORD_VAR: PASSWORD,
           # no auto-compaction: the context must hold every message appended
           "CTXD_MAX_ACTIVE_MESSAGES": "10000"}
    procs = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        procs.append(DaemonProcess(tmp_path / name, env=env).start())
    yield procs
    for d in procs:
        d.stop()


@pytest.fixture
def two_engines(tmp_path: Path, pg_dsn: str) -> Iterator[tuple[Engine, Engine]]:
    """Two engines (as of two daemons) on one database."""
    out = [Engine(make_config(tmp_path / name), store=PostgresStore(pg_dsn)) for name in "ab"]
    yield out[0], out[1]
    for e in out:
        e.close()
