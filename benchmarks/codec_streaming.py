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
- float16 weights: file size, memory, speed (timed alternately with float32) and the
  change of the output;
- memory: state per stream slot; RSS of a fresh process holding each graph;
- exactness at this size: streaming (chunk 8) vs the offline graph over 160 frames.

Each time is the best of several calls (medians in the JSON), as wall time and as CPU
time of this process: on a shared machine other work only ever adds time, so the best
call is the closest to the cost itself; the wall time also counts waiting for a core. It reports (a table, optionally ``--json``); it never asserts. The
targets it reports: at chunk 8 with B = 8, streaming <= 1.3x offline per frame and >= 10x
cheaper per new frame than the windowed path.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from streamtts.codec.build.arch import parse_arch
from streamtts.codec.build.decoders import build_decoders
from streamtts.codec.build.random_ckpt import scale_config, write_random_checkpoint
from streamtts.codec.streaming import StreamingDecoder

HERE = Path(__file__).resolve().parent
PUBLISHED = HERE.parent / "tests" / "fixtures" / "codec" / "published-config.json"
CONTEXT_FRAMES = 125  # the windowed path's left context (EngineConfig.decode_context_frames)
FRAME_MS = 80.0
PAST_WINDOWS = 300  # frames: past every stage's window (stage 4: 1000 tokens = 125 frames)


def session(path: Path, threads: int) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.inter_op_num_threads = 1
    opts.intra_op_num_threads = threads
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def timed(fn: Callable[[], Any], reps: int, warm: bool = True) -> dict[str, float]:
    """Wall and CPU seconds of ``reps`` calls (after one warm-up call): best and median."""
    if warm:
        fn()
    wall, cpu = [], []
    for _ in range(reps):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return {"wall": min(wall), "cpu": min(cpu), "wall_median": statistics.median(wall),
            "cpu_median": statistics.median(cpu), "reps": reps}  # fmt: skip


def row(path: str, chunk: int, batch: int, t: dict[str, float]) -> dict[str, Any]:
    n = chunk * batch
    r = {"path": path, "chunk": chunk, "batch": batch, "call_ms": 1e3 * t["wall"],
         "ms_per_frame": 1e3 * t["wall"] / n, "cpu_ms_per_frame": 1e3 * t["cpu"] / n,
         "median_ms_per_frame": 1e3 * t["wall_median"] / n, "reps": t["reps"]}  # fmt: skip
    print(f"  {path} chunk {chunk} B {batch}: best of {t['reps']:.0f}: {1e3 * t['wall']:.0f} ms/call, "
          f"{r['ms_per_frame']:.1f} ms/frame (median {r['median_ms_per_frame']:.1f}), "
          f"CPU {r['cpu_ms_per_frame']:.1f} ms/frame", flush=True)  # fmt: skip
    return r


def bench_streaming(dec: StreamingDecoder, chunks: list[int], batches: list[int], reps: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    rows = []
    for b in batches:
        slots = [dec.acquire() for _ in range(b)]
        for c in chunks:
            # the rings' contents do not change the cost, their positions do
            dec._pos[slots] = PAST_WINDOWS + 7 * np.arange(b)
            codes = rng.integers(0, 1024, size=(b, c, 32))
            rows.append(row("streaming", c, b, timed(lambda codes=codes, slots=slots: dec.decode(slots, codes), reps)))
        for s in slots:
            dec.release(s)
    return rows


def bench_pair(a: StreamingDecoder, b: StreamingDecoder, chunk: int, batch: int, reps: int) -> tuple[dict[str, float], dict[str, float]]:
    """Times of two decoders called alternately (a busy machine hits both alike)."""
    codes = np.random.default_rng(4).integers(0, 1024, size=(batch, chunk, 32))
    sa, sb = [a.acquire() for _ in range(batch)], [b.acquire() for _ in range(batch)]
    a._pos[sa] = PAST_WINDOWS
    b._pos[sb] = PAST_WINDOWS
    a.decode(sa, codes)  # warm-up
    b.decode(sb, codes)
    ta: list[dict[str, float]] = []
    tb: list[dict[str, float]] = []
    for _ in range(reps):
        ta.append(timed(lambda: a.decode(sa, codes), 1, warm=False))
        tb.append(timed(lambda: b.decode(sb, codes), 1, warm=False))
    for dec, slots in ((a, sa), (b, sb)):
        for s in slots:
            dec.release(s)

    def merge(ts: list[dict[str, float]]) -> dict[str, float]:
        w, c = [t["wall"] for t in ts], [t["cpu"] for t in ts]
        return {"wall": min(w), "cpu": min(c), "wall_median": statistics.median(w),
                "cpu_median": statistics.median(c), "reps": len(ts)}  # fmt: skip

    return merge(ta), merge(tb)


def stream_through(dec: StreamingDecoder, codes: np.ndarray, chunk: int = 8) -> np.ndarray:
    """One stream, ``chunk`` frames per call: (1, T, 32) -> (1, T*1920)."""
    s = dec.acquire()
    parts = [dec.decode([s], codes[:, i : i + chunk]) for i in range(0, codes.shape[1], chunk)]
    dec.release(s)
    return np.concatenate(parts, axis=1)


def offline_run(sess: ort.InferenceSession, codes: np.ndarray) -> np.ndarray:
    """(B, T, 32) -> (B, T*1920)."""
    x = np.ascontiguousarray(codes.transpose(2, 0, 1)).astype(np.int64)
    out: np.ndarray = sess.run(None, {"audio_codes": x, "n_quantizers": np.array(32, dtype=np.int64)})[0]
    return out[:, 0]


_CHILD = """
import sys
from pathlib import Path
kind, path, threads, slots = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if kind == "streaming":
    from streamtts.codec.streaming import StreamingDecoder
    dec = StreamingDecoder(path, n_slots=max(slots, 1), threads=threads)
    for _ in range(slots):
        dec.acquire()  # reset() writes the slot's state: now resident
else:
    import onnxruntime as ort
    o = ort.SessionOptions(); o.intra_op_num_threads = threads
    s = ort.InferenceSession(path, o, providers=["CPUExecutionProvider"])
for line in Path("/proc/self/status").read_text().splitlines():
    if line.startswith(("VmRSS:", "VmHWM:")):
        print(line.split()[0], line.split()[1])
"""


def child_rss(kind: str, path: Path, threads: int, slots: int = 0) -> tuple[float, float]:
    """(RSS, peak RSS) MB of a fresh process that loaded ``path`` (and ``slots`` slots)."""
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, kind, str(path), str(threads), str(slots)],
        check=True, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(HERE.parent)},
    ).stdout.split()  # fmt: skip
    kb = dict(zip(out[::2], out[1::2], strict=True))
    return int(kb["VmRSS:"]) / 1024, int(kb["VmHWM:"]) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(PUBLISHED), help="codec config.json (default: the published one)")
    ap.add_argument("--scale", type=float, default=1.0, help="stage width factor (1 = the real size)")
    ap.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    ap.add_argument("--reps", type=int, default=5, help="timed calls per streaming case (best reported)")
    ap.add_argument("--slow-reps", type=int, default=2, help="timed calls per offline / windowed case")
    ap.add_argument("--chunks", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--offline-seconds", type=float, default=30.0)
    ap.add_argument("--windowed", default="1x1,8x1,8x8", help="chunk x batch pairs for the windowed path")
    ap.add_argument("--no-f16", action="store_true", help="skip the float16-weights variant")
    ap.add_argument("--exact-frames", type=int, default=160, help="0 skips the exactness check")
    ap.add_argument("--workdir", help="put the temporary checkpoint and graphs here")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()

    cfg = scale_config(json.loads(Path(args.config).read_text()), args.scale)
    arch = parse_arch(cfg)
    bmax = max(args.batches)
    res: dict[str, Any] = {"scale": args.scale, "threads": args.threads, "params": arch.params,
                           "arch": arch.describe(), "cpus": os.cpu_count(), "load_avg_start": os.getloadavg()}  # fmt: skip
    print(f"decoder: {arch.describe()} (scale {args.scale})", flush=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="codec-bench-", dir=args.workdir) as tmp:
        root = Path(tmp)
        w = root / "weights"
        write_random_checkpoint(w, cfg, seed=0)
        r = build_decoders(w, out=root / "decoder_streaming.onnx", offline_out=root / "decoder.onnx")
        stream_path, off_path = root / "decoder_streaming.onnx", root / "decoder.onnx"
        res["build_s"] = r.seconds
        res["state_mb_per_slot"] = r.state_bytes_per_slot / 1e6
        res["onnx_gb"] = sum(p.stat().st_size for p in root.glob("decoder_streaming.onnx*")) / 1e9
        print(f"built in {r.seconds:.0f} s; state {res['state_mb_per_slot']:.1f} MB per slot", flush=True)
        f16_path = None
        if not args.no_f16:
            r16 = build_decoders(w, out=root / "decoder_f16.onnx", dtype="float16")
            f16_path = r16.streaming
            res["f16_onnx_gb"] = sum(p.stat().st_size for p in root.glob("decoder_f16.onnx*")) / 1e9

        # -- memory, each in a fresh process -------------------------------------------------
        res["rss_streaming_mb"], res["peak_streaming_mb"] = child_rss("streaming", stream_path, args.threads)
        res["rss_streaming_slots_mb"], _ = child_rss("streaming", stream_path, args.threads, bmax)
        res["rss_offline_mb"], res["peak_offline_mb"] = child_rss("offline", off_path, args.threads)
        if f16_path is not None:
            res["rss_f16_mb"], res["peak_f16_mb"] = child_rss("streaming", f16_path, args.threads)

        # -- streaming -----------------------------------------------------------------------
        dec = StreamingDecoder(stream_path, n_slots=bmax, threads=args.threads)
        rows += bench_streaming(dec, args.chunks, args.batches, args.reps)
        exact_codes = np.random.default_rng(1).integers(0, 1024, size=(1, args.exact_frames, 32))
        stream_pcm = stream_through(dec, exact_codes) if args.exact_frames else None
        if f16_path is not None:
            dec16 = StreamingDecoder(f16_path, n_slots=bmax, threads=args.threads)
            for c, b in ((1, 1), (8, bmax)):
                t32, t16 = bench_pair(dec, dec16, c, b, args.reps)
                rows.append(row("streaming (f32, alternating)", c, b, t32))
                rows.append(row("streaming f16 weights", c, b, t16))
            if stream_pcm is not None:
                pcm16 = stream_through(dec16, exact_codes)
                res["f16_vs_f32_maxabs"] = float(np.abs(pcm16 - stream_pcm).max())
                res["f16_vs_f32_rms"] = float(np.sqrt(np.mean((pcm16 - stream_pcm).astype(np.float64) ** 2)))
            del dec16
        del dec
        gc.collect()

        # -- offline and windowed ------------------------------------------------------------
        off = session(off_path, args.threads)
        if stream_pcm is not None:
            ref = offline_run(off, exact_codes)
            res["exact_maxabs"] = float(np.abs(stream_pcm - ref).max())
            res["exact_rms"] = float(np.sqrt(np.mean(ref.astype(np.float64) ** 2)))
        n_off = int(round(args.offline_seconds * 12.5))
        codes = np.random.default_rng(2).integers(0, 1024, size=(1, n_off, 32))
        offline_run(off, codes[:, :16])  # warm-up
        rows.append(row("offline", n_off, 1, timed(lambda off=off: offline_run(off, codes), args.slow_reps, warm=False)))
        for pair in args.windowed.split(","):
            c, b = (int(v) for v in pair.split("x"))
            win = np.random.default_rng(3).integers(0, 1024, size=(b, CONTEXT_FRAMES + c, 32))
            t = timed(lambda win=win, off=off: offline_run(off, win), args.slow_reps, warm=False)
            rows.append(row("windowed", c, b, t))
        del off
    res["rows"] = rows
    res["load_avg_end"] = os.getloadavg()

    # -- report ------------------------------------------------------------------------------
    def find(path: str, chunk: int | None = None, batch: int | None = None) -> dict[str, Any]:
        for r_ in rows:
            if r_["path"] == path and chunk in (None, r_["chunk"]) and batch in (None, r_["batch"]):
                return r_
        return {"ms_per_frame": float("nan"), "cpu_ms_per_frame": float("nan")}

    off_wall = find("offline")["ms_per_frame"]
    note = "" if args.scale == 1.0 else f" -- SCALED: stage widths x{args.scale:g}, not the real size"
    print(f"\n## codec decoder on ONNX Runtime {ort.__version__} CPU, {args.threads} threads{note}")
    print(f"{arch.describe()}; state {res['state_mb_per_slot']:.1f} MB per stream slot\n")
    print("| path | chunk (frames) | streams per call | ms per call | ms per frame | CPU ms per frame | x offline | x real time |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r_ in rows:
        print(f"| {r_['path']} | {r_['chunk']} | {r_['batch']} | {r_['call_ms']:.0f} | {r_['ms_per_frame']:.1f} | "
              f"{r_['cpu_ms_per_frame']:.1f} | {r_['ms_per_frame'] / off_wall:.2f} | {r_['ms_per_frame'] / FRAME_MS:.2f} |")  # fmt: skip
    s88, w88, o = find("streaming", 8, bmax), find("windowed", 8, bmax), find("offline")
    for key, label in (("cpu_ms_per_frame", "CPU"), ("ms_per_frame", "wall")):
        res[f"target_streaming_vs_offline_{label}"] = s88[key] / o[key]
        res[f"target_windowed_vs_streaming_{label}"] = w88[key] / s88[key]
        print(f"\nchunk 8, B {bmax} ({label} time): streaming / offline per frame = {s88[key] / o[key]:.2f} "
              f"(target <= 1.3); windowed / streaming per new frame = {w88[key] / s88[key]:.1f} (target >= 10)", end="")  # fmt: skip
    print(f"\n\nmemory (fresh process, RSS): streaming graph {res['rss_streaming_mb']:.0f} MB "
          f"({res['rss_streaming_slots_mb']:.0f} MB with {bmax} slots in use), offline graph {res['rss_offline_mb']:.0f} MB; "
          f"peak while loading {res['peak_streaming_mb']:.0f} / {res['peak_offline_mb']:.0f} MB; ONNX weights {res['onnx_gb']:.2f} GB")  # fmt: skip
    if "f16_onnx_gb" in res:
        print(f"float16 weights: ONNX {res['f16_onnx_gb']:.2f} GB, RSS {res['rss_f16_mb']:.0f} MB (peak {res['peak_f16_mb']:.0f}), "
              f"output vs float32 maxabs {res.get('f16_vs_f32_maxabs', float('nan')):.2e} "
              f"(RMS {res.get('f16_vs_f32_rms', float('nan')):.2e})")  # fmt: skip
    if "exact_maxabs" in res:
        print(f"exactness: streaming (chunk 8) vs the offline graph over {args.exact_frames} frames: "
              f"maxabs {res['exact_maxabs']:.2e}, signal RMS {res['exact_rms']:.2f}")  # fmt: skip
    print(f"build {res['build_s']:.0f} s; load average {res['load_avg_start']} at start, {res['load_avg_end']} at the end "
          f"({res['cpus']} CPUs)")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
