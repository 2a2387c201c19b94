"""Shared fixtures: a real engine on a real SQLite file in a temp dir."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import make_config

from ctxd.daemon.engine import Engine


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    e = Engine(make_config(tmp_path / "data"))
    yield e
    e.close()
