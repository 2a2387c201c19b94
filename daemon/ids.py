"""Ids the daemon hands out: a prefix naming the kind (ses, run, apr, pin, cmp) and 20
random hex digits."""

from __future__ import annotations

import uuid


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"
