"""What the two load benchmarks share (ws_load.py over WebSockets, engine_load.py on an engine
in the process): Poisson arrival times, a listener's read-ahead, a process's memory, and one
level's row.

A session's result is a dict: ``outcome`` ("done", "refused", or what else ended it),
``arrivals`` ((monotonic time, audio seconds) per chunk), ``ttfa_s``, ``audio_s``,
``answer_s`` (a refusal: how long after the request it came), ``error`` and ``t_connect``.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from streamtts.audio.continuity import continuity_row


def arrival_times(rate: float, duration: float, seed: int) -> Iterator[float]:
    """Seconds from the level's start of each arrival: a Poisson process of ``rate`` per second."""
    rng = random.Random(seed)
    t = rng.expovariate(rate)
    while t <= duration:
        yield t
        t += rng.expovariate(rate)


def hold_s(got_s: float, t_first: float | None, now: float) -> float:
    """Audio a real-time listener holds unplayed: received minus played since its first audio."""
    return 0.0 if t_first is None else got_s - (now - t_first)


def rss_mb(pid: int | str | None = "self") -> float | None:
    """A process's resident memory in MB (``"self"``: this one; None: none to read)."""
    if pid is None:
        return None
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return None


def pct(v: Sequence[float], q: float) -> float | None:
    return round(float(np.percentile(v, q)), 1) if v else None


def level_row(res: Sequence[dict[str, Any]], rate: float, wall: float) -> dict[str, Any]:
    """One level: offered and carried load, outcomes, TTFA, refusal times and continuity."""
    done = [r for r in res if r["outcome"] == "done"]
    refused = [r for r in res if r["outcome"] == "refused"]
    ttfa = [1000 * r["ttfa_s"] for r in done]
    answers = [1000 * r["answer_s"] for r in refused]
    return {
        "rate_per_s": round(rate, 4),
        "sessions": len(res),
        "done": len(done),
        "refused": len(refused),
        "failed": len(res) - len(done) - len(refused),
        "failures": sorted({r["outcome"] if r["outcome"] != "failed" else str(r.get("error")) for r in res if r["outcome"] not in ("done", "refused")}),
        "audio_s_mean": round(statistics.mean(r["audio_s"] for r in done), 2) if done else None,
        # audio delivered per second of the level: the streams a listener hears at once, on average
        "carried_streams": round(sum(r["audio_s"] for r in done) / wall, 2),
        "ttfa_ms_p50": pct(ttfa, 50),
        "ttfa_ms_p95": pct(ttfa, 95),
        "refusal_ms_p50": pct(answers, 50),
        "refusal_ms_max": round(max(answers), 1) if answers else None,
        **continuity_row([r["arrivals"] for r in done]),
    }  # fmt: skip


def seen_row(capacity: Sequence[float], rss: Sequence[float]) -> dict[str, Any]:
    """What the engine reported meanwhile (its capacity each second) and memory every 5 s."""
    if not capacity:
        return {}
    cap = list(capacity)
    return {
        "capacity_streams_seen": {"min": min(cap), "median": statistics.median(cap), "max": max(cap),
                                  "last_half_mean": round(statistics.mean(cap[len(cap) // 2:]), 2)},
        "rss_mb_samples": list(rss),
    }  # fmt: skip
