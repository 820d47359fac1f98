"""TTFA when a busy process starts on one core after the engine loaded, per thread setting.

    python benchmarks/late_neighbour.py --config mid/config.yaml --alone 4

For each of ``--threads`` (default: 0, the automatic count with the engine choosing each
decode's threads, then 2 and 1): load an engine, time ``--alone`` streams of ``--frames``
frames one after another, start ``python -c 'while True: pass'`` pinned to core ``--core``
(``taskset``), and time three times as many. Prints one JSON line per setting: the median
TTFA alone, of the first ``--alone`` streams with the neighbour, of the rest, and the thread
counts the engine chose (``Engine.threads_chosen``). The automatic count is decided at load
(``model/threads.py``), before the neighbour starts: what follows is the engine's own choice.
Needs ``taskset`` (util-linux) and at least 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from typing import Any

from streamtts import Engine
from streamtts.request import StreamOptions

TEXT = "A sentence for the neighbour test, of some length."


async def ttfas(e: Engine, n: int, frames: int, seed0: int) -> list[float]:
    out = []
    for i in range(n):
        t0, first = time.monotonic(), None
        async for _ in e.stream(TEXT, options=StreamOptions(seed=seed0 + i, fixed_frames=frames)):
            if first is None:
                first = time.monotonic() - t0
        assert first is not None
        out.append(round(1000 * first, 1))
    return out


async def one(a: argparse.Namespace, threads: int) -> dict[str, Any]:
    async with Engine.from_config(a.config, n_threads=threads, max_streams=4) as e:
        alone = await ttfas(e, a.alone, a.frames, 100)
        hog = subprocess.Popen(["taskset", "-c", str(a.core), sys.executable, "-c", "while True: pass"])
        try:
            await asyncio.sleep(0.5)
            busy = await ttfas(e, 3 * a.alone, a.frames, 200)
        finally:
            hog.kill()
            hog.wait()
        return {
            "n_threads": threads,
            "alone_ms": statistics.median(alone),
            "neighbour_first_ms": statistics.median(busy[: a.alone]),
            "neighbour_rest_ms": statistics.median(busy[a.alone :]),
            "threads_chosen": e.threads_chosen(),
        }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=None, help="model config (default: the demo model)")
    p.add_argument("--threads", type=int, nargs="+", default=[0, 2, 1])
    p.add_argument("--alone", type=int, default=8, help="streams timed alone (3x as many with the neighbour)")
    p.add_argument("--frames", type=int, default=60)
    p.add_argument("--core", type=int, default=1, help="the core the neighbour is pinned to")
    a = p.parse_args(argv)
    for threads in a.threads:
        print(json.dumps(asyncio.run(one(a, threads))), flush=True)


if __name__ == "__main__":
    main()
