"""What the prompt-prefix cache saves: TTFA with and without it, alone and with N joining.

    python benchmarks/prefix_cache.py [--config CFG] [--voice-s 10] [--streams 4] [--reps 5]

For each of (no voice, a ``--voice-s`` reference voice) and cache (off, on), in one
process and interleaved: the median TTFA of one stream alone (with the cache on, the
prefix is already stored: the warm case), and the TTFA p95 of ``--streams`` streams
with different texts joining at once with that voice. Also the prompt rows computed
per stream. Prints a table and one JSON object. A benchmark: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from streamtts import Engine
from streamtts.demo.model import ensure_demo_model
from streamtts.request import StreamOptions


def write_voice(seconds: float, path: Path) -> Path:
    import soundfile as sf

    sr = 24000
    t = np.arange(int(sr * seconds)) / sr
    sf.write(path, 0.2 * np.sin(2 * np.pi * 190 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t)), sr)
    return path


async def first_audio(e: Engine, text: str, voice: Any, seed: int) -> tuple[float, int]:
    s = e.stream(text, reference=voice, options=StreamOptions(seed=seed, fixed_frames=2))
    async with s:
        async for _ in s:
            break
    return s.stats.ttfa_s * 1000.0, s.stats.prompt_rows - s.stats.prefix_cached_rows


async def run(cfg: str, mib: int, voice_path: Path | None, streams: int, reps: int, threads: int | None) -> dict[str, Any]:
    kw: dict[str, Any] = {"max_streams": streams, "prefix_cache_mib": mib}
    if threads:
        kw["n_threads"] = threads
    async with Engine.from_config(cfg, **kw) as e:
        voice = await e.encode_voice(str(voice_path)) if voice_path else None
        await first_audio(e, "Warm up.", voice, 0)  # also stores the prefix when the cache is on
        alone = [await first_audio(e, f"Sentence number {i} is spoken alone.", voice, i) for i in range(reps)]
        p95 = []
        for r in range(reps):
            res = await asyncio.gather(
                *(first_audio(e, f"Stream {i} of round {r} joins now.", voice, 100 + i) for i in range(streams))
            )
            p95.append(float(np.percentile([t for t, _ in res], 95)))
    return {
        "ttfa_alone_ms": round(statistics.median(t for t, _ in alone), 1),
        "rows_computed": int(statistics.median(n for _, n in alone)),
        f"ttfa_p95_{streams}_ms": round(statistics.median(p95), 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="YAML config; default: the demo model")
    ap.add_argument("--voice-s", type=float, default=10.0)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--n-threads", type=int)
    a = ap.parse_args()
    cfg = a.config or str(ensure_demo_model() / "config.yaml")
    out: dict[str, Any] = {"config": cfg, "voice_s": a.voice_s, "streams": a.streams, "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        voice = write_voice(a.voice_s, Path(tmp) / "voice.wav")
        for label, vp in (("no voice", None), (f"{a.voice_s:g} s voice", voice)):
            for mib in (0, 256):
                res = asyncio.run(run(cfg, mib, vp, a.streams, a.reps, a.n_threads))
                out["rows"].append({"prompt": label, "prefix_cache": "on" if mib else "off", **res})
    cols = list(out["rows"][0])
    print(" | ".join(cols))
    for row in out["rows"]:
        print(" | ".join(str(row[c]) for c in cols))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
