"""Replacing a file whole, so that no reader ever sees it half-written.

The one way every part of ctxd writes a file others read (the connection file, the
editor's read-only session documents, the agents' config files, the hook's notes, an
export): written under a fresh name made with O_EXCL in the same directory, then renamed
over the target. Nothing already there (a planted link under a predictable temporary
name) is opened or chmod-ed, and a failed write leaves no temporary file behind.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO


@contextlib.contextmanager
def replacing(path: Path, mode: int, *, durable: bool = False) -> Iterator[TextIO]:
    """A text file to write; on leaving the block it replaces `path` with `mode`.
    `durable`: flushed to the disk before the rename (a config file a crash must not
    empty). An exception inside the block leaves `path` as it was."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yield f
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def replace_file(path: Path, text: str, mode: int, *, durable: bool = False) -> None:
    """Put `text` at `path` atomically with `mode` (see `replacing`)."""
    with replacing(path, mode, durable=durable) as f:
        f.write(text)
