"""Cost of the exact streaming codec decoder against windowed and offline decoding.

    python benchmarks/codec_streaming.py [--scale 1.0] [--threads 2] [--json out.json]

Writes a MOSS-Audio-Tokenizer decoder checkpoint of the published size (published
config; ``--scale`` < 1 shrinks every stage's width, keeping depth, contexts and I/O)
with random weights into a temporary folder, builds the streaming and offline graphs with
``streamtts codec build``'s builder, and times on ONNX Runtime (CPU):

- streaming: ms per 80 ms frame (per stream) at chunk 1/2/4/8 frames and B = 1/8 streams
  per call, every stream past all attention windows (the full cost);
- windowed (today's ``decoding.py``): the offline graph on 125 frames of left context +
  the new frames, ms per *new* frame;
- offline: one 30 s decode, ms per frame;
- memory: state per stream slot, process RSS after loading each graph;
- float16 weights (``--dtype float16``): file size, RSS, speed and the output change;
- exactness at this size: streaming (chunk 8) vs the offline graph over 160 frames.

It reports (a table, optionally ``--json``); it never asserts. The two targets it reports:
at chunk 8 with B = 8, streaming <= 1.3x offline per frame, and >= 10x cheaper per new
frame than the windowed path.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from streamtts.codec.arch import parse_arch
from streamtts.codec.build import build_decoders
from streamtts.codec.random_ckpt import scale_config, write_random_checkpoint
from streamtts.codec.streaming import StreamingDecoder

HERE = Path(__file__).resolve().parent
PUBLISHED = HERE.parent / "tests" / "fixtures" / "codec" / "published-config.json"
CONTEXT_FRAMES = 125  # the windowed path's left context (EngineConfig default)
FRAME_MS = 80.0


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def session(path: Path, threads: int) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.inter_op_num_threads = 1
    opts.intra_op_num_threads = threads
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def timed(fn: Any, reps: int) -> float:
    """Median seconds of ``reps`` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_streaming(dec: StreamingDecoder, chunks: list[int], batches: list[int], reps: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    rows = []
    for b in batches:
        slots = [dec.acquire() for _ in range(b)]
        for c in chunks:
            # past every window (stage 4: 1000 tokens = 125 frames): attention at full width;
            # the rings' contents do not change the cost, their positions do
            dec._pos[slots] = 300 + 7 * np.arange(b)
            codes = rng.integers(0, 1024, size=(b, c, 32))
            t = timed(lambda codes=codes, slots=slots: dec.decode(slots, codes), reps)
            rows.append({"path": "streaming", "chunk": c, "batch": b, "call_ms": 1e3 * t,
                         "ms_per_frame": 1e3 * t / (b * c)})  # fmt: skip
            print(f"  streaming chunk {c} B {b}: {1e3 * t:.1f} ms/call, {1e3 * t / (b * c):.1f} ms/frame", flush=True)
        for s in slots:
            dec.release(s)
    return rows


def stream_through(dec: StreamingDecoder, codes: np.ndarray, chunk: int = 8) -> np.ndarray:
    """One stream, ``chunk`` frames per call: (1, T, 32) -> (1, T*1920)."""
    s = dec.acquire()
    parts = [dec.decode([s], codes[:, i : i + chunk]) for i in range(0, codes.shape[1], chunk)]
    dec.release(s)
    return np.concatenate(parts, axis=1)


def bench_pair(a: StreamingDecoder, b: StreamingDecoder, chunk: int, batch: int, reps: int) -> tuple[float, float]:
    """Median seconds per call of two decoders, called alternately."""
    codes = np.random.default_rng(4).integers(0, 1024, size=(batch, chunk, 32))
    times: tuple[list[float], list[float]] = ([], [])
    sa = [a.acquire() for _ in range(batch)]
    sb = [b.acquire() for _ in range(batch)]
    a._pos[sa] = 300  # past every window, as in bench_streaming
    b._pos[sb] = 300
    a.decode(sa, codes)  # warm-up
    b.decode(sb, codes)
    for _ in range(reps):
        for dec, slots, acc in ((a, sa, times[0]), (b, sb, times[1])):
            t0 = time.perf_counter()
            dec.decode(slots, codes)
            acc.append(time.perf_counter() - t0)
    for dec, slots in ((a, sa), (b, sb)):
        for s in slots:
            dec.release(s)
    return statistics.median(times[0]), statistics.median(times[1])


def offline_run(sess: ort.InferenceSession, codes: np.ndarray) -> np.ndarray:
    """(B, T, 32) -> (B, T*1920)."""
    x = np.ascontiguousarray(codes.transpose(2, 0, 1)).astype(np.int64)
    out: np.ndarray = sess.run(None, {"audio_codes": x, "n_quantizers": np.array(32, dtype=np.int64)})[0]
    return out[:, 0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(PUBLISHED), help="codec config.json (default: the published one)")
    ap.add_argument("--scale", type=float, default=1.0, help="stage width factor (1 = the real size)")
    ap.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--chunks", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--offline-seconds", type=float, default=30.0)
    ap.add_argument("--windowed", default="1x1,8x1,8x8", help="chunk x batch pairs for the windowed path")
    ap.add_argument("--no-f16", action="store_true", help="skip the float16-weights variant")
    ap.add_argument("--exact-frames", type=int, default=160, help="0 skips the exactness check")
    ap.add_argument("--workdir", help="keep the checkpoint and graphs here (default: a temp dir)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()

    cfg = scale_config(json.loads(Path(args.config).read_text()), args.scale)
    arch = parse_arch(cfg)
    res: dict[str, Any] = {"scale": args.scale, "threads": args.threads, "params": arch.params,
                           "arch": arch.describe(), "cpu": os.cpu_count(), "load_avg": os.getloadavg()}  # fmt: skip
    print(f"decoder: {arch.describe()} (scale {args.scale})", flush=True)
    tmp = tempfile.TemporaryDirectory(prefix="codec-bench-", dir=args.workdir)
    root = Path(tmp.name)
    try:
        w = root / "weights"
        t0 = time.perf_counter()
        write_random_checkpoint(w, cfg, seed=0)
        res["write_checkpoint_s"] = time.perf_counter() - t0
        r = build_decoders(w, out=root / "decoder_streaming.onnx", offline_out=root / "decoder.onnx")
        res["build_s"] = r.seconds
        res["state_mb_per_slot"] = r.state_bytes_per_slot / 1e6
        res["onnx_gb"] = sum(p.stat().st_size for p in root.glob("decoder_streaming.onnx*")) / 1e9
        print(f"built in {r.seconds:.0f} s; state {r.state_bytes_per_slot / 1e6:.1f} MB per slot", flush=True)

        # -- streaming ------------------------------------------------------------------------
        res["rss_base_mb"] = rss_mb()
        dec = StreamingDecoder(root / "decoder_streaming.onnx", n_slots=max(args.batches), threads=args.threads)
        res["streaming_rss_mb"] = rss_mb()
        rows = bench_streaming(dec, args.chunks, args.batches, args.reps)
        exact_codes = np.random.default_rng(1).integers(0, 1024, size=(1, args.exact_frames, 32))
        stream_pcm = stream_through(dec, exact_codes) if args.exact_frames else None

        # -- float16 weights, timed alternately with float32 (a busy machine hits both alike) --
        if not args.no_f16:
            r16 = build_decoders(w, out=root / "decoder_f16.onnx", dtype="float16")
            res["f16_onnx_gb"] = sum(p.stat().st_size for p in root.glob("decoder_f16.onnx*")) / 1e9
            rss0 = rss_mb()
            dec16 = StreamingDecoder(r16.streaming or "", n_slots=max(args.batches), threads=args.threads)
            res["f16_streaming_rss_delta_mb"] = rss_mb() - rss0
            for c, b in ((1, 1), (8, max(args.batches))):
                t32, t16 = bench_pair(dec, dec16, c, b, args.reps)
                rows.append({"path": "streaming (f32, alternating)", "chunk": c, "batch": b,
                             "call_ms": 1e3 * t32, "ms_per_frame": 1e3 * t32 / (b * c)})  # fmt: skip
                rows.append({"path": "streaming f16 weights", "chunk": c, "batch": b,
                             "call_ms": 1e3 * t16, "ms_per_frame": 1e3 * t16 / (b * c)})  # fmt: skip
                print(f"  f32 / f16 chunk {c} B {b}: {1e3 * t32:.0f} / {1e3 * t16:.0f} ms/call", flush=True)
            if stream_pcm is not None:
                pcm16 = stream_through(dec16, exact_codes)
                res["f16_vs_f32_maxabs"] = float(np.abs(pcm16 - stream_pcm).max())
                res["f16_vs_f32_rms"] = float(np.sqrt(np.mean((pcm16 - stream_pcm).astype(np.float64) ** 2)))
            del dec16
        del dec
        gc.collect()

        # -- offline and windowed -------------------------------------------------------------
        off = session(root / "decoder.onnx", args.threads)
        res["offline_rss_mb"] = rss_mb()
        if stream_pcm is not None:
            ref = offline_run(off, exact_codes)
            res["exact_maxabs"] = float(np.abs(stream_pcm - ref).max())
            res["exact_rms"] = float(np.sqrt(np.mean(ref.astype(np.float64) ** 2)))
            print(f"  exactness over {args.exact_frames} frames: maxabs {res['exact_maxabs']:.2e} (signal RMS {res['exact_rms']:.2f})", flush=True)
        n_off = int(round(args.offline_seconds * 12.5))
        codes = np.random.default_rng(2).integers(0, 1024, size=(1, n_off, 32))
        offline_run(off, codes[:, :16])  # warm-up
        t0 = time.perf_counter()
        offline_run(off, codes)
        t = time.perf_counter() - t0
        rows.append({"path": "offline", "chunk": n_off, "batch": 1, "call_ms": 1e3 * t, "ms_per_frame": 1e3 * t / n_off})
        print(f"  offline {args.offline_seconds:g} s: {t:.1f} s, {1e3 * t / n_off:.1f} ms/frame", flush=True)
        for pair in args.windowed.split(","):
            c, b = (int(v) for v in pair.split("x"))
            win = np.random.default_rng(3).integers(0, 1024, size=(b, CONTEXT_FRAMES + c, 32))
            t = timed(lambda win=win, off=off: offline_run(off, win), 1)
            rows.append({"path": "windowed", "chunk": c, "batch": b, "call_ms": 1e3 * t,
                         "ms_per_frame": 1e3 * t / (b * c)})  # fmt: skip
            print(f"  windowed chunk {c} B {b}: {1e3 * t:.0f} ms/call, {1e3 * t / (b * c):.1f} ms/new frame", flush=True)
        del off
        gc.collect()
    finally:
        tmp.cleanup()
    res["rows"] = rows

    # -- report -------------------------------------------------------------------------------
    def per_frame(path: str, chunk: int | None = None, batch: int | None = None) -> float:
        for row in rows:
            if row["path"] == path and (chunk is None or row["chunk"] == chunk) and (batch is None or row["batch"] == batch):
                return float(row["ms_per_frame"])
        return float("nan")

    off_ms = per_frame("offline")
    note = "" if args.scale == 1.0 else f" -- SCALED: stage widths x{args.scale:g}, not the real size"
    print(f"\n## codec decoder on ONNX Runtime CPU, {args.threads} threads{note}")
    print(f"{arch.describe()}; state {res['state_mb_per_slot']:.1f} MB per stream slot\n")
    print("| path | chunk (frames) | streams per call | ms per call | ms per frame | x offline | x real time |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        pf = row["ms_per_frame"]
        print(f"| {row['path']} | {row['chunk']} | {row['batch']} | {row['call_ms']:.0f} | {pf:.1f} | "
              f"{pf / off_ms:.2f} | {pf / FRAME_MS:.2f} |")  # fmt: skip
    s88, w88 = per_frame("streaming", 8, 8), per_frame("windowed", 8, 8)
    res["target_streaming_vs_offline"] = s88 / off_ms
    res["target_windowed_vs_streaming"] = w88 / s88
    print(f"\nchunk 8, B 8: streaming / offline per frame = {s88 / off_ms:.2f} (target <= 1.3); "
          f"windowed / streaming per new frame = {w88 / s88:.1f} (target >= 10)")  # fmt: skip
    print(f"process RSS: {res['rss_base_mb']:.0f} MB before loading, {res['streaming_rss_mb']:.0f} MB with the streaming "
          f"graph (state allocated, untouched), {res['offline_rss_mb']:.0f} MB with the offline one alone; "
          f"ONNX weights {res['onnx_gb']:.2f} GB")  # fmt: skip
    if "f16_onnx_gb" in res:
        print(f"float16 weights: ONNX {res['f16_onnx_gb']:.2f} GB, RSS +{res['f16_streaming_rss_delta_mb']:.0f} MB to load, "
              f"output vs float32 maxabs {res.get('f16_vs_f32_maxabs', float('nan')):.2e} "
              f"(RMS {res.get('f16_vs_f32_rms', float('nan')):.2e})")  # fmt: skip
    if "exact_maxabs" in res:
        print(f"exactness: streaming (chunk 8) vs offline graph over {args.exact_frames} frames: "
              f"maxabs {res['exact_maxabs']:.2e}, signal RMS {res['exact_rms']:.2f}")  # fmt: skip
    print(f"load average at start: {res['load_avg']}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
