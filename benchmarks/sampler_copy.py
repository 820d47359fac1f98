"""What the fused heads' extra copy of the audio logits costs against sampling them.

    python benchmarks/sampler_copy.py [--streams 64] [--iters 30]

With fused heads the engine copies each stream's 32 x 1025 audio logits out of its logits
row (2 text columns + the audio columns) into whole rows, then ``sample_rows`` samples
them (its own scratch copy, partition, comparison pass). Times both parts on this thread,
medians of ``--iters`` calls, with the engine's default audio sampling (temperature 1.7,
top-k 25, top-p 0.8). Reports; never asserts.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from streamtts.core.sampling import SamplerWorkspace, sample_rows

K, A = 32, 1025


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--iters", type=int, default=30)
    a = ap.parse_args()
    b, n = a.streams, a.streams * K
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((b, 2 + K * A)).astype(np.float32)  # the engine's rows
    rows = np.zeros((b, K * A), np.float32)
    ws = SamplerWorkspace()
    temp, top_k, top_p = np.full(n, 1.7, np.float32), np.full(n, 25), np.full(n, 0.8)
    copy_ms, sample_ms = [], []
    for _ in range(a.iters):
        t0 = time.perf_counter()
        np.copyto(rows, logits[:, 2:])
        t1 = time.perf_counter()
        sample_rows(rows.reshape(n, A), temp, top_k, top_p, rng.random(n), workspace=ws)
        t2 = time.perf_counter()
        copy_ms.append(1000 * (t1 - t0))
        sample_ms.append(1000 * (t2 - t1))
    c, s = float(np.median(copy_ms)), float(np.median(sample_ms))
    print(f"{b} streams x {K} rows: copy {c:.2f} ms, sampling {s:.2f} ms ({1000 * s / n:.2f} us a row); copy / total {c / (c + s):.2f}")


if __name__ == "__main__":
    main()
