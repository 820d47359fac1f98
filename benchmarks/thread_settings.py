"""Spin or sleep, and who gets the cores: the engine's step under thread settings, one run.

    python benchmarks/thread_settings.py --config deep/config.yaml [--reps 3] [--json out.json]

On a 2-core machine the engine's tick is a llama.cpp decode (its thread pool), the audio
heads' matmul (our helper threads, or NumPy's BLAS threads), Python (sampling, state
machines), and the codec on the decode thread (ONNX Runtime's threads) whenever frames
are ready. Threads that spin while they wait steal the cores the next phase needs. Each
setting below runs a synth-like stream (fresh engine, default sampling, seed 1) of 100
and of 300 steps; the per-step slope, the engine's per-step profile and the TTFA of the
300-step run are reported as medians over the repetitions (settings interleaved).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_overhead import LONG, LONG_STEPS, SHORT_STEPS, emit  # noqa: E402

from streamtts import Engine  # noqa: E402
from streamtts.demo.model import ensure_demo_model  # noqa: E402
from streamtts.request import StreamOptions  # noqa: E402

SETTINGS: dict[str, dict[str, Any]] = {
    "default (workers sleep, heads on 2 helper threads)": {},
    "llama.cpp workers spin (thread_poll 50)": {"thread_poll": 50},
    "heads on 1 thread (heads_threads 1)": {"heads_threads": 1},
    "heads on 2 BLAS threads (blas_threads 2, heads_threads 1)": {"blas_threads": 2, "heads_threads": 1},
    "codec on 1 ONNX Runtime thread (codec_threads 1)": {"codec_threads": 1},
    "codec threads at nice 10 (codec_nice 10)": {"codec_nice": 10},
    "codec threads at nice 19 (codec_nice 19)": {"codec_nice": 19},
}


async def one(cfg: str, kw: dict[str, Any], steps: int) -> tuple[float, dict[str, float], float]:
    async with Engine.from_config(cfg, **kw) as e:
        s = e.stream(LONG, options=StreamOptions(seed=1, max_new_tokens=steps))
        async with s:
            async for _ in s:
                pass
        st = s.stats
        return st.t_done - st.t_submit, e.step_profile(), st.ttfa_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="default: the demo model")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp threads (fixed, so settings compare)")
    ap.add_argument("--json")
    ap.add_argument("--only", nargs="+", metavar="KEY", help="run only the settings whose name contains one of these (the default always)")
    a = ap.parse_args()
    cfg = a.config or str(ensure_demo_model())
    chosen = {k: v for k, v in SETTINGS.items() if not a.only or not v or any(o in k for o in a.only)}
    rows: dict[str, list[dict[str, float]]] = {k: [] for k in chosen}
    load0 = os.getloadavg()[0]
    for rep in range(a.reps):
        names = list(chosen) if rep % 2 == 0 else list(chosen)[::-1]
        for name in names:
            kw = {"n_threads": a.threads, **chosen[name]}
            w_short, _, _ = asyncio.run(one(cfg, kw, SHORT_STEPS))
            w_long, prof, ttfa = asyncio.run(one(cfg, kw, LONG_STEPS))
            row = {"slope_ms": 1000 * (w_long - w_short) / (LONG_STEPS - SHORT_STEPS), "ttfa_ms": 1000 * ttfa}
            row.update({f"profile_{k}_ms": v for k, v in prof.items()})
            rows[name].append(row)
            print(json.dumps({"rep": rep, "setting": name, **{k: round(v, 2) for k, v in row.items()}}), flush=True)
    report = {
        "config": cfg,
        "threads": a.threads,
        "reps": a.reps,
        "load_average_start_end": [round(load0, 2), round(os.getloadavg()[0], 2)],
        "settings": {
            name: {
                "kw": chosen[name],
                **{k: round(statistics.median(r[k] for r in rs), 2) for k in rs[0]},
                "slope_per_rep_ms": [round(r["slope_ms"], 2) for r in rs],
            }
            for name, rs in rows.items()
        },
    }
    emit(report, a.json)


if __name__ == "__main__":
    main()
