"""OS scheduling priority of the codec's threads (Linux).

On a machine with few cores the codec's decode thread (and ONNX Runtime's worker threads)
shares the cores llama.cpp's decode runs on: each time it takes one, one of llama.cpp's
threads waits and the whole decode waits for it at the next barrier. A higher nice value
(``codec_nice``) makes the scheduler give the codec the idle moments first (between
decodes, while Python samples) without starving it.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable

__all__ = ["lower_priority", "thread_ids"]

log = logging.getLogger(__name__)


def thread_ids() -> set[int]:
    """The kernel ids of this process's threads now (empty where /proc is not Linux's)."""
    if sys.platform != "linux":
        return set()
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:
        return set()


def lower_priority(tids: Iterable[int], nice: int) -> int:
    """Raise the nice value of each thread to at least ``nice``; how many were changed.
    Threads that ended meanwhile are skipped; elsewhere than Linux nothing happens (there a
    nice value applies to the whole process)."""
    if nice <= 0 or sys.platform != "linux":
        return 0
    done = 0
    for tid in tids:
        try:
            now = os.getpriority(os.PRIO_PROCESS, tid)
            if now < nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
            done += 1
        except OSError:  # ended, or not ours to change
            continue
    return done
