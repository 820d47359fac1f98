"""A step's rows cut into ranges and run on several threads: the CPU side of a tick scales with cores.

Why: with many streams (a GPU's 64-128) the CPU work after each decode, mostly sampling
32 codebooks per stream, is a tick's largest part on one core (about the time an 8B decode
of 128 rows takes on an H200). The rows are independent and the compiled twins release the
GIL, so a step's ranges run at once. Only twins are split: a spec's NumPy shares one row
sampler and stays on the engine thread. A range's rows and states come out the same however
a step is cut (counter-based RNG per stream and step; ``tests/kernels/test_conformance.py``
runs lifecycles across threads), so the thread count changes no output.

What the split relies on: a step's slots are distinct (the engine's always are; a repeated
slot in two ranges is not detected), and a range that fails (non-finite logits) leaves the
other ranges stepped, where one call would have changed nothing: the engine fails every
stream of a step that raised, so no stream goes on from a half step.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from .delay_step import DelayStepTwin
from .entries import StepEmbed

_R = TypeVar("_R")

MIN_ROWS = 32
"""Rows a thread is given at the least: below that, handing a range over costs more than it saves."""


def auto_threads() -> int:
    """The cores this process may run on, at most 8 (a tick's ranges rarely fill more)."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        n = os.cpu_count() or 1
    return max(1, min(n, 8))


class RowSplit:
    """Runs ``fn(lo, hi)`` over ``[0, b)`` cut into up to ``threads`` ranges of at least
    ``min_rows`` rows: the first range on the caller's thread, the others on pool threads."""

    def __init__(self, threads: int, min_rows: int = MIN_ROWS) -> None:
        self.threads = max(1, threads)
        self.min_rows = max(1, min_rows)
        self._pool = (
            ThreadPoolExecutor(self.threads - 1, thread_name_prefix="streamtts-tick") if self.threads > 1 else None
        )
        self._cuts: dict[int, tuple[tuple[int, int], ...]] = {}
        self.parallel_runs = 0
        """Calls that ran on more than one thread."""

    def ranges(self, b: int) -> tuple[tuple[int, int], ...]:
        """The ranges ``[0, b)`` is cut into (worked out once per batch size)."""
        cut = self._cuts.get(b)
        if cut is None:
            n = max(1, min(self.threads, b // self.min_rows))
            cut = tuple((b * i // n, b * (i + 1) // n) for i in range(n))
            self._cuts[b] = cut
        return cut

    def run(self, fn: Callable[[int, int], _R], b: int) -> list[_R]:
        """``fn`` on each range, the results in range order; every range has finished before
        this returns or raises (a failed range's error is raised, the first one's first)."""
        cut = self.ranges(b)
        if len(cut) == 1 or self._pool is None:
            return [fn(0, b)]
        self.parallel_runs += 1
        futures: list[Future[_R]] = [self._pool.submit(fn, lo, hi) for lo, hi in cut[1:]]
        try:
            first = fn(*cut[0])
        finally:
            for f in futures:  # they write into the caller's buffers: wait for all of them
                f.exception()
        return [first, *(f.result() for f in futures)]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)


class SplitDelayStep:
    """A compiled delay step run on a :class:`RowSplit`'s ranges. A range with a stream outside
    audio mode changes nothing in C; those ranges then go to the spec, on this thread."""

    compiled = True

    def __init__(self, twin: DelayStepTwin, split: RowSplit) -> None:
        self._twin = twin
        self._split = split

    @property
    def handed_back(self) -> int:
        """Steps whose range went to the spec (as the twin counts them)."""
        return self._twin.handed_back

    def __call__(self, lo: int, hi: int) -> None:
        if lo or hi - lo < 2 * self._split.min_rows:
            self._twin(lo, hi)
            return
        done = self._split.run(self._twin.try_compiled, hi)
        for (a, b), ok in zip(self._split.ranges(hi), done, strict=True):
            if not ok:
                self._twin.spec(a, b)


class SplitStepEmbed:
    """A compiled step embedding run on a :class:`RowSplit`'s ranges (each writes its own rows)."""

    compiled = True

    def __init__(self, twin: StepEmbed, split: RowSplit) -> None:
        self._twin = twin
        self._split = split

    def __call__(self, lo: int, hi: int) -> None:
        if lo or hi - lo < 2 * self._split.min_rows:
            self._twin(lo, hi)
            return
        self._split.run(self._twin, hi)
