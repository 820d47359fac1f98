"""The GPU check's measurements: one table of TTFA, per-step cost and the concurrency sweep.

Run by ``scripts/gpu_check.sh`` (which builds the CUDA bridge first). Steps:

1. a random model of the real shape (``streamtts/demo/random_quant.py``: 8B Qwen3, Q4_K_M blocks,
   real-sized npy tables), written once into the work folder;
2. ``streamtts convert``: the fused-heads GGUF;
3. the limit: a bare loop of single-row ``llama_decode`` calls through the bridge
   on the fused GGUF (embedding in, the engine's logit columns out), and the same
   on the original GGUF (whose output layer is the full 151936-row text head);
4. the engine, one stream at a time: TTFA p50 and per-step ms, fused heads (and
   NumPy heads for comparison), ratio to the bare loop; then twice the load it can carry
   (``engine_load.py``: Poisson arrivals of 2-12 s streams, real-time listeners, admission
   by measured capacity; the capacity it found, C50/C100/C200, TTFA, refusal times, memory);
5. ``streamtts bench`` at each concurrency level with fused heads and the tone codec (the
   backbone alone: that codec costs next to nothing), the top level again with streams
   joining a busy engine;
6. ``streamtts bench --null-backbone`` (a zero-cost backbone: the CPU side of a tick), then
   with ``--null-codec`` too (the tick alone), on the tick's threads and on one;
7. memory per stream: fresh processes holding 1 and N slots (GPU memory, else RSS);
8. the same levels with the real codec architecture (random weights, ``--codec-scale`` of
   the published width) on ONNX Runtime CPU over all cores.

The stages run in order of importance; with ``--deadline`` one that would start too late is
skipped, and the table says so. ``--json`` is rewritten after every stage, and
``--table-from`` prints the table of such a file (scripts/gpu_check.sh prints it last).
``--shape tiny --gpu-layers 0`` runs the same pipeline on CPU (the script's own test).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("gpu_check")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # this checkout's streamtts

from streamtts.demo import random_quant  # noqa: E402

TTFA_TARGET_MS = 120.0
# the load stage (issue 39's GPU stage): twice the capacity the probe finds, streams of 2-12
# s, at most 256 at once (llama.cpp's sequence limit)
LOAD_STAGE = "--load 2 --max-streams 256 --probe 20 --duration 40 --min-s 2 --max-s 12"
OVERHEAD_TARGET = 1.03


def _p50(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def prepare(work: Path, shape_name: str, quant: str) -> tuple[Path, Path, float, float]:
    """Model + fused GGUF in ``work`` (reused when already there); (config, fused, s, s)."""
    from streamtts.convert.fused_writer import convert
    from streamtts.model.fused import fused_path_for

    marker = work / "random-model.json"
    shape = random_quant.SHAPES[shape_name]
    want = {"shape": shape.__dict__, "quant": quant, "seed": 0, "n_vq": 32}
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
        "logits": info.get("logits"),  # lent: the step read llama.cpp's own rows (stt_decode_lend)
    }


def engine_single(cfg: Path, frames: int, streams: int, **overrides: Any) -> dict[str, Any]:
    return asyncio.run(_engine_single(cfg, frames, streams, **overrides))


def bench(
    cfg: Path, levels: list[int], frames: int, out: Path, *, joining: bool = False,
    kernel: bool = True, null_backbone: bool = False, null_codec: bool = False,
    tick_threads: int | None = None, timeout: float | None = None,
) -> list[dict[str, Any]]:
    cmd = [
        sys.executable, "-m", "streamtts.cli.main", "bench", "--config", str(cfg),
        "--concurrency", *map(str, levels), "--frames", str(frames), "--json", str(out),
    ]  # fmt: skip
    if joining:
        cmd += ["--arrival", "joining", "--joiners", "5"]
    elif null_backbone:
        cmd += ["--null-backbone"] + (["--null-codec"] if null_codec else [])
        cmd += [] if tick_threads is None else ["--tick-threads", str(tick_threads)]
    elif kernel:
        cmd += ["--kernel-bound"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"streamtts bench failed ({res.returncode}):\n{res.stderr[-3000:]}")
    levels_out: list[dict[str, Any]] = json.loads(out.read_text())["levels"]
    return levels_out


def load(cfg: Path, stage_args: list[str], deadline_s: float, out: Path, timeout: float | None) -> dict[str, Any]:
    """benchmarks/engine_load.py with ``stage_args``: Poisson arrivals at multiples of the
    capacity the engine finds (admission by capacity), real-time listeners, fixed-length
    streams; a wait for a slot of at most ``deadline_s``."""
    cmd = [
        sys.executable, str(HERE / "engine_load.py"), "--config", str(cfg), "--pause", "2",
        *stage_args, "--deadline-s", f"{deadline_s:.3f}", "--out", str(out),
    ]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"engine_load.py failed ({res.returncode}):\n{res.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def real_codec(work: Path, scale: str) -> tuple[Path, float]:
    """The real decoder architecture with random weights (offline + exact streaming graphs):
    ``scale`` of the published widths (same depth, contexts and I/O), or ``tiny`` (the demo's)."""
    from streamtts.codec.build.random_ckpt import scale_config
    from streamtts.demo.real_codec import write_real_codec

    out = work / f"codec-real-{scale}"
    onnx_dir, ckpt = out / "onnx", out / "MOSS-Audio-Tokenizer"
    t0 = time.monotonic()
    if not (onnx_dir / "decoder_streaming.onnx").is_file():
        config = None
        if scale != "tiny":
            published = HERE.parent / "tests" / "fixtures" / "codec" / "published-config.json"
            config = scale_config(json.loads(published.read_text()), float(scale))
        write_real_codec(onnx_dir, ckpt, config=config)
    return onnx_dir, time.monotonic() - t0


def memory_probe(cfg: Path, streams: int) -> dict[str, float]:
    """Memory of a fresh process holding an engine of ``streams`` slots after one stream."""
    code = (
        "import asyncio, json, os, subprocess, sys\n"
        "from streamtts import Engine\n"
        "from streamtts.request import StreamOptions\n"
        "async def main():\n"
        f"    async with Engine.from_config({str(cfg)!r}, max_streams={streams}) as e:\n"
        "        await e.generate('Memory probe.', options=StreamOptions(seed=0, fixed_frames=4))\n"
        "        info = dict(e.info)\n"
        "        rss = int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1]) / 1024\n"
        "        gpu = None\n"
        "        try:\n"
        "            q = subprocess.run(['nvidia-smi', '--query-compute-apps=pid,used_memory',\n"
        "                '--format=csv,noheader,nounits'], capture_output=True, text=True, timeout=20).stdout\n"
        "            mine = [float(l.split(',')[1]) for l in q.splitlines() if l.split(',')[0].strip() == str(os.getpid())]\n"
        "            if mine:\n"
        "                gpu = sum(mine)\n"
        "            else:\n"
        "                q = subprocess.run(['nvidia-smi', '--query-gpu=memory.used', '--format=csv,noheader,nounits'],\n"
        "                    capture_output=True, text=True, timeout=20).stdout\n"
        "                gpu = float(q.split()[0]) if q.strip() else None\n"
        "        except (OSError, subprocess.SubprocessError, ValueError, IndexError):\n"
        "            pass\n"
        "        print(json.dumps({'rss_mib': rss, 'gpu_mib': gpu,\n"
        "            'kv_mib_per_stream': info.get('kv_cache_mib_per_stream')}))\n"
        "asyncio.run(main())\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"memory probe ({streams} streams) failed:\n{res.stderr[-3000:]}")
    out: dict[str, float] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


def write_run_config(
    base: Path, fused: Path, gpu_layers: int, work: Path, threads: int = 0,
    codec: Path | None = None, name: str = "gpu-check.yaml",
) -> Path:
    """The model's config plus the run settings (fused heads, offload, small per-stream KV);
    ``codec``: a folder with decoder.onnx + decoder_streaming.onnx to decode with instead."""
    text = base.read_text(encoding="utf-8")
    text += (
        f"fused_gguf: {fused}\nheads_backend: fused\nn_gpu_layers: {gpu_layers}\n"
        "n_ctx: 1024\nn_batch: 512\nprefill_chunk: 512\nflash_attn: auto\n"
        f"n_threads: {threads}\n"
    )
    if codec is not None:
        text = "\n".join(ln for ln in text.splitlines() if not ln.startswith("audio_decoder_onnx:"))
        text += (
            f"\naudio_decoder_onnx: {codec / 'decoder.onnx'}\n"
            f"codec_streaming: {codec / 'decoder_streaming.onnx'}\ncodec_threads: 0\n"
        )
    out = work / name
    out.write_text(text, encoding="utf-8")
    return out


def _bench_rows(label: str, levels: list[dict[str, Any]]) -> list[tuple[str, str]]:
    rows = []
    for lv in levels:
        kern = lv.get("kernel_throughput_vs_1")
        rows.append((
            f"{label} {lv['concurrency']:>3}",
            f"{lv['aggregate_frames_per_s']:8.1f} frames/s  TTFA p50 {lv['ttfa_ms_p50']:7.1f} ms "
            f"p95 {lv['ttfa_ms_p95']:7.1f} ms  step p50 {lv['ms_per_step_p50']:7.2f} ms  "
            f"tick p50 {lv.get('ms_per_tick_p50', float('nan')):7.2f} ms  "
            f"RTF p95 {lv['rtf_p95']:.3f}  real-time {lv['realtime_streams']}/{lv['concurrency']}"
            + (f"  x1 {lv.get('throughput_vs_1', float('nan')):.2f} (kernel {kern:.2f})" if kern is not None else ""),
        ))  # fmt: skip
    return rows


def _load_rows(ld: dict[str, Any] | None) -> list[tuple[str, str]]:
    if not ld:
        return []
    cal = ld["calibration"]
    lo, hi = ld["stream_s"]
    rows = [(
        "load: capacity found",
        f"{cal['capacity_streams']} streams (hard cap {ld['max_streams']}); unloaded TTFA {cal['ttfa_ms_median']} ms; "
        f"streams of {lo:g}-{hi:g} s, a wait for a slot at most {1000 * ld['deadline_s']:.0f} ms",
    )]  # fmt: skip
    for lv in [ld["probe"]] if "probe" in ld else []:
        rows.append(("load probe (hard cap's rate)", _load_line(lv)))
    for lv in ld["levels"]:
        rows.append((f"load {lv['load']:g}x", _load_line(lv)))
    return rows


def _load_line(lv: dict[str, Any]) -> str:
    rss = lv.get("rss_mb_samples") or []
    return (
        f"{lv['done']}/{lv['sessions']} done, {lv['refused']} refused, {lv['failed']} failed"
        + (f" {lv['failures']}" if lv["failures"] else "")
        + f"; carried {lv['carried_streams']} streams; "
        f"C50/C100/C200 {lv.get('c50')}/{lv.get('c100')}/{lv.get('c200')}, "
        f"longest underrun p95 {lv.get('underrun_ms_p95')} ms; TTFA p50/p95 {lv['ttfa_ms_p50']}/{lv['ttfa_ms_p95']} ms"
        + (f" (x{lv['ttfa_p95_over_unloaded']} unloaded)" if "ttfa_p95_over_unloaded" in lv else "")
        + f"; refusals p50/max {lv['refusal_ms_p50']}/{lv['refusal_ms_max']} ms"
        + (f"; RSS {rss[0]} -> {rss[-1]} MiB" if rss else "")
    )  # fmt: skip


def table(res: dict[str, Any]) -> str:
    """One table from the stages' results (a stage that did not run says why)."""
    rows: list[tuple[str, str]] = []
    add = rows.append
    add(("device", res["device"]))
    if "fused_rows" in res:
        add(("model", f"{res['shape']} {res['quant']} random (fused: {res['fused_rows']} output rows)"))
    else:
        add(("model", f"{res['shape']} {res['quant']} random"))
    if "t_model_s" in res:
        add(("setup: write model / convert", f"{res['t_model_s']:.1f} s / {res['t_convert_s']:.1f} s"))
    for name, why in res.get("skipped", {}).items():
        add((f"not measured: {name}", why))
    bf, bo = res.get("bare_fused"), res.get("bare_original")
    if bf:
        add(("bare llama.cpp step, fused GGUF", f"{bf['step_ms_p50']:.3f} ms (min {bf['step_ms_min']:.3f})"))
    if bo:
        add(("bare llama.cpp step, original GGUF", f"{bo['step_ms_p50']:.3f} ms (full text head)"))
    ef = res.get("engine_fused")
    if ef:
        ratio = ef["step_ms_p50"] / bf["step_ms_p50"] if bf else float("nan")
        add(("engine 1 stream, fused: TTFA p50", f"{ef['ttfa_ms_p50']:.1f} ms (logits {ef.get('logits')})"))
        add(("engine 1 stream, fused: step p50", f"{ef['step_ms_p50']:.3f} ms  (x{ratio:.3f} bare)"))
        add(("  step split (ms)", ", ".join(f"{k} {v:.3f}" for k, v in ef["profile"].items())))
    en = res.get("engine_numpy")
    if en:
        add(("engine 1 stream, numpy heads: TTFA / step", f"{en['ttfa_ms_p50']:.1f} ms / {en['step_ms_p50']:.3f} ms"))
    rows += _bench_rows("bench concurrency", res.get("bench", []))
    rows += _bench_rows("bench joining", res.get("bench_joining", []))
    rows += _load_rows(res.get("load"))
    if "codec" in res:
        add(("codec for the next rows", res["codec"]))
    rows += _bench_rows("bench real codec", res.get("bench_codec", []))
    rows += _bench_rows("bench null backbone (CPU side)", res.get("bench_null", []))
    rows += _bench_rows("bench null backbone + codec (the tick alone)", res.get("bench_tick", []))
    rows += _bench_rows("  the same, --tick-threads 1", res.get("bench_tick_1thread", []))
    mem = res.get("memory")
    if mem:
        unit = "GPU" if mem.get("gpu_mib_per_stream") is not None else "RSS"
        per = mem.get("gpu_mib_per_stream") if unit == "GPU" else mem.get("rss_mib_per_stream")
        add((
            f"{unit} memory per stream",
            f"{per:.1f} MiB ({mem['streams'][0]} vs {mem['streams'][1]} streams; KV cache alone "
            f"{mem.get('kv_mib_per_stream')} MiB)",
        ))  # fmt: skip
    if res["gpu"] and ef:
        ratio = ef["step_ms_p50"] / bf["step_ms_p50"] if bf else float("nan")
        add(("target TTFA p50 <= 120 ms", "PASS" if ef["ttfa_ms_p50"] <= TTFA_TARGET_MS else "FAIL"))
        add(("target engine step <= 1.03 x bare", "PASS" if ratio <= OVERHEAD_TARGET else "FAIL"))
        for key, how in (("bench", "all start at once"), ("bench_joining", "joining N-1 running")):
            top = max(res.get(key, []), key=lambda lv: lv["concurrency"], default=None)
            if top is not None and top["concurrency"] >= 64:
                ok = top["realtime_streams"] >= 64 and top["ttfa_ms_p95"] <= 300.0
                add((f"target 64 real-time streams, TTFA p95 <= 300 ms ({how})", "PASS" if ok else "FAIL"))
        for lv in (res.get("load") or {}).get("levels", []):
            ok = (lv.get("c100", 0) >= 0.99 and (lv.get("ttfa_p95_over_unloaded") or 99) <= 1.5
                  and (lv["refusal_ms_max"] or 0) <= 100 and lv["failed"] == 0)  # fmt: skip
            add((f"target at {lv['load']}x load: C100 >= 99 %, TTFA p95 <= 1.5x, refusals <= 100 ms", "PASS" if ok else "FAIL"))
    elif not res["gpu"]:
        add(("targets", "n/a (CPU dry run)"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


class Stages:
    """Runs the measurements in order of importance until the deadline; the JSON after each."""

    def __init__(self, res: dict[str, Any], deadline: float, json_path: Path | None) -> None:
        self.res, self.deadline, self.json_path = res, deadline, json_path
        res.setdefault("skipped", {})
        self.save()  # a table even if the model cannot be written

    def left(self) -> float:
        return self.deadline - time.time() if self.deadline else float("inf")

    def timeout(self) -> float | None:
        return max(self.left(), 1.0) if self.deadline else None

    def run(self, key: str, fn: Any, need_s: float = 0.0) -> Any:
        if self.left() < need_s:
            self.res["skipped"][key] = f"out of time ({max(self.left(), 0):.0f} s left, needs ~{need_s:.0f} s)"
            self.save()
            return None
        t0 = time.monotonic()
        log.info("stage %s (%.0f s left)", key, self.left())
        try:
            value = fn()
        except Exception as exc:  # a failed stage is reported; the rest still run
            log.exception("stage %s failed", key)
            self.res["skipped"][key] = f"failed: {type(exc).__name__}: {str(exc).strip().splitlines()[-1][:200] if str(exc).strip() else ''}"
            self.res.setdefault("failed", []).append(key)
            value = None
        else:
            self.res[key] = value
        self.res.setdefault("stage_s", {})[key] = round(time.monotonic() - t0, 1)
        self.save()
        return value

    def save(self) -> None:
        if self.json_path:
            self.json_path.write_text(json.dumps(self.res, indent=2, default=str) + "\n", encoding="utf-8")


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
    ap.add_argument("--concurrency", type=int, nargs="*", default=[1, 8, 32, 64, 128])
    ap.add_argument(
        "--null-levels", type=int, nargs="*", default=[64, 128],
        help="bench --null-backbone levels: the CPU side of a tick",
    )  # fmt: skip
    ap.add_argument(
        "--codec-scale", default="0.25",
        help="width of the real-architecture codec benched on ONNX Runtime CPU, as a fraction of "
        "the published one (1.0: the published size), or 'tiny'; 'none' skips it",
    )  # fmt: skip
    ap.add_argument(
        "--threads", type=int, default=0, help="llama.cpp CPU threads (0 = physical cores)"
    )
    ap.add_argument(
        "--no-numpy-heads", action="store_true", help="skip the NumPy-heads comparison run"
    )
    ap.add_argument(
        "--load-stage", default=LOAD_STAGE, metavar="ARGS",
        help="the load stage's benchmarks/engine_load.py arguments, as one string (write "
        "--load-stage=ARGS); '' skips the stage",
    )  # fmt: skip
    ap.add_argument("--deadline", type=float, default=0, help="unix time after which no stage starts (0: none)")
    ap.add_argument("--json", help="also write the results here (after every stage)")
    ap.add_argument("--table-from", metavar="JSON", help="only print the table of an earlier run's JSON")
    args = ap.parse_args(argv)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.table_from:
        print(table(json.loads(Path(args.table_from).read_text(encoding="utf-8"))))
        return 0
    if args.codec_scale not in ("tiny", "none"):
        float(args.codec_scale)  # a bad value fails here, not after the model is written
    from streamtts.model import _llama

    work = Path(args.work).resolve()
    gpu = args.gpu_layers != 0
    res: dict[str, Any] = {
        "device": _device_name() if gpu else "CPU",
        "bridge": _llama.bridge_version(),
        "gpu": gpu,
        "shape": args.shape,
        "quant": args.quant,
    }
    st = Stages(res, args.deadline, Path(args.json) if args.json else None)
    cfg, fused, t_model, t_conv = prepare(work, args.shape, args.quant)
    res.update(t_model_s=t_model, t_convert_s=t_conv)
    original = work / "MOSS-TTS-GGUF" / f"MOSS_TTS_{args.quant}.gguf"
    bf = st.run("bare_fused", lambda: bare_decode(fused, args.gpu_layers, args.bare_steps, fused=True, threads=args.threads))
    if bf:
        res["fused_rows"] = bf["n_vocab"]
    run_cfg = write_run_config(cfg, fused, args.gpu_layers, work, args.threads)
    st.run("engine_fused", lambda: engine_single(run_cfg, args.frames, args.streams))
    if args.load_stage:
        import engine_load  # this folder's: how long the stage's arguments take

        stage = shlex.split(args.load_stage)
        la = engine_load.parse(stage)
        need = 30 + la.probe + len(la.load) * (la.duration + 2) + (1 + len(la.load)) * la.max_s
        # a stream may wait for a slot half the unloaded TTFA (the bar: p95 within 1.5x it)
        ttfa = (res.get("engine_fused") or {}).get("ttfa_ms_p50") or 200.0
        st.run("load", lambda: load(run_cfg, stage, max(0.05, ttfa / 2000), work / "load.json", st.timeout()), need)
    levels, top = sorted(args.concurrency), max(args.concurrency, default=1)
    if levels:
        st.run("bench", lambda: bench(run_cfg, levels, args.frames, work / "bench.json", timeout=st.timeout()), 20)
    if args.null_levels:
        st.run(
            "bench_null",
            lambda: bench(run_cfg, args.null_levels, args.frames, work / "bench-null.json", null_backbone=True, timeout=st.timeout()),
            10,
        )  # fmt: skip
        # the tick's CPU side alone (no codec either), on the tick's threads and on one
        tick = work / "bench-tick.json"
        st.run("bench_tick", lambda: bench(run_cfg, args.null_levels, args.frames, tick, null_backbone=True,
                                           null_codec=True, timeout=st.timeout()), 10)  # fmt: skip
        st.run("bench_tick_1thread", lambda: bench(run_cfg, args.null_levels, args.frames, tick, null_backbone=True,
                                                   null_codec=True, tick_threads=1, timeout=st.timeout()), 10)  # fmt: skip
    st.run("memory", lambda: _memory(run_cfg, [1, top]), 20)
    if args.codec_scale != "none" and levels:
        def codec_bench() -> list[dict[str, Any]]:
            onnx_dir, t_build = real_codec(work, args.codec_scale)
            width = "the demo's width" if args.codec_scale == "tiny" else f"{args.codec_scale} x the published width"
            res["codec"] = (
                f"real architecture, random weights, {width} (built in {t_build:.0f} s), exact "
                f"streaming graph, ONNX Runtime CPU on {os.cpu_count()} cores"
            )
            ccfg = write_run_config(cfg, fused, args.gpu_layers, work, args.threads, codec=onnx_dir, name="gpu-check-codec.yaml")
            return bench(ccfg, levels, args.frames, work / "bench-codec.json", kernel=False, timeout=st.timeout())

        st.run("bench_codec", codec_bench, 60)
    if levels:
        st.run(
            "bench_joining",
            lambda: bench(run_cfg, [top], args.frames, work / "bench-joining.json", joining=True, timeout=st.timeout()),
            30,
        )  # fmt: skip
    st.run("bare_original", lambda: bare_decode(original, args.gpu_layers, args.bare_steps, fused=False, threads=args.threads), 20)
    if not args.no_numpy_heads:
        st.run("engine_numpy", lambda: engine_single(run_cfg, args.frames, args.streams, heads_backend="numpy"), 20)
    print(table(res))
    return 1 if res.get("failed") else 0


def _memory(cfg: Path, streams: list[int]) -> dict[str, Any]:
    lo, hi = (memory_probe(cfg, n) for n in streams)
    d = max(streams[1] - streams[0], 1)
    gpu = (hi["gpu_mib"] - lo["gpu_mib"]) / d if hi.get("gpu_mib") is not None and lo.get("gpu_mib") is not None else None
    return {
        "streams": streams,
        "probes": [lo, hi],
        "gpu_mib_per_stream": gpu,
        "rss_mib_per_stream": (hi["rss_mib"] - lo["rss_mib"]) / d,
        "kv_mib_per_stream": hi.get("kv_mib_per_stream"),
    }


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
