"""Playback continuity: what a real-time listener hears of a stream's chunk arrivals.

The listener starts playing ``buffer_s`` after its first audio arrives and plays 1 s of
audio per second; when it has played everything received it waits (an underrun) and
resumes the moment the next chunk arrives. ``C50/C100/C200`` in the benchmarks is the
share of streams with no underrun at a 50/100/200 ms buffer (the measure SGLang-Omni
publishes for this model family).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["BUFFERS_MS", "Playback", "continuity_row", "play"]

BUFFERS_MS = (50, 100, 200)


@dataclass(frozen=True, slots=True)
class Playback:
    underruns: int  # times the listener ran out of audio before the stream's end
    longest_s: float  # the longest of those waits (0: none)
    total_s: float  # all of them together


def play(arrivals: Iterable[tuple[float, float]], buffer_s: float) -> Playback:
    """``arrivals``: (arrival time in s, audio seconds in the chunk), in arrival order."""
    end: float | None = None  # when the audio received so far runs out
    n, longest, total = 0, 0.0, 0.0
    for t, seconds in arrivals:
        if seconds <= 0:
            continue
        if end is None:
            end = t + buffer_s  # playback starts buffer_s after the first audio
        elif t > end:
            gap = t - end
            n, total, longest = n + 1, total + gap, max(longest, gap)
            end = t
        end += seconds
    return Playback(n, longest, total)


def continuity_row(streams: Sequence[Sequence[tuple[float, float]]]) -> dict[str, float]:
    """Per buffer: the share of streams heard without an underrun (``c50``...); and at a
    100 ms buffer the p95 and the largest of each stream's longest underrun, in ms."""
    row: dict[str, float] = {}
    if not streams:
        return row
    for ms in BUFFERS_MS:
        plays = [play(s, ms / 1000) for s in streams]
        row[f"c{ms}"] = round(sum(p.underruns == 0 for p in plays) / len(plays), 4)
        if ms == 100:
            longest = np.asarray([p.longest_s for p in plays]) * 1000
            row["underrun_ms_p95"] = round(float(np.percentile(longest, 95)), 1)
            row["underrun_ms_max"] = round(float(longest.max()), 1)
    return row
