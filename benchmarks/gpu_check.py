"""The GPU check's measurements: one table of TTFA, per-step cost and the concurrency sweep.

Run by ``scripts/gpu_check.sh`` (which builds the CUDA bridge first). Steps:

1. a random model of the real shape (``streamtts/demo/random_quant.py``: 8B Qwen3, Q4_K_M blocks,
   real-sized npy tables), written once into the work folder;
2. ``streamtts convert``: the fused-heads GGUF;
3. the limit: a bare loop of single-row ``llama_decode`` calls through the bridge
   on the fused GGUF (embedding in, the engine's logit columns out), and the same
   on the original GGUF (whose output layer is the full 151936-row text head);
4. the engine, one stream at a time: TTFA p50 and per-step ms, fused heads (and
   NumPy heads for comparison), ratio to the bare loop;
5. ``streamtts bench`` at each concurrency level with fused heads.

``--shape tiny --gpu-layers 0`` runs the same pipeline on CPU (the script's own test).
Prints the table to stdout and writes JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's streamtts

from streamtts.demo import random_quant  # noqa: E402

TTFA_TARGET_MS = 120.0
OVERHEAD_TARGET = 1.03


def _p50(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def prepare(work: Path, shape_name: str, quant: str) -> tuple[Path, Path, float, float]:
    """Model + fused GGUF in ``work`` (reused when already there); (config, fused, s, s)."""
    from streamtts.convert.fused_writer import convert
    from streamtts.model.fused import fused_path_for

    marker = work / "random-model.json"
    shape = random_quant.SHAPES[shape_name]
    want = {"shape": shape.__dict__, "quant": quant, "seed": 0}
    t0 = time.monotonic()
    cfg = work / "config.yaml"
    if not (marker.is_file() and json.loads(marker.read_text()) == want and cfg.is_file()):
        work.mkdir(parents=True, exist_ok=True)
        cfg = random_quant.write_model(work, shape, quant)
    t_model = time.monotonic() - t0
    gguf = work / "MOSS-TTS-GGUF" / f"MOSS_TTS_{quant}.gguf"
    fused = fused_path_for(gguf)
    t0 = time.monotonic()
    if not fused.is_file():
        convert(gguf, work / "MOSS-TTS-GGUF" / "lm_heads")
    return cfg, fused, t_model, time.monotonic() - t0


def bare_decode(
    path: Path, gpu_layers: int, steps: int, fused: bool, threads: int = 0
) -> dict[str, float]:
    """Single-row decode loop through the bridge: the per-step floor the engine sits on."""
    from streamtts.core.tokens import TokenIds
    from streamtts.model.backbone import Backbone, BackboneParams
    from streamtts.model.fused import fused_columns

    ids = TokenIds()
    params = BackboneParams(
        model_path=str(path), n_ctx=1024, n_batch=512, n_gpu_layers=gpu_layers, n_threads=threads
    )
    with Backbone(params) as bb:
        cols = (
            fused_columns(bb, ids) if fused else np.array([ids.gen_slot, ids.delay_slot], np.int32)
        )
        bb.set_logit_columns(cols)
        h = bb.n_embd
        rng = np.random.default_rng(0)
        prompt = 64
        embd = np.ascontiguousarray(rng.standard_normal((prompt, h), dtype=np.float32) * 0.2)
        pos = np.arange(prompt, dtype=np.int32)
        seq = np.zeros(prompt, np.int32)
        out = np.zeros(prompt, np.int8)
        out[-1] = 1
        logits = np.zeros((1, cols.size), np.float32)
        t0 = time.perf_counter()
        bb.decode(embd, pos, seq, out, None, logits)
        prefill_ms = 1000 * (time.perf_counter() - t0)
        row = np.ascontiguousarray(embd[:1])
        p1 = np.zeros(1, np.int32)
        s1 = np.zeros(1, np.int32)
        o1 = np.ones(1, np.int8)
        times = []
        for i in range(steps):
            p1[0] = prompt + i
            t0 = time.perf_counter()
            bb.decode(row, p1, s1, o1, None, logits)
            times.append(1000 * (time.perf_counter() - t0))
        warm = times[min(5, len(times) // 4) :]  # first calls build CUDA graphs / warm caches
        return {
            "step_ms_p50": _p50(warm),
            "step_ms_min": min(warm),
            "prefill64_ms": prefill_ms,
            "n_vocab": bb.n_vocab,
        }


async def _engine_single(cfg: Path, frames: int, streams: int, **overrides: Any) -> dict[str, Any]:
    from streamtts import Engine
    from streamtts.request import StreamOptions

    text = "The quick brown fox jumps over the lazy dog, and then it runs away."
    ttfa: list[float] = []
    step: list[float] = []
    async with Engine.from_config(cfg, max_streams=1, **overrides) as engine:
        warm = await engine.generate(
            text, options=StreamOptions(seed=0, fixed_frames=min(frames, 8))
        )
        assert warm.stats.frames > 0
        for i in range(streams):
            syn = await engine.generate(
                text, options=StreamOptions(seed=1 + i, fixed_frames=frames)
            )
            d = syn.stats.as_dict()
            ttfa.append(d["ttfa_ms"])
            step.append(d["ms_per_step"])
        prof = engine.step_profile()
        info = dict(engine.info)
    return {
        "ttfa_ms_p50": _p50(ttfa),
        "step_ms_p50": _p50(step),
        "profile": prof,
        "heads": info.get("heads"),
    }


def engine_single(cfg: Path, frames: int, streams: int, **overrides: Any) -> dict[str, Any]:
    return asyncio.run(_engine_single(cfg, frames, streams, **overrides))


def bench(cfg: Path, levels: list[int], frames: int, out: Path, joining: bool = False) -> list[dict[str, Any]]:
    cmd = [
        sys.executable, "-m", "streamtts.cli.main", "bench", "--config", str(cfg),
        "--concurrency", *map(str, levels), "--frames", str(frames), "--json", str(out),
    ]  # fmt: skip
    cmd += ["--arrival", "joining", "--joiners", "5"] if joining else ["--kernel-bound"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"streamtts bench failed ({res.returncode}):\n{res.stderr[-3000:]}")
    levels_out: list[dict[str, Any]] = json.loads(out.read_text())["levels"]
    return levels_out


def write_run_config(
    base: Path, fused: Path, gpu_layers: int, work: Path, threads: int = 0
) -> Path:
    """The model's config plus the run settings (fused heads, offload, small per-stream KV)."""
    text = base.read_text(encoding="utf-8")
    text += (
        f"fused_gguf: {fused}\nheads_backend: fused\nn_gpu_layers: {gpu_layers}\n"
        "n_ctx: 1024\nn_batch: 512\nprefill_chunk: 512\nflash_attn: auto\n"
        f"n_threads: {threads}\n"
    )
    out = work / "gpu-check.yaml"
    out.write_text(text, encoding="utf-8")
    return out


def table(res: dict[str, Any]) -> str:
    rows: list[tuple[str, str]] = []
    add = rows.append
    add(("device", res["device"]))
    add(("model", f"{res['shape']} {res['quant']} random (fused: {res['fused_rows']} output rows)"))
    add(("setup: write model / convert", f"{res['t_model_s']:.1f} s / {res['t_convert_s']:.1f} s"))
    bf, bo = res["bare_fused"], res["bare_original"]
    add(
        (
            "bare llama.cpp step, fused GGUF",
            f"{bf['step_ms_p50']:.3f} ms (min {bf['step_ms_min']:.3f})",
        )
    )
    add(("bare llama.cpp step, original GGUF", f"{bo['step_ms_p50']:.3f} ms (full text head)"))
    ef = res["engine_fused"]
    ratio = ef["step_ms_p50"] / bf["step_ms_p50"]
    add(("engine 1 stream, fused: TTFA p50", f"{ef['ttfa_ms_p50']:.1f} ms"))
    add(("engine 1 stream, fused: step p50", f"{ef['step_ms_p50']:.3f} ms  (x{ratio:.3f} bare)"))
    prof = ef["profile"]
    add(("  step split (ms)", ", ".join(f"{k} {v:.3f}" for k, v in prof.items())))
    if res.get("engine_numpy"):
        en = res["engine_numpy"]
        add(
            (
                "engine 1 stream, numpy heads: TTFA / step",
                f"{en['ttfa_ms_p50']:.1f} ms / {en['step_ms_p50']:.3f} ms",
            )
        )
    for lv in res.get("bench", []) + res.get("bench_joining", []):
        add((
            f"bench {'joining' if lv.get('arrival') == 'joining' else 'concurrency'} {lv['concurrency']:>3}",
            f"{lv['aggregate_frames_per_s']:8.1f} frames/s  TTFA p50 {lv['ttfa_ms_p50']:7.1f} ms "
            f"p95 {lv['ttfa_ms_p95']:7.1f} ms  step p50 {lv['ms_per_step_p50']:7.2f} ms  "
            f"RTF p95 {lv['rtf_p95']:.3f}  real-time {lv['realtime_streams']}/{lv['concurrency']}  "
            f"x1 {lv.get('throughput_vs_1', float('nan')):.2f} (kernel {lv.get('kernel_throughput_vs_1', float('nan')):.2f})",
        ))  # fmt: skip
    if res["gpu"]:
        ok_ttfa = ef["ttfa_ms_p50"] <= TTFA_TARGET_MS
        ok_step = ratio <= OVERHEAD_TARGET
        add(("target TTFA p50 <= 120 ms", "PASS" if ok_ttfa else "FAIL"))
        add(("target engine step <= 1.03 x bare", "PASS" if ok_step else "FAIL"))
        for key, how in (("bench", "all start at once"), ("bench_joining", "joining N-1 running")):
            top = max(res.get(key, []), key=lambda lv: lv["concurrency"], default=None)
            if top is not None and top["concurrency"] >= 64:
                ok = top["realtime_streams"] >= 64 and top["ttfa_ms_p95"] <= 300.0
                add((f"target 64 real-time streams, TTFA p95 <= 300 ms ({how})", "PASS" if ok else "FAIL"))
    else:
        add(("targets", "n/a (CPU dry run)"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--work", default="gpu-check-work", help="folder for the model (reused between runs)"
    )
    ap.add_argument("--shape", choices=sorted(random_quant.SHAPES), default="8b")
    ap.add_argument("--quant", choices=["Q4_K_M", "Q4_0"], default="Q4_K_M")
    ap.add_argument("--gpu-layers", type=int, default=-1)
    ap.add_argument("--bare-steps", type=int, default=200)
    ap.add_argument("--streams", type=int, default=5, help="single-stream runs for the p50")
    ap.add_argument("--frames", type=int, default=50)
    ap.add_argument("--concurrency", type=int, nargs="*", default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument(
        "--threads", type=int, default=0, help="llama.cpp CPU threads (0 = physical cores)"
    )
    ap.add_argument(
        "--no-numpy-heads", action="store_true", help="skip the NumPy-heads comparison run"
    )
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)

    import logging

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from streamtts.model import _llama

    work = Path(args.work).resolve()
    cfg, fused, t_model, t_conv = prepare(work, args.shape, args.quant)
    gpu = args.gpu_layers != 0
    res: dict[str, Any] = {
        "device": _device_name() if gpu else "CPU",
        "bridge": _llama.bridge_version(),
        "gpu": gpu,
        "shape": args.shape,
        "quant": args.quant,
        "t_model_s": t_model,
        "t_convert_s": t_conv,
    }
    original = work / "MOSS-TTS-GGUF" / f"MOSS_TTS_{args.quant}.gguf"
    res["bare_fused"] = bare_decode(
        fused, args.gpu_layers, args.bare_steps, fused=True, threads=args.threads
    )
    res["fused_rows"] = res["bare_fused"]["n_vocab"]
    res["bare_original"] = bare_decode(
        original, args.gpu_layers, args.bare_steps, fused=False, threads=args.threads
    )
    run_cfg = write_run_config(cfg, fused, args.gpu_layers, work, args.threads)
    res["engine_fused"] = engine_single(run_cfg, args.frames, args.streams)
    if not args.no_numpy_heads:
        res["engine_numpy"] = engine_single(
            run_cfg, args.frames, args.streams, heads_backend="numpy"
        )
    if args.concurrency:
        res["bench"] = bench(run_cfg, args.concurrency, args.frames, work / "bench.json")
        # the top level again with streams joining a busy engine (the serving case)
        top = max(args.concurrency)
        res["bench_joining"] = bench(run_cfg, [top], args.frames, work / "bench-joining.json", joining=True)
    print(table(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2, default=str) + "\n", encoding="utf-8")
    return 0


def _device_name() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
        return (
            out.stdout.strip().splitlines()[0] if out.returncode == 0 else "GPU (nvidia-smi failed)"
        )
    except (OSError, subprocess.SubprocessError, IndexError):
        return "GPU (unknown)"


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
