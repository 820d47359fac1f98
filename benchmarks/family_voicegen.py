"""A VoiceGenerator-shaped model on this machine: the engine against bare llama.cpp, in one run.

    python benchmarks/family_voicegen.py [--workdir /tmp/streamtts-voicegen] [--reps 2]
        [--frames 60] [--threads 2] [--codec-scale 1.0] [--rebuild] [--json out.json]

Step by step:

1. The model, in ``--workdir`` (kept there: a later run with the same shape, codec and seed
   reuses it; ``--rebuild`` writes it again). ``streamtts.demo.random_quant.write_model``
   with the Qwen3-1.7B shape (``SHAPES["1.7b"]``: hidden 2048, 28 layers, 16 query / 8 KV
   heads, head_dim 128, FFN 6144, vocab 151936), Q4_K_M (random quant blocks with
   llama.cpp's Q4_K_M tensor types), n_vq 16 and real-size float16 tables (the 151936 x
   2048 text embedding, 16 audio embeddings and 16 audio heads of 1025 x 2048). Then the
   codec: a MOSS-Audio-Tokenizer checkpoint of the published config (random weights;
   ``--codec-scale`` < 1 narrows every stage), built by ``streamtts codec build``'s builder
   into the offline and the streaming decoder at 16 levels. ``config.yaml`` runs that codec;
   ``config-tones.yaml`` is the same model with the demo tone codec (next to no cost), so
   the engine's own overhead shows apart from the codec's share of the two cores. Each
   part's time and size is reported.
2. The engine, each run a fresh process: ``streamtts bench --kernel-bound`` (``--n-threads
   --threads``) at 1 stream and at 4 streams, ``--frames`` frames per stream, on each
   config, repetitions interleaved (order alternating). Per run: the engine's ms per step
   (median over its streams of the ticks' wall time per step; that counts the tick of the
   stream's prefill, so also the decode steps alone: minus N bare prefills, over one step
   fewer), TTFA p50, RTF p50 and its
   per-step profile (embed / backbone / heads / sampling / other / codec wait); then, the
   engine closed, the bare side of the same file (the one the engine ran: text rows only)
   with the same threads: an N-row ``llama_decode`` + the audio heads at the positions the
   streams stepped through, the prefill of the prompt's computed rows, and the codec's bare
   work on the same frames in the engine's chunks. Ratios per run (engine / bare, next to
   each other), medians over repetitions.
3. Thread scaling, bare (in this process, after the engine runs): the engine's file at 1
   and at ``--threads`` llama.cpp threads, a decode of 1 and of 4 rows at position ~160
   (median of 15), then the audio heads on as many of our threads (parts), timed apart.
4. The codec alone: the streaming decoder (16 levels) with 1 and ``--threads`` ONNX Runtime
   threads: ms per frame at chunk 1 / 4 / 8 frames, 1 and 4 streams per call (median of 3
   calls after one warm-up).

It reports (a summary, everything with ``--json``); it never asserts. A shared machine
moves single runs by tens of percent: compare ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from streamtts.codec.build.decoders import build_decoders
from streamtts.codec.build.random_ckpt import scale_config, write_random_checkpoint
from streamtts.codec.stamp import BUILDER_VERSION
from streamtts.codec.streaming import StreamingDecoder
from streamtts.config import find_model_config, load_config
from streamtts.core.tokens import load_token_ids
from streamtts.demo.codec import write_codec
from streamtts.demo.random_quant import SHAPES, write_model
from streamtts.model.backbone import Backbone, BackboneParams
from streamtts.model.fused import fused_columns
from streamtts.model.tables import AudioHeads

HERE = Path(__file__).resolve().parent
PUBLISHED = HERE.parent / "tests" / "fixtures" / "codec" / "published-config.json"
SHAPE, QUANT, N_VQ = "1.7b", "Q4_K_M", 16
MARKER = "voicegen-bench.json"
CONFIGS = ("tones", "real")  # config-tones.yaml, config.yaml


def _size_gb(*paths: Path) -> float:
    total = 0
    for p in paths:
        files = [p] if p.is_file() else [f for f in p.rglob("*") if f.is_file()]
        total += sum(f.stat().st_size for f in files)
    return round(total / 1e9, 3)


def make_model(root: Path, codec_scale: float, seed: int, rebuild: bool) -> dict[str, Any]:
    """Step 1: the model and both configs in ``root`` (reused when its marker matches)."""
    want = {"shape": SHAPE, "quant": QUANT, "n_vq": N_VQ, "codec_scale": codec_scale, "seed": seed,
            "codec_builder": BUILDER_VERSION}  # fmt: skip
    marker = root / MARKER
    if not rebuild and marker.is_file():
        have = json.loads(marker.read_text(encoding="utf-8"))
        if {k: have.get(k) for k in want} == want:
            have["reused"] = True
            return dict(have)
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    out: dict[str, Any] = dict(want)
    t0 = time.perf_counter()
    write_model(root, SHAPES[SHAPE], QUANT, seed, n_vq=N_VQ)
    out["backbone_and_tables_s"] = round(time.perf_counter() - t0, 1)
    gg = root / "MOSS-TTS-GGUF"
    out["gguf_gb"] = _size_gb(*gg.glob("*.gguf"))
    out["tables_gb"] = _size_gb(gg / "embeddings", gg / "lm_heads")
    # the tone codec, kept for config-tones.yaml; write_model put it where the real one goes
    tones = root / "MOSS-Audio-Tokenizer-ONNX-tones"
    write_codec(tones, n_vq=N_VQ)
    cfg = (root / "config.yaml").read_text(encoding="utf-8")
    (root / "config-tones.yaml").write_text(
        cfg.replace("MOSS-Audio-Tokenizer-ONNX/", "MOSS-Audio-Tokenizer-ONNX-tones/"), encoding="utf-8"
    )
    t0 = time.perf_counter()
    ckpt = root / "MOSS-Audio-Tokenizer"
    write_random_checkpoint(ckpt, scale_config(json.loads(PUBLISHED.read_text(encoding="utf-8")), codec_scale), seed=seed)
    out["codec_checkpoint_s"] = round(time.perf_counter() - t0, 1)
    onnx = root / "MOSS-Audio-Tokenizer-ONNX"
    (onnx / "decoder.onnx").unlink()  # the tone decoder; both graphs are rebuilt from the checkpoint
    r = build_decoders(ckpt, out=onnx / "decoder_streaming.onnx", offline_out=onnx / "decoder.onnx", n_vq=N_VQ)
    out["codec_build_s"] = round(r.seconds, 1)
    out["codec_checkpoint_gb"] = _size_gb(ckpt)
    out["codec_streaming_gb"] = _size_gb(*onnx.glob("decoder_streaming.onnx*"))
    out["codec_state_mb_per_slot"] = round(r.state_bytes_per_slot / 1e6, 1)
    out["total_gb"] = _size_gb(root)
    marker.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    out["reused"] = False
    return out


# -- step 2: the engine and its bare side, through `streamtts bench --kernel-bound` ------------


def bench_run(cfg: Path, streams: int, frames: int, threads: int) -> dict[str, Any]:
    """One ``streamtts bench --kernel-bound`` in a fresh process; the numbers of its level."""
    with tempfile.TemporaryDirectory(prefix="vgbench-") as tmp:
        out = Path(tmp) / "bench.json"
        cmd = [sys.executable, "-m", "streamtts", "bench", "--config", str(cfg), "--concurrency", str(streams),
               "--frames", str(frames), "--kernel-bound", "--n-threads", str(threads), "--json", str(out), "-q"]  # fmt: skip
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        res: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    lv = res["levels"][0]
    kb = res["kernel_bound"]
    k = {x["concurrency"]: x for x in kb["levels"]}[streams]
    # a stream's ms per step counts its prompt's tick too (the first row it samples comes out of
    # the prefill): without it, the decode steps alone, taking the bare prefill of the computed
    # rows for that tick (N prompts in one tick at N streams)
    steps = frames + N_VQ - 1
    decode_ms = (lv["ms_per_step_p50"] * steps - streams * kb["prefill_ms"]) / (steps - 1)
    return {
        "engine_step_ms": lv["ms_per_step_p50"],
        "engine_decode_step_ms": round(decode_ms, 3),
        "bare_step_ms": k["step_ms"],
        "step_ratio": round(lv["ms_per_step_p50"] / k["step_ms"], 3),
        "decode_step_ratio": round(decode_ms / k["step_ms"], 3),
        "ttfa_ms": lv["ttfa_ms_p50"],
        "bare_ttfa_ms": k["ttfa_ms"],  # prefill of the computed rows + n_vq bare steps
        "bare_prefill_ms": kb["prefill_ms"],
        "rtf": lv["rtf_p50"],
        "frames_per_s": lv["aggregate_frames_per_s"],
        "bare_frames_per_s": k["frames_per_s"],
        "bare_frames_per_s_with_codec": k["frames_per_s_with_codec"],
        "engine_vs_bare_throughput": lv["engine_vs_kernel_throughput"],
        "engine_vs_bare_codec_throughput": lv["engine_vs_kernel_codec_throughput"],
        "codec_ms_per_frame": round(k["codec_ms"] / (streams * frames), 2),  # bare, the engine's chunks
        "profile_ms": {key: round(v, 2) for key, v in res.get("step_profile_ms", {}).items()},
        "prompt_rows": lv["prompt_rows"],
        "prefill_rows_computed": lv["prefill_rows_computed"],
        "backbone": res["engine"]["backbone"],
        "threads": res["engine"]["threads"],
        "codec": res["engine"].get("codec"),
    }


# -- step 3: 1 against N threads, bare ---------------------------------------------------------


def _median_ms(fn: Any, iters: int) -> float:
    fn()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return round(1000.0 * statistics.median(ts), 2)


def bare_threads(cfg_path: Path, gguf: str, thread_counts: list[int], at: int = 160, iters: int = 15) -> list[dict[str, Any]]:
    """Decode of 1 and 4 rows (one per sequence, each sequence filled to ``at``) and the audio
    heads on as many parts, at each thread count."""
    cfg = load_config(str(cfg_path))
    ids = load_token_ids(find_model_config(cfg))
    rng = np.random.default_rng(0)
    out = []
    for t in thread_counts:
        p = BackboneParams(model_path=gguf, n_ctx=4 * 512, n_batch=at, n_seq_max=4, n_threads=t,
                           type_k=cfg.kv_cache_type_k, type_v=cfg.kv_cache_type_v, flash_attn=str(cfg.flash_attn).lower())  # fmt: skip
        row: dict[str, Any] = {"threads": t}
        with Backbone(p) as bb, threadpool_limits(1, user_api="blas"):
            h = bb.n_embd
            bb.set_logit_columns(fused_columns(bb, ids))  # the text rows only file: its 2 rows
            embd = rng.standard_normal((at, h), dtype=np.float32) * 0.5
            pos, seq, flags = np.zeros(at, np.int32), np.zeros(at, np.int32), np.zeros(at, np.int8)
            hidden, logits = np.zeros((4, h), np.float32), np.zeros((4, bb.n_logit_columns), np.float32)
            bb.bind(embd, pos, seq, flags, hidden, logits)
            for s in range(4):  # fill: `at` rows of each sequence
                pos[:] = np.arange(at, dtype=np.int32)
                seq[:], flags[:] = s, 0
                bb.decode_bound(at, False, 0)
            heads = AudioHeads(cfg.lm_head_dir, ids, h, threads=t)
            audio = np.zeros((4, ids.n_vq * ids.audio_rows), np.float32)
            for n in (1, 4):
                pos[:n], seq[:n], flags[:n] = at, np.arange(n, dtype=np.int32), 1

                def decode(n: int = n) -> None:
                    bb.decode_bound(n, True, 0)
                    for s in range(n):  # the same position again next time
                        bb.seq_rm(s, at)

                row[f"decode_{n}row_ms"] = _median_ms(decode, iters)
                row[f"heads_{n}row_ms"] = _median_ms(lambda n=n, f=heads, x=hidden, y=audio: f(x[:n], y[:n]), iters)
                row[f"step_{n}row_ms"] = round(row[f"decode_{n}row_ms"] + row[f"heads_{n}row_ms"], 2)
            heads.close()
        out.append(row)
    base = out[0]
    for row in out:
        for n in (1, 4):
            row[f"speedup_{n}row"] = round(base[f"step_{n}row_ms"] / row[f"step_{n}row_ms"], 2)
            row[f"decode_speedup_{n}row"] = round(base[f"decode_{n}row_ms"] / row[f"decode_{n}row_ms"], 2)
    return out


# -- step 4: the codec alone -------------------------------------------------------------------


def codec_alone(path: Path, thread_counts: list[int], chunks: tuple[int, ...] = (1, 4, 8), batches: tuple[int, ...] = (1, 4), reps: int = 3) -> list[dict[str, Any]]:
    """ms per frame (per stream) of the streaming decoder, per thread count, chunk and streams per call."""
    rng = np.random.default_rng(0)
    out = []
    for t in thread_counts:
        dec = StreamingDecoder(path, n_slots=max(batches), threads=t)
        for b in batches:
            for c in chunks:
                slots = np.array([dec.acquire() for _ in range(b)], np.int64)
                codes = rng.integers(0, 1024, size=(b, c, dec.n_vq)).astype(np.int64)
                lens = np.full(b, c, np.int64)
                ms = _median_ms(lambda f=dec.decode, s=slots, x=codes, n=lens: f(s, x, n), reps)
                out.append({"threads": t, "streams": b, "chunk": c, "ms_per_call": ms, "ms_per_frame": round(ms / (b * c), 2)})
                for s in slots:
                    dec.release(int(s))
        del dec
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default="/tmp/streamtts-voicegen", help="where the model is written (kept, reused)")
    ap.add_argument("--reps", type=int, default=2, help="repetitions of the engine runs (each level, each config)")
    ap.add_argument("--frames", type=int, default=60, help="frames per stream (12.5 a second)")
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp threads (the engine's --n-threads)")
    ap.add_argument("--codec-scale", type=float, default=1.0, help="codec stage width factor (1 = the published size)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rebuild", action="store_true", help="write the model again even when --workdir holds it")
    ap.add_argument("--skip", nargs="*", default=[], choices=["engine", "threads", "codec"], help="steps to leave out")
    ap.add_argument("--json", help="also write every number here")
    a = ap.parse_args()

    t_start = time.time()
    report: dict[str, Any] = {"cpus": os.cpu_count(), "load_average_start": os.getloadavg()[0], "args": vars(a)}
    root = Path(a.workdir)
    report["model"] = make_model(root, a.codec_scale, a.seed, a.rebuild)
    print(json.dumps({"model": report["model"]}), flush=True)
    cfgs = {"tones": root / "config-tones.yaml", "real": root / "config.yaml"}

    runs: list[dict[str, Any]] = []
    if "engine" not in a.skip:
        for rep in range(a.reps):
            for name in CONFIGS if rep % 2 == 0 else CONFIGS[::-1]:
                for n in (1, 4):
                    r = {"rep": rep, "config": name, "streams": n, **bench_run(cfgs[name], n, a.frames, a.threads)}
                    runs.append(r)
                    print(json.dumps(r), flush=True)
        summary = []
        for name in CONFIGS:
            for n in (1, 4):
                rs = [r for r in runs if r["config"] == name and r["streams"] == n]
                med: dict[str, Any] = {k: round(statistics.median(float(r[k]) for r in rs), 3) for k, v in rs[0].items()
                       if isinstance(v, (int, float)) and k not in ("rep", "streams", "threads")}  # fmt: skip
                med["profile_ms"] = {k: round(statistics.median(r["profile_ms"][k] for r in rs), 2) for k in rs[0]["profile_ms"]}
                summary.append({"config": name, "streams": n, **med})
        report["engine_runs"] = runs
        report["engine"] = summary
    threads = sorted({1, a.threads})
    if "threads" not in a.skip:
        # the file the engine ran (text rows only), written at its first load
        gguf = runs[0]["backbone"] if runs else str(next((root / "MOSS-TTS-GGUF").glob("*.fused-text.gguf")))
        report["bare_threads"] = bare_threads(cfgs["tones"], gguf, threads)
        print(json.dumps({"bare_threads": report["bare_threads"]}), flush=True)
    if "codec" not in a.skip:
        report["codec_alone"] = codec_alone(root / "MOSS-Audio-Tokenizer-ONNX" / "decoder_streaming.onnx", threads)
        print(json.dumps({"codec_alone": report["codec_alone"]}), flush=True)
    report["load_average_end"] = os.getloadavg()[0]
    report["minutes"] = round((time.time() - t_start) / 60, 1)
    text = json.dumps(report, indent=2)
    print(text)
    if a.json:
        Path(a.json).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
