"""Sustained load on one daemon, and clients that stop reading.

The soak runs writers on every wire (some sharing one session, some with a session
each, running agent turns that auto-compact), a client doing searches, status polls,
context checks and forced compactions in between, and a subscriber per wire. At the end
the archive must hold every acknowledged batch exactly once, in each client's order;
every subscriber must have received a `session/didAppend` for every stored batch of its
sessions; the daemon's resident memory must stay bounded and stop growing; and the
daemon must still answer on every wire.

The stuck-client tests subscribe a client that never reads its socket to a busy session
and check the daemon stays responsive to others and keeps its memory bounded; on the
JSON-RPC wire the stuck client keeps its connection and, once it reads again, is told
how many events it missed (`session/didMissEvents`).

`CTXD_SOAK_SECONDS` sets the soak's load time (default 45 s); `bench/soak.py --seconds N`
runs it longer.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from tests.harness.probes import MIB
from tests.harness.soak import (
    SOAK_RSS_FLOOR_KIB,
    SOAK_RSS_LIMIT_KIB,
    SOAK_RSS_TREND,
    run_soak,
    soak_seconds,
)
from tests.harness.stuck import (
    STUCK_EVENT_MIB,
    STUCK_RSS_GROWTH_KIB,
    _check_responsive,
    pub_hwm,
    stuck_run,
    stuck_zmq_events,
)


def test_soak_every_wire_no_loss_no_duplicate_all_events(tmp_path: Path) -> None:
    seed = int(os.environ.get("CTXD_SOAK_SEED") or random.SystemRandom().randrange(2**32))
    seconds = soak_seconds()
    print(f"soak: seed {seed}, {seconds:g} s")
    stats, failures = run_soak(tmp_path, seconds, seed)
    print(json.dumps(stats, indent=1))
    assert not failures, f"{len(failures)} problems:\n" + "\n".join(failures[:20])
    assert stats["writers"] >= 8 and stats["subscribers"] == 3
    assert stats["acked_batches"] > 50 * seconds, "the load was too light to mean anything"
    assert stats["auto_compactions_scheduled"] >= 1
    rss = stats["rss_kib"]
    assert rss["vm_hwm"] < SOAK_RSS_LIMIT_KIB, rss
    first_growth = rss["first_half_peak"] - rss["start"]
    allowed = max(SOAK_RSS_FLOOR_KIB, SOAK_RSS_TREND * first_growth)
    assert rss["second_half_peak"] - rss["first_half_peak"] <= allowed, rss
    trips = stats["round_trips"]
    assert trips["n"] > 0 and trips["median_ms"] < 250, trips



def test_stuck_tcp_subscriber_is_told_what_it_missed_and_the_daemon_stays_bounded(
    tmp_path: Path,
) -> None:
    stats, failures = stuck_run(tmp_path, "tcp", 5, 1500, STUCK_EVENT_MIB)
    print(json.dumps(stats, indent=1))
    assert not failures, failures
    assert stats["small_appends"] > 2000, "thousands of messages must reach the busy session"
    _check_responsive(stats)
    # far more was published for the stuck client than the daemon may keep for it
    assert stats["approval_event_bytes"] >= STUCK_EVENT_MIB * MIB, stats
    assert stats["rss_big_growth_kib"] < STUCK_RSS_GROWTH_KIB, stats
    # it kept its connection: reading again, it got what was queued, then the notice
    # with the number of events dropped for it; the two add up to what was published
    assert stats["stuck_end"] == "notice", stats
    assert stats["stuck_bytes_read"] < 16 * MIB, stats
    assert 0 < stats["stuck_missed"] < stats["events_published"], stats
    assert stats["stuck_events_read"] + stats["stuck_missed"] == stats["events_published"], stats
    # the stuck client's backlog is its own: a healthy reader loses far less, if anything
    assert stats["healthy_missed"] < stats["stuck_missed"] / 2, stats
    assert stats["daemon_log_drops"] == 0 and stats["daemon_log_sheds"] >= 1, stats


def test_stuck_zmq_subscriber_is_dropped_for_and_the_daemon_stays_bounded(
    tmp_path: Path,
) -> None:
    # the large events first: they fill its queue up to the high-water mark (the worst
    # case for memory), then the small ones, all past the mark
    stats, failures = stuck_run(
        tmp_path, "zmq", 2, stuck_zmq_events(), STUCK_EVENT_MIB, big_first=True
    )
    print(json.dumps(stats, indent=1))
    assert not failures, failures
    assert stats["events_published"] > stuck_zmq_events(), stats
    _check_responsive(stats)
    assert stats["approval_event_bytes"] >= STUCK_EVENT_MIB * MIB, stats
    assert stats["rss_flood_growth_kib"] < STUCK_RSS_GROWTH_KIB, stats
    assert stats["rss_big_growth_kib"] < STUCK_RSS_GROWTH_KIB, stats
    # the publisher dropped events for it instead of queueing them all
    assert stats["stuck_events_read"] <= pub_hwm() + 100 < stats["events_published"], stats
