"""CPU time taken by the processes of a store benchmark: daemons, PostgreSQL, proxies.

On 2 shared cores the processes of one run compete for the same CPU, so what bounds a
run is how much CPU a turn costs in each of them. A process's CPU is read from
/proc/PID/stat (user + system time, its waited-for children's included) for the process
and every descendant alive at the reading: PostgreSQL's backends are children of its
postmaster, a daemon started under `ip netns exec` is that process itself.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds with waited-for children) of a live process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            raw = f.read()
    except OSError:
        return None
    # the command name may hold spaces and parentheses: the fields follow its last ')'
    fields = raw[raw.rindex(")") + 2:].split()
    ppid = int(fields[1])
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return ppid, (utime + stime + cutime + cstime) / _TICK


def tree_cpu(roots: Iterable[int]) -> float:
    """CPU seconds of the processes `roots` and all their live descendants."""
    stats: dict[int, tuple[int, float]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            s = _stat(int(name))
            if s is not None:
                stats[int(name)] = s
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    seen: set[int] = set()
    todo = [p for p in roots if p in stats]
    total = 0.0
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += stats[pid][1]
        todo.extend(children.get(pid, ()))
    return total


class CpuMeter:
    """CPU seconds taken by named groups of process trees between `start` and `stop`."""

    def __init__(self, groups: dict[str, list[int]]) -> None:
        self.groups = groups
        self._before: dict[str, float] = {}

    def start(self) -> CpuMeter:
        self._before = {k: tree_cpu(v) for k, v in self.groups.items()}
        return self

    def stop(self) -> dict[str, float]:
        return {k: tree_cpu(v) - self._before[k] for k, v in self.groups.items()}
