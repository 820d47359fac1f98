"""The CPU side of a tick on one core against several (issue 28): does it scale with cores?

Step by step:

1. ``streamtts bench --null-backbone --concurrency N --frames F`` (a zero-cost backbone: the
   sampling, state machines, embedding sums, frame routing and codec thread are all that
   run; ``--null-codec``: a zero-cost codec too, the tick's CPU side alone) under ``taskset -c ONE`` and under ``taskset -c MANY``, alternated ``--pairs`` times so
   the machine's drift spreads over both;
2. with ``--single-thread-too``, a third run on MANY cores with ``--tick-threads 1`` (the tick
   on the engine thread alone: what the pool's threads add);
3. prints each run's frames/s, ms/tick (wall time per tick of a stream, first audio to last:
   the steady state), ms/step (a tick's decode and sampling) and TTFA, then the medians of the per-pair
   ratios many/one (for ms figures one/many: above 1 is faster).

A benchmark: it reports, it asserts nothing. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

FIGURES = (
    ("aggregate_frames_per_s", "frames/s", False),
    ("ms_per_tick_p50", "ms/tick", True),
    ("ms_per_step_p50", "ms/step", True),
    ("ttfa_ms_p50", "TTFA p50 ms", True),
)


def bench(cpus: str, n: int, frames: int, config: str | None, tick_threads: int | None, null_codec: bool) -> dict[str, Any]:
    """One ``streamtts bench --null-backbone`` run pinned to ``cpus``: its level row."""
    with tempfile.TemporaryDirectory(prefix="tick-scaling-") as tmp:
        out = Path(tmp) / "bench.json"
        cmd = ["taskset", "-c", cpus, sys.executable, "-m", "streamtts", "bench", "--null-backbone",
               "--concurrency", str(n), "--frames", str(frames), "--json", str(out)]  # fmt: skip
        if config:
            cmd += ["--config", config]
        if tick_threads is not None:
            cmd += ["--tick-threads", str(tick_threads)]
        if null_codec:
            cmd += ["--null-codec"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        res = json.loads(out.read_text())
    row: dict[str, Any] = res["levels"][-1]
    row["tick_threads"] = res["engine"].get("tick_threads")
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--one", default="0", help="the one-core CPU list (taskset -c)")
    p.add_argument("--many", default="0,1", help="the many-core CPU list (taskset -c)")
    p.add_argument("--concurrency", type=int, default=128)
    p.add_argument("--frames", type=int, default=150)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--config", help="YAML config; default: the demo model")
    p.add_argument("--single-thread-too", action="store_true", help="also MANY cores with --tick-threads 1")
    p.add_argument("--null-codec", action="store_true", help="a zero-cost codec too: the tick's CPU side alone")
    p.add_argument("--json", help="write every run and the ratios to this file")
    args = p.parse_args()
    if not hasattr(os, "sched_getaffinity"):
        raise SystemExit("needs Linux (taskset)")
    runs: dict[str, list[dict[str, Any]]] = {"one": [], "many": [], "many_1thread": []}
    for i in range(args.pairs):
        order = ("one", "many") if i % 2 == 0 else ("many", "one")
        for kind in order:
            runs[kind].append(bench(getattr(args, kind), args.concurrency, args.frames, args.config, None, args.null_codec))
        if args.single_thread_too:
            runs["many_1thread"].append(bench(args.many, args.concurrency, args.frames, args.config, 1, args.null_codec))
    flags = "--null-backbone" + (" --null-codec" if args.null_codec else "")
    print(f"{args.concurrency} streams, {args.frames} frames, {flags}; one = cpus {args.one}, many = cpus {args.many}")
    for kind, rows in runs.items():
        for r in rows:
            cells = "  ".join(f"{label} {r[key]:.2f}" for key, label, _ in FIGURES)
            print(f"  {kind:<13} tick_threads {r['tick_threads']}:  {cells}")
    ratios: dict[str, float] = {}
    for key, label, lower_better in FIGURES:
        pairs = zip(runs["one"], runs["many"], strict=True)
        rs = [(a[key] / b[key]) if lower_better else (b[key] / a[key]) for a, b in pairs]
        ratios[key] = round(statistics.median(rs), 3)
        print(f"many / one, {label}: {', '.join(f'{r:.2f}' for r in rs)} (median {ratios[key]:.2f}x)")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs, "ratios": ratios}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
