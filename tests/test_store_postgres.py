"""The engine's store tests, run again on the PostgreSQL store with the same assertions.

Every test of the archive, search, compaction and context-edit suites that takes the
`engine` fixture is collected here a second time, with `engine` built on a
`PostgresStore` in a fresh database of the test server (tests/pg.py); the originals keep
running on the embedded SQLite store.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_archive
import test_compaction
import test_context_edit
import test_search
from _pytest.fixtures import FixtureFunctionDefinition
from helpers import make_config

from ctxd.daemon.engine import Engine
from ctxd.daemon.pg.store import PostgresStore

SUITES = (test_archive, test_search, test_compaction, test_context_edit)
# tests that open the SQLite file itself (PostgreSQL's counterparts: test_pg_schema.py)
SQLITE_ONLY = {"test_triggers_refuse_rewriting_history"}

for _mod in SUITES:
    for _name, _fn in list(vars(_mod).items()):
        if isinstance(_fn, FixtureFunctionDefinition) and _name != "engine":
            globals()[_name] = _fn  # the suite's own fixtures (e.g. a session id)
        elif (
            _name.startswith("test_")
            and _name not in SQLITE_ONLY
            and callable(_fn)
            and "engine" in inspect.signature(_fn).parameters
        ):
            globals()[f"{_name}__{_mod.__name__.removeprefix('test_')}"] = _fn


@pytest.fixture
def engine(tmp_path: Path, pg_dsn: str) -> Iterator[Engine]:
    cfg = make_config(tmp_path / "data")
    e = Engine(cfg, store=PostgresStore(pg_dsn, search_budget_seconds=cfg.search_budget_seconds))
    yield e
    e.close()
