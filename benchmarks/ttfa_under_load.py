"""First audio of a stream that joins a busy engine, with and without ``step_slack_s``.

    python benchmarks/ttfa_under_load.py [--config CFG] [--background 7] [--reps 5]

``--background`` streams run (long, read as fast as produced, like a server pushing to
clients that buffer); once each is more than ``step_slack_s`` ahead of a real-time
listener, ``--reps`` newcomers join one after another and their TTFA is taken. With
``step_slack_s`` on, the background streams skip their steps during a newcomer's 32
steps to first audio, so its ticks hold one row instead of N + 1. Also reported: TTFA
with an idle engine, and background chunks that would have reached a real-time listener
late (playback starting 200 ms after its first chunk). Settings run interleaved in one
process. A benchmark: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import numpy as np

from streamtts import Engine
from streamtts.demo.model import ensure_demo_model
from streamtts.request import StreamOptions

FRAME_S = 0.08
PREROLL_S = 0.2


async def ttfa(e: Engine, text: str, seed: int) -> float:
    s = e.stream(text, options=StreamOptions(seed=seed, fixed_frames=3))
    async with s:
        async for _ in s:
            pass
    return s.stats.ttfa_s * 1000.0


async def background(e: Engine, i: int, ready: asyncio.Event, late: list[int]) -> None:
    s = e.stream(f"Background stream {i} keeps talking for a long while.", options=StreamOptions(seed=i, fixed_frames=3000))
    t0 = 0.0
    async with s:
        async for c in s:
            now = time.monotonic()
            if not t0:
                t0 = now
            if now > t0 + PREROLL_S + c.frames.start * FRAME_S:
                late[0] += 1
            if not ready.is_set() and now + 1.5 < t0 + c.frames.stop * FRAME_S:
                ready.set()  # comfortably ahead of a real-time listener


async def run(cfg: str, slack: float, n_bg: int, reps: int, threads: int | None) -> dict[str, Any]:
    kw: dict[str, Any] = {"max_streams": n_bg + 1, "step_slack_s": slack}
    if threads:
        kw["n_threads"] = threads
    async with Engine.from_config(cfg, **kw) as e:
        await ttfa(e, "Warm up.", 0)
        idle = [await ttfa(e, f"Alone, sentence {i}.", i) for i in range(reps)]
        late = [0]
        events = [asyncio.Event() for _ in range(n_bg)]
        tasks = [asyncio.create_task(background(e, i, ev, late)) for i, ev in enumerate(events)]
        await asyncio.gather(*(ev.wait() for ev in events))
        late_before = late[0]
        loaded = [await ttfa(e, f"Joining a busy engine, sentence {i}.", 100 + i) for i in range(reps)]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "step_slack_s": slack,
        "ttfa_idle_ms": round(statistics.median(idle), 1),
        "ttfa_under_load_ms": round(statistics.median(loaded), 1),
        "ttfa_under_load_p95_ms": round(float(np.percentile(loaded, 95)), 1),
        "background_late_chunks": late[0] - late_before,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="YAML config; default: the demo model")
    ap.add_argument("--background", type=int, default=7)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2, help="off/on pairs, interleaved")
    ap.add_argument("--n-threads", type=int)
    a = ap.parse_args()
    cfg = a.config or str(ensure_demo_model() / "config.yaml")
    rows = []
    for _ in range(a.rounds):
        for slack in (0.0, 1.0):
            rows.append(asyncio.run(run(cfg, slack, a.background, a.reps, a.n_threads)))
    out: dict[str, Any] = {"config": cfg, "background": a.background, "runs": rows, "summary": []}
    for slack in (0.0, 1.0):
        mine = [r for r in rows if r["step_slack_s"] == slack]
        out["summary"].append({k: round(float(statistics.median(r[k] for r in mine)), 1) for k in mine[0]})
    print("step_slack_s | TTFA idle | TTFA joining p50 | TTFA joining p95 | p95 / idle | background chunks late")
    for r in out["summary"]:
        print(
            f"{r['step_slack_s']:>12} | {r['ttfa_idle_ms']:>6.1f} ms | {r['ttfa_under_load_ms']:>13.1f} ms | "
            f"{r['ttfa_under_load_p95_ms']:>13.1f} ms | {r['ttfa_under_load_p95_ms'] / r['ttfa_idle_ms']:>10.2f} | "
            f"{r['background_late_chunks']:.0f}"
        )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
