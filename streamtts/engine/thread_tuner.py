"""ThreadTuner: how many llama.cpp threads a decode of so many rows uses, chosen from the
engine's own measured decodes.

llama.cpp's CPU workers meet at a barrier after every operation of the graph, so a worker
whose core another thread took holds every barrier up: under twice its load on 2 cores, the
mid demo model's one-row decodes were faster on one thread (11 against 14 ms in a probe),
and with a busy neighbour arriving after the engine loaded they moved to one thread. A
large model's decode is bound by memory or arithmetic and wants every
core. Which count is faster depends on the model, the rows, the machine and what else runs
on it, so it is measured, not set (docs/perf.md has what it chose and changed):

- decodes are put in buckets by their rows (1, 2-3, 4-7, ...: powers of two);
- each bucket uses one count, starting at the most threads the engine has (``n_threads``);
- every ``PROBE_EVERY`` decodes of a bucket, a probe interleaves the count in use with its
  neighbours among 1, 2, 4, ... and the most (``PROBE_ROUNDS`` decodes each, taken in turns
  so that all of them see the same load), and the bucket moves to the neighbour whose mean
  was faster by ``MARGIN`` or more. The mean, not the median: what more threads cost is in
  the tail. On the tiny demo model under load (2 cores, threads not pinned), one-row
  decodes on two threads had medians within 10 % of one thread's while 0.4-2 % of them
  stalled 10-35 ms (a thread off its core holding every barrier): as much again on average.

A probe costs a few decodes at a neighbouring count in a few hundred, and none while a
stream waits for its first audio (``hold``): a newcomer's 32 steps come one decode after
another, and a probe's decode is the likeliest to stall (there, 11 of 256 probe decodes on
two threads took over 5 ms: the worker had slept since the last probe). The engine thread
alone calls it; pure bookkeeping (the caller times the decodes).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

log = logging.getLogger(__name__)

__all__ = ["ThreadTuner"]

PROBE_EVERY = 200  # decodes of a bucket between two probes
FIRST_PROBE = 20  # ... and before its first (a fresh engine's first decodes run on cold caches)
PROBE_ROUNDS = 3  # decodes of each count a probe takes, interleaved
MARGIN = 0.1  # a neighbour must be this much faster (its mean) for the bucket to move
MAX_BUCKET = 16  # rows up to 2**16 (a prefill piece is at most n_batch rows)


@dataclass
class _Bucket:
    at: int  # index of the count in use among the candidates
    since: int = 0  # decodes since the last probe
    probing: list[int] = field(default_factory=list)  # candidate indices still to run, in order
    samples: dict[int, list[float]] = field(default_factory=dict)  # candidate index -> seconds
    probed: bool = False  # a probe has decided once


class ThreadTuner:
    def __init__(self, max_threads: int) -> None:
        if max_threads < 1:
            raise ValueError(f"max_threads must be >= 1, got {max_threads}")
        powers = [1 << i for i in range(max_threads.bit_length()) if 1 << i < max_threads]
        self.candidates: tuple[int, ...] = (*powers, max_threads)
        self._buckets = [_Bucket(at=len(self.candidates) - 1, since=PROBE_EVERY - FIRST_PROBE)
                         for _ in range(MAX_BUCKET + 1)]  # fmt: skip
        self.moves = 0  # times a bucket changed its count (read by the engine's info)
        # no probe starts or goes on while set: a stream waits for its first audio (the caller's)
        self.hold = False

    @property
    def active(self) -> bool:
        """False with one candidate (one thread): nothing to choose."""
        return len(self.candidates) > 1

    def threads(self, rows: int) -> int:
        """The thread count the next decode of ``rows`` rows uses; the caller reports its
        time with :meth:`observe` before the next call."""
        b = self._buckets[_bucket(rows)]
        if self.hold:  # a probe waits (one under way resumes where it was)
            b.since += not b.probing
            return self.candidates[b.at]
        if not b.probing:
            b.since += 1
            if b.since < PROBE_EVERY or not self.active:
                return self.candidates[b.at]
            b.since = 0
            near = [i for i in (b.at, b.at - 1, b.at + 1) if 0 <= i < len(self.candidates)]
            b.probing = near * PROBE_ROUNDS
            b.samples = {i: [] for i in near}
        return self.candidates[b.probing[0]]

    def observe(self, rows: int, threads: int, seconds: float) -> None:
        """A decode of ``rows`` rows on ``threads`` threads took ``seconds``."""
        b = self._buckets[_bucket(rows)]
        if self.hold or not b.probing or self.candidates[b.probing[0]] != threads:
            return
        b.samples[b.probing.pop(0)].append(seconds)
        if not b.probing:
            self._decide(rows, b)

    def _decide(self, rows: int, b: _Bucket) -> None:
        mean = {i: float(np.mean(s)) for i, s in b.samples.items() if s}
        best = min(mean, key=mean.__getitem__)
        if best != b.at and mean[best] < (1.0 - MARGIN) * mean[b.at]:
            log.debug("decodes of %d-%d rows: %d llama.cpp threads (%.2f ms) rather than %d (%.2f ms)",
                      1 << _bucket(rows), (2 << _bucket(rows)) - 1, self.candidates[best],
                      1000 * mean[best], self.candidates[b.at], 1000 * mean[b.at])  # fmt: skip
            b.at = best
            self.moves += 1
        b.samples, b.probed = {}, True

    def chosen(self) -> dict[int, int]:
        """The count in use per bucket that has run a probe (its lowest rows -> threads)."""
        return {1 << i: self.candidates[b.at] for i, b in enumerate(self._buckets) if b.probed}


def _bucket(rows: int) -> int:
    return min(MAX_BUCKET, max(1, rows).bit_length() - 1)
