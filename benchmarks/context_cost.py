"""Cost of the codec's left context: windowed (streaming) decode vs one offline decode.

    python benchmarks/context_cost.py [--config CFG] [--seconds 10]

For each left context (frames) it decodes an utterance the way the engine streams it
(chunks of 1, 2, 4, 8, 8, ... frames, each window = context + new frames) and reports the
total codec time against a single offline decode of the same codes, plus the largest
difference from the offline samples (0 when the context covers the decoder's receptive
field). With the demo codec the numbers show the bookkeeping cost; with the real decoder
(attention 10 s back per stage) they show the price of the default of 125 frames.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from streamtts.codec import load_decoder
from streamtts.config import load_config
from streamtts.demo.model import ensure_demo_model

FRAME = 1920


def stream_decode(dec: object, codes: np.ndarray, context: int, chunks: list[int]) -> tuple[np.ndarray, float, int]:
    out, t, i, k, windows = [], 0.0, 0, 0, 0
    while i < codes.shape[0]:
        n = min(chunks[min(k, len(chunks) - 1)], codes.shape[0] - i)
        left = max(0, i - context)
        w = codes[left : i + n][None]
        t0 = time.perf_counter()
        pcm = dec.decode(w)[0]  # type: ignore[attr-defined]
        t += time.perf_counter() - t0
        out.append(pcm[(i - left) * FRAME :])
        i += n
        k += 1
        windows += 1
    return np.concatenate(out), t, windows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--contexts", type=int, nargs="+", default=[0, 2, 3, 25, 50, 125])
    ap.add_argument("--chunks", type=int, nargs="+", default=[1, 2, 4, 8])
    a = ap.parse_args()
    cfg = load_config(a.config or ensure_demo_model())
    dec = load_decoder(cfg)
    frames = int(a.seconds * 12.5)
    codes = np.random.default_rng(0).integers(0, 1024, (frames, 32), dtype=np.int64)
    dec.decode(codes[None, :8])
    t0 = time.perf_counter()
    offline = dec.decode(codes[None])[0]
    t_off = time.perf_counter() - t0
    rows = []
    for c in a.contexts:
        pcm, t, windows = stream_decode(dec, codes, c, a.chunks)
        rows.append(
            {
                "context_frames": c,
                "windows": windows,
                "codec_ms": round(1000 * t, 2),
                "vs_offline": round(t / t_off, 2),
                "max_abs_diff_vs_offline": float(np.abs(pcm - offline).max()),
            }
        )
    print(json.dumps({"config": cfg.source, "seconds": a.seconds, "offline_ms": round(1000 * t_off, 2), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
