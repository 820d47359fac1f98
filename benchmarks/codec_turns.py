"""Does a CPU codec taking turns with the CPU backbone (``codec_turns``) make a stream faster?

    python benchmarks/codec_turns.py --config deep/config.yaml [--frames 200] [--reps 6]

Two engines on the same model in one process, one with ``codec_turns: always`` and one
with ``never``, speak the same fixed-length utterance alternately (``--reps`` times each,
``--streams`` at once), so drift on a shared machine spreads over both. Reports per
setting the median wall time per frame (submit to last audio, divided by frames), the
engine's own backbone ms/step and the ratio always / never (< 1: turns help).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

from streamtts import Engine
from streamtts.request import StreamOptions

TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away into the woods."


async def one(engine: Engine, streams: int, frames: int) -> float:
    t0 = time.perf_counter()
    await asyncio.gather(
        *(engine.generate(TEXT, options=StreamOptions(seed=s + 1, fixed_frames=frames)) for s in range(streams))
    )
    return (time.perf_counter() - t0) / (frames * streams)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    settings = ("always", "never")
    engines = {s: Engine.from_config(args.config, codec_turns=s, max_streams=args.streams) for s in settings}
    per_frame: dict[str, list[float]] = {s: [] for s in settings}
    backbone: dict[str, list[float]] = {s: [] for s in settings}
    for e in engines.values():
        await e.__aenter__()
    try:
        for e in engines.values():
            await one(e, args.streams, 20)  # warm
        for _ in range(args.reps):
            for s, e in engines.items():
                per_frame[s].append(1000.0 * await one(e, args.streams, args.frames))
                backbone[s].append(float(e.step_profile()["backbone"]))
        turns_on = {s: bool(e.info["codec_turns"]) for s, e in engines.items()}
    finally:
        for e in engines.values():
            await e.__aexit__(None, None, None)
    med = {s: statistics.median(v) for s, v in per_frame.items()}
    return {
        "config": args.config,
        "streams": args.streams,
        "frames": args.frames,
        "turns_on": turns_on,
        "ms_per_frame": {s: [round(x, 2) for x in v] for s, v in per_frame.items()},
        "median_ms_per_frame": {s: round(v, 2) for s, v in med.items()},
        "backbone_ms_per_step": {s: round(statistics.median(v), 2) for s, v in backbone.items()},
        "always_over_never": round(med["always"] / med["never"], 3),
    }


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=None, help="YAML config; default: the demo model")
    p.add_argument("--frames", type=int, default=200)
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--streams", type=int, default=1)
    p.add_argument("--json", default=None, help="also write the result here")
    a = p.parse_args()
    res = asyncio.run(main(a))
    text = json.dumps(res, indent=2)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
