"""Outcome counts of the fuzz, security and disk-error tests, for bench/fuzz_report.py.

`CTXD_FUZZ_STATS` names a file that receives one JSON line per (test, outcome) count
when a test module ends.
"""

from __future__ import annotations

import json
import os
from collections import Counter


class OutcomeCounts:
    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()

    def note(self, outcome: str) -> None:
        """Count one outcome of the running test."""
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0]
        self.counts[(test, outcome)] += 1

    def write(self) -> None:
        path = os.environ.get("CTXD_FUZZ_STATS")
        if path:
            with open(path, "a") as f:
                for (test, outcome), n in sorted(self.counts.items()):
                    f.write(json.dumps({"test": test, "outcome": outcome, "n": n}) + "\n")
        self.counts.clear()
