"""The wheel carries every package of the tree: pyproject.toml lists packages one by one
(the layout maps `ctxd.daemon` to daemon/ and so on), so a new folder left off the list
works in an editable install and is missing from `pip install .`."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _listed() -> tuple[set[str], dict[str, str]]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        setuptools = tomllib.load(f)["tool"]["setuptools"]
    return set(setuptools["packages"]), setuptools["package-dir"]


def test_every_folder_with_an_init_is_a_listed_package() -> None:
    listed, dirs = _listed()
    found = set()
    for name, folder in dirs.items():
        if name == "ctxd":
            continue
        for init in (ROOT / folder).rglob("__init__.py"):
            if "node_modules" in init.parts:
                continue
            rel = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *rel)))
    assert found, "no package found under the mapped folders"
    assert found - listed == set(), f"packages missing from pyproject.toml: {found - listed}"
    # and nothing listed that is not there
    assert listed - found - {"ctxd"} == set()
