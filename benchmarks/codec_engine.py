"""The engine with the real codec architecture: streaming (exact, stateful) vs windowed decoding.

    python benchmarks/codec_engine.py [--preset mid] [--width 64] [--layers 2,1,1,1]
                                      [--streams 1 4] [--frames 100] [--reps 3] [--json out.json]

Writes a demo model (``--preset``) whose codec is the real MOSS-Audio-Tokenizer decoder
architecture at ``--width`` (random weights; ``--layers`` per stage), then, in one process and
interleaved repeat by repeat, runs N concurrent fixed-length streams with the engine decoding
(a) with ``decoder_streaming.onnx`` and (b) in windows of 125 frames of left context with the
stateless ``decoder.onnx`` (``codec_streaming: off``). Reports, per path and N: TTFA p50/p95,
engine ms per step (the backbone's tick, the decode thread shares the cores), codec ms per
80 ms frame (decode thread busy time over frames delivered), and the ratios between the paths.
A benchmark: it asserts nothing.
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
from streamtts.demo.model import write_demo_model
from streamtts.demo.real_codec import demo_codec_config, write_real_codec
from streamtts.request import StreamOptions

TEXT = "Streaming speech, decoded frame by frame as it is generated."


def prepare(root: Path, preset: str, width: int, layers: tuple[int, int, int, int]) -> Path:
    cfg = write_demo_model(root, preset, seed=0)  # tone codec first: then replace the decoder
    write_real_codec(root / "MOSS-Audio-Tokenizer-ONNX", root / "MOSS-Audio-Tokenizer",
                     config=demo_codec_config(width, layers))  # fmt: skip
    return cfg


async def one_level(cfg: Path, streaming: bool, n: int, frames: int, rep: int) -> dict[str, Any]:
    kw: dict[str, Any] = {"max_streams": max(n, 1), "codec_streaming": "" if streaming else "off"}
    async with Engine.from_config(cfg, **kw) as e:
        assert e.info["codec"] == ("streaming" if streaming else "windowed"), e.info["codec"]
        await collect(e, 0, 8)  # warm up (sessions, first allocations)
        worker = e._decoder
        busy0, frames0 = worker.busy_s, 0
        stats = await asyncio.gather(*(collect(e, 100 * rep + i, frames) for i in range(n)))
        delivered = sum(s.frames for s in stats) - frames0
        return {
            "ttfa_ms": [1000 * s.ttfa_s for s in stats],
            "ms_per_step": statistics.median(s.ms_per_step for s in stats),
            "codec_ms_per_frame": 1000 * (worker.busy_s - busy0) / max(delivered, 1),
            "rtf": statistics.median(s.rtf for s in stats),
        }


async def collect(e: Engine, seed: int, frames: int) -> Any:
    s = e.stream(TEXT, options=StreamOptions(seed=seed, fixed_frames=frames))
    async with s:
        async for _ in s:
            pass
    return s.stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="mid", choices=["tiny", "mid"])
    ap.add_argument("--width", type=int, default=64, help="codec stage-1 width (published: 1280)")
    ap.add_argument("--layers", default="2,1,1,1", help="codec layers per stage (published: 32,12,12,12)")
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--frames", type=int, default=100)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--workdir", help="keep the model here (default: a temporary folder)")
    ap.add_argument("--json", help="also write the raw numbers here")
    a = ap.parse_args()
    layers = tuple(int(x) for x in a.layers.split(","))
    assert len(layers) == 4, "--layers takes four numbers"
    work = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="codec-engine-"))
    cfg = prepare(work, a.preset, a.width, layers)  # type: ignore[arg-type]
    raw: dict[str, list[dict[str, Any]]] = {}
    for rep in range(a.reps):  # interleaved: both paths see the same machine state
        for n in a.streams:
            for streaming in (True, False):
                key = f"{'streaming' if streaming else 'windowed'}/{n}"
                raw.setdefault(key, []).append(asyncio.run(one_level(cfg, streaming, n, a.frames, rep)))
    rows = []
    print(f"demo {a.preset}, codec width {a.width} layers {a.layers}, {a.frames} frames per stream, "
          f"{a.reps} interleaved repeats (medians)")  # fmt: skip
    print(f"{'path':<10} {'N':>3} {'TTFA p50':>9} {'TTFA p95':>9} {'ms/step':>8} {'codec ms/frame':>15} {'RTF':>6}")
    summary: dict[str, dict[str, float]] = {}
    for key, runs in raw.items():
        path, n = key.split("/")
        ttfa = [t for r in runs for t in r["ttfa_ms"]]
        row = {
            "ttfa_p50": float(np.percentile(ttfa, 50)),
            "ttfa_p95": float(np.percentile(ttfa, 95)),
            "ms_per_step": statistics.median(r["ms_per_step"] for r in runs),
            "codec_ms_per_frame": statistics.median(r["codec_ms_per_frame"] for r in runs),
            "rtf": statistics.median(r["rtf"] for r in runs),
        }
        summary[key] = row
        rows.append(row)
        print(f"{path:<10} {n:>3} {row['ttfa_p50']:>9.0f} {row['ttfa_p95']:>9.0f} {row['ms_per_step']:>8.1f} "
              f"{row['codec_ms_per_frame']:>15.2f} {row['rtf']:>6.3f}")  # fmt: skip
    for n in a.streams:
        s, w = summary[f"streaming/{n}"], summary[f"windowed/{n}"]
        print(f"N={n}: windowed / streaming: codec per frame {w['codec_ms_per_frame'] / s['codec_ms_per_frame']:.1f}x, "
              f"TTFA p50 {w['ttfa_p50'] / s['ttfa_p50']:.2f}x, ms/step {w['ms_per_step'] / s['ms_per_step']:.2f}x")  # fmt: skip
    if a.json:
        Path(a.json).write_text(json.dumps({"summary": summary, "raw": raw}, indent=2))


if __name__ == "__main__":
    main()
