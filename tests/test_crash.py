"""Crash safety under load: `kill -9` the daemon at random moments and prove, after every
restart, that nothing acknowledged was lost, duplicated or reordered.

What the clients do and what is checked after each kill is described in
tests/harness/crash.py, which runs it.

`CTXD_CRASH_SEED` replays the random choices of a run (thread timing still varies);
`CTXD_CRASH_KILLS` sets the number of kills (default 32).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.harness.crash import _iter_lines, crash_seed, run_crash
from tests.harness.found import (
    closing_a_client_fails_its_calls,
    late_tool_result_keeps_its_call,
)


def test_kill_9_under_load_loses_nothing_acknowledged(tmp_path: Path) -> None:
    seed = crash_seed()
    kills = int(os.environ.get("CTXD_CRASH_KILLS", "32"))
    print(f"crash test: seed {seed} (CTXD_CRASH_SEED={seed} replays it), {kills} kills")
    stats, failures = run_crash(tmp_path, seed, kills)
    print("\n".join(_iter_lines(stats)))
    assert not failures, f"seed {seed}: {len(failures)} problems:\n" + "\n".join(failures[:20])
    assert stats["kills"] == kills
    # the run must have exercised what it claims to check
    assert stats["acked_batches"] > 20 * kills
    assert stats["kills_mid_compaction"] >= kills // 8, "too few kills inside a compaction"
    assert stats["resent_found_in_image"] + stats["resent_absent_from_image"] >= kills // 2
    assert stats["auto_compactions_scheduled"] >= 1
    assert stats["approvals_requested"] >= 5


# ---------------------------------------------------------------- found along the way
# Both were found by the checks above and fixed; these keep them fixed.


@pytest.mark.parametrize("meanwhile", ["assistant", "user"])
def test_a_late_tool_result_keeps_its_call_in_context(tmp_path: Path, meanwhile: str) -> None:
    """Another client of the session talks while a tool runs, then a compaction runs:
    the call may leave the context only if its result can no longer be appended."""
    late_tool_result_keeps_its_call(tmp_path, meanwhile)


def test_closing_a_client_fails_its_calls_with_connection_error(tmp_path: Path) -> None:
    """The kill protocol relies on it: a call waiting for a dead daemon ends with
    ConnectionError when another thread closes the client."""
    closing_a_client_fails_its_calls(tmp_path)
