"""The language server's cache files (session documents for editors that cannot read
`ctxd:` URIs) are written only into directories that are ours alone, never through a
link or file another user planted there."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ctxd.clients.lsp.documents import DocKey, write_file
from ctxd.protocol.connection import UnsafePath

KEY = DocKey("context", "s1")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_planted_tmp_link_is_neither_written_nor_chmod_ed(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    victim = tmp_path / "victim.txt"
    victim.write_text("the victim's own text\n")
    victim.chmod(0o644)
    doc = root / KEY.file_name()
    doc.parent.mkdir(parents=True, mode=0o700)
    root.chmod(0o700)
    (root / "sessions").chmod(0o700)
    # the name the old writer used for its temporary file, pointing at the victim
    os.symlink(victim, doc.with_name(doc.name + ".tmp"))

    written = write_file(root, KEY, "# context of s1\n")

    assert written == doc
    assert doc.read_text() == "# context of s1\n"
    assert _mode(doc) == 0o400 and not doc.is_symlink()
    assert victim.read_text() == "the victim's own text\n"
    assert _mode(victim) == 0o644
    # no temporary file is left behind beside the document
    assert sorted(p.name for p in doc.parent.iterdir()) == ["context.md", "context.md.tmp"]


def test_a_cache_dir_others_may_write_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "shared"
    root.mkdir()
    root.chmod(0o777)
    with pytest.raises(UnsafePath, match="writable|refusing"):
        write_file(root, KEY, "text")
    assert list(root.iterdir()) == []
    assert _mode(root) == 0o777  # refused, not taken over


def test_a_linked_subdirectory_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    os.symlink(elsewhere, root / "sessions")
    with pytest.raises(UnsafePath, match="symbolic link"):
        write_file(root, KEY, "text")
    assert list(elsewhere.iterdir()) == []


def test_documents_are_rewritten_only_when_changed(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    path = write_file(root, KEY, "one\n")
    assert _mode(root) == 0o700 and _mode(path.parent) == 0o700
    first = path.stat().st_ino
    assert write_file(root, KEY, "one\n") == path and path.stat().st_ino == first
    write_file(root, KEY, "two\n")
    assert path.read_text() == "two\n" and _mode(path) == 0o400
