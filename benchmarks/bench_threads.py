"""Measure how llama.cpp's CPU threads and NumPy's BLAS threads get in each other's way.

The engine's tick is: backbone decode (llama.cpp threads) -> NumPy head matmuls
(BLAS threads) -> decode -> ... Threads that spin-wait after their work steal the
cores the other side needs. This times each part alone and the interleaved loop,
for one bridge build and thread_poll setting per process:

    python native/bench_threads.py --lib <bridge .so> --poll 0|50|none [--blas-threads N]

Prints one JSON line: decode ms, matmul ms, interleaved step ms, and
step / (decode + matmul) (1.0 = no interference).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--poll", default="0", help="0..100 or none (llama.cpp's default threads)")
    ap.add_argument("--blas-threads", type=int, default=0, help="0 = NumPy's default")
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp threads")
    ap.add_argument("--rows", type=int, default=4, help="rows per decode (streams)")
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument(
        "--model", default="", help="GGUF to use (default: write a 1024-wide 8-layer one)"
    )
    args = ap.parse_args()
    os.environ["STREAMTTS_BRIDGE_LIB"] = args.lib

    import numpy as np
    from threadpoolctl import threadpool_limits

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from streamtts.convert.qwen3_gguf import Qwen3Shape
    from streamtts.demo.gguf_writer import random_qwen3_tensors, write_qwen3_gguf
    from streamtts.model.backbone import Backbone, BackboneParams

    model = args.model
    if not model:
        shape = Qwen3Shape(
            n_embd=1024, n_layer=8, n_head=16, n_head_kv=8, head_dim=64, n_ff=3072, n_vocab=4096
        )
        model = str(Path(tempfile.gettempdir()) / "streamtts-bench-1024x8.gguf")
        if not Path(model).exists():
            rng = np.random.default_rng(0)
            out = rng.standard_normal((shape.n_vocab, shape.n_embd), dtype=np.float32) * 0.02
            write_qwen3_gguf(model, shape, random_qwen3_tensors(shape), output=out)

    poll = None if args.poll == "none" else int(args.poll)
    n = args.rows
    with Backbone(
        BackboneParams(
            model_path=model,
            n_ctx=4096,
            n_batch=64,
            n_seq_max=n,
            n_threads=args.threads,
            thread_poll=poll,
        )
    ) as b:
        rng = np.random.default_rng(1)
        heads = (
            rng.standard_normal((b.n_embd, 32 * 1025), dtype=np.float32) * 0.02
        )  # 32 audio heads
        embd = rng.standard_normal((n, b.n_embd), dtype=np.float32)
        pos = np.zeros(n, np.int32)
        seq = np.arange(n, dtype=np.int32)
        out = np.ones(n, np.int8)
        hid = np.zeros((n, b.n_embd), np.float32)
        lg = np.zeros((n, 8), np.float32)
        b.set_logit_columns(np.arange(8))
        b.bind(embd, pos, seq, out, hid, lg)
        state = {"p": 0}

        def decode() -> None:
            pos[:] = state["p"]
            state["p"] += 1
            b.decode_bound(n)

        def heads_mm() -> None:
            np.matmul(hid, heads)

        def timeit(fn: object, iters: int) -> float:
            assert callable(fn)
            fn()
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            return (time.perf_counter() - t0) / iters * 1e3

        def step() -> None:
            decode()
            heads_mm()

        limits = {"limits": args.blas_threads} if args.blas_threads else {}
        with threadpool_limits(**limits):  # type: ignore[arg-type]
            t_dec = timeit(decode, args.iters)
            t_mm = timeit(heads_mm, args.iters)
            t_step = timeit(step, args.iters)
            # once more, in another order, to average out drift
            t_step2 = timeit(step, args.iters)
            t_dec2 = timeit(decode, args.iters)
            t_mm2 = timeit(heads_mm, args.iters)
    dec, mm, st = (t_dec + t_dec2) / 2, (t_mm + t_mm2) / 2, (t_step + t_step2) / 2
    print(
        json.dumps(
            {
                "lib": Path(args.lib).parent.parent.name,
                "poll": args.poll,
                "threads": args.threads,
                "blas_threads": args.blas_threads or "default",
                "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
                "decode_ms": round(dec, 3),
                "matmul_ms": round(mm, 3),
                "step_ms": round(st, 3),
                "step_over_sum": round(st / (dec + mm), 3),
            }
        )
    )


if __name__ == "__main__":
    main()
