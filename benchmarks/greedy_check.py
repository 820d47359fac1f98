"""Greedy codes of the engine (its default configuration) against the official algorithm.

    python benchmarks/greedy_check.py --config mid/config.yaml [--threads 2] [--json out.json]

The official llama.cpp pipeline's algorithm, step by step, on our bridge (the oracle,
``streamtts/model/official.py``): the prompt prefilled in one decode, then one row per step;
text logits from the plain backbone GGUF's output layer, audio logits from the NumPy heads
(float32), the contract's scalar state machine (the official step transcribed,
``core.delay_state.official_step``). The engine runs as a user gets it (fused heads
written on first load, streaming or windowed codec), only with ``prefix_cache_mib: 0``
(the official pipeline feeds the prompt in one call) and greedy sampling. Prints, per
text, the number of frames and whether every code is equal; exits 1 on a difference.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import numpy as np

from streamtts import Engine
from streamtts.config import SamplingParams, load_config
from streamtts.demo.model import ensure_demo_model
from streamtts.model.official import official_greedy_frames
from streamtts.request import StreamOptions

TEXTS = [
    "Hello there, this is a streaming test.",
    "The quick brown fox jumps over the lazy dog, then naps in the warm afternoon sun.",
    "Short.",
    "Numbers like 42 and 1999 are read out, one word at a time, slowly and clearly.",
]


async def engine_frames(cfg_path: str, texts: list[str], threads: int, max_new: int) -> tuple[list[np.ndarray], dict[str, Any]]:
    opts = StreamOptions(sampling=SamplingParams.greedy(), seed=1, max_new_tokens=max_new)
    async with Engine.from_config(cfg_path, prefix_cache_mib=0, n_threads=threads, max_streams=1) as e:
        out = [(await e.generate(t, options=opts)).codes for t in texts]
        return out, dict(e.info)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="default: the demo model")
    ap.add_argument("--threads", type=int, default=1, help="llama.cpp threads, both sides")
    ap.add_argument("--max-new", type=int, default=400)
    ap.add_argument("--json")
    a = ap.parse_args()
    cfg_path = a.config or str(ensure_demo_model())
    cfg = load_config(cfg_path)
    got, info = asyncio.run(engine_frames(cfg_path, TEXTS, a.threads, a.max_new))
    rows = []
    for text, codes in zip(TEXTS, got, strict=True):
        ref = official_greedy_frames(cfg, text, a.max_new, threads=a.threads)
        same = codes.shape == ref.shape and bool(np.array_equal(codes, ref))
        first = -1
        if not same:
            n = min(codes.shape[0], ref.shape[0])
            diff = np.flatnonzero((codes[:n] != ref[:n]).any(axis=1))
            first = int(diff[0]) if diff.size else n
        rows.append({"text": text, "frames_engine": int(codes.shape[0]), "frames_official": int(ref.shape[0]),
                     "identical": same, "first_different_frame": first})  # fmt: skip
    report = {"config": cfg_path, "heads": info.get("heads"), "backbone": info.get("backbone"),
              "codec": info.get("codec"), "threads": a.threads, "texts": rows,
              "all_identical": all(r["identical"] for r in rows)}  # fmt: skip
    text = json.dumps(report, indent=2)
    print(text)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0 if report["all_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
