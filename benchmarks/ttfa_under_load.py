"""First audio of a stream that joins a busy engine, with and without ``step_slack_s``.

    python benchmarks/ttfa_under_load.py [--config CFG] [--background 7] [--joiners 10]

``--background`` streams run (long, read as fast as produced, like a server pushing to
clients that buffer); once each is 1.5 s ahead of a real-time listener, ``--joiners``
streams join one after another (``streamtts bench --arrival joining``). With
``step_slack_s`` on, the background streams skip their steps during a newcomer's 32
steps to first audio, so its ticks hold one row instead of N + 1. Reported per setting:
TTFA on an idle engine, the joiners' TTFA p50/p95, and background chunks that would have
reached a real-time listener late. Settings alternate in one process, ``--rounds`` times.
A benchmark: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from typing import Any

from streamtts import Engine
from streamtts.cli.bench import run_level_joining
from streamtts.demo.model import ensure_demo_model

TEXT = "A stream joins the engine and says one sentence."


async def run(cfg: str, slack: float, n_bg: int, joiners: int, threads: int | None) -> dict[str, Any]:
    kw: dict[str, Any] = {"max_streams": n_bg + 1, "step_slack_s": slack}
    if threads:
        kw["n_threads"] = threads
    async with Engine.from_config(cfg, **kw) as e:
        await run_level_joining(e, 1, 3, TEXT, 1)  # warm-up
        idle = await run_level_joining(e, 1, 3, TEXT, joiners)
        busy = await run_level_joining(e, n_bg + 1, 3, TEXT, joiners)
    return {
        "step_slack_s": slack,
        "ttfa_idle_ms": idle["ttfa_ms_p50"],
        "ttfa_joining_p50_ms": busy["ttfa_ms_p50"],
        "ttfa_joining_p95_ms": busy["ttfa_ms_p95"],
        "late_background_chunks": busy["late_background_chunks"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="YAML config; default: the demo model")
    ap.add_argument("--background", type=int, default=7)
    ap.add_argument("--joiners", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2, help="off/on pairs, alternating")
    ap.add_argument("--n-threads", type=int)
    a = ap.parse_args()
    cfg = a.config or str(ensure_demo_model() / "config.yaml")
    runs = [
        asyncio.run(run(cfg, slack, a.background, a.joiners, a.n_threads))
        for _ in range(a.rounds)
        for slack in (0.0, 1.0)
    ]
    summary = []
    for slack in (0.0, 1.0):
        mine = [r for r in runs if r["step_slack_s"] == slack]
        summary.append({k: round(float(statistics.median(r[k] for r in mine)), 1) for k in mine[0]})
    print("step_slack_s | TTFA idle | TTFA joining p50 | TTFA joining p95 | p95 / idle | late background chunks")
    for r in summary:
        print(
            f"{r['step_slack_s']:>12} | {r['ttfa_idle_ms']:>6.1f} ms | {r['ttfa_joining_p50_ms']:>13.1f} ms | "
            f"{r['ttfa_joining_p95_ms']:>13.1f} ms | {r['ttfa_joining_p95_ms'] / r['ttfa_idle_ms']:>10.2f} | "
            f"{r['late_background_chunks']:.0f}"
        )
    print(json.dumps({"config": cfg, "background": a.background, "runs": runs, "summary": summary}))


if __name__ == "__main__":
    main()
