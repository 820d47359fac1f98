"""How many llama.cpp threads ``n_threads: 0`` (automatic) means: the idle physical cores.

llama.cpp's CPU workers meet at a barrier after every operation of the graph (hundreds per
decode). When another process holds one of the cores, the worker sharing that core runs only
in the kernel scheduler's time slices and every barrier waits for it: on a 2-core machine with
one core taken by a busy loop, 2 threads gave a time to first audio several times that of 1
thread (``benchmarks/contention.py``; table in README.md, "Threads on a shared machine").
Sleeping workers (``thread_poll: 0``) do not fix that; fewer threads do. So the automatic
count is the physical cores minus the cores other processes kept busy over a short sample at
start-up, at least 1. It is decided once, when the engine loads; ``n_threads`` in the config
(``--n-threads``) overrides it.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

__all__ = ["ThreadChoice", "auto_threads", "busy_cores_elsewhere", "physical_cores"]

PROC_STAT = Path("/proc/stat")
SAMPLE_S = 0.25  # long enough to see a steady neighbour, short against a model load
# /proc/stat columns after the cpu name: user nice system idle iowait irq softirq steal ...
_IDLE_COLUMNS = (3, 4)  # idle, iowait


def physical_cores() -> int:
    """Physical cores this process may run on (hyper-threads counted once)."""
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)
    cores: set[tuple[str, str]] = set()
    for cpu in allowed:
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            pkg = (topo / "physical_package_id").read_text().strip()
            core = (topo / "core_id").read_text().strip()
        except OSError:
            return max(1, len(allowed))
        cores.add((pkg, core))
    return max(1, len(cores))


def _busy_ticks(cpus: set[int]) -> int | None:
    """Busy clock ticks (everything but idle and iowait; steal counts: a hypervisor that gives
    our core's time to another guest is a neighbour too) summed over ``cpus``."""
    try:
        lines = PROC_STAT.read_text().splitlines()
    except OSError:
        return None
    total = 0
    for line in lines:
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu":
            continue
        if int(name[3:]) not in cpus:
            continue
        cols = [int(v) for v in rest.split()]
        total += sum(v for i, v in enumerate(cols[:8]) if i not in _IDLE_COLUMNS)
    return total


def busy_cores_elsewhere(window_s: float = SAMPLE_S) -> float:
    """Cores' worth of CPU time other processes used on this process's CPUs over ``window_s``
    (0.0 where /proc/stat is not available)."""
    try:
        cpus = set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return 0.0
    hz = os.sysconf("SC_CLK_TCK")
    b0, own0, t0 = _busy_ticks(cpus), os.times(), time.monotonic()
    if b0 is None:
        return 0.0
    time.sleep(window_s)
    b1, own1, t1 = _busy_ticks(cpus), os.times(), time.monotonic()
    if b1 is None:
        return 0.0
    own_s = (own1.user - own0.user) + (own1.system - own0.system)
    other_s = (b1 - b0) / hz - own_s
    return max(0.0, other_s / max(t1 - t0, 1e-3))


@dataclass(frozen=True, slots=True)
class ThreadChoice:
    threads: int
    physical_cores: int
    busy_elsewhere: float  # cores' worth used by other processes at start-up

    @property
    def reduced(self) -> bool:
        return self.threads < self.physical_cores


def auto_threads(window_s: float = SAMPLE_S) -> ThreadChoice:
    """Physical cores minus the cores other processes keep busy (rounded), at least 1."""
    cores = physical_cores()
    busy = busy_cores_elsewhere(window_s) if cores > 1 else 0.0
    threads = max(1, cores - int(busy + 0.5))
    return ThreadChoice(threads, cores, round(busy, 2))
