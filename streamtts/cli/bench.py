"""``streamtts bench``: N concurrent streams of a fixed length, median/p95 numbers.

A benchmark, not a test: it reports, it asserts nothing. ``--null-backbone``
swaps llama.cpp for a zero-cost stand-in (same scheduler, sampling, state machine,
frame routing and codec) to measure the orchestration alone, as at GPU speeds: it
hands back the head logits as a GPU's fused heads do (``heads_backend: numpy`` in
the config keeps the NumPy heads instead). ``--null-codec`` swaps the codec for silence;
with both, what is left is the CPU side of a tick (sampling, state machines, embedding
sums, frame routing and delivery).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import platform
import statistics
import time
from typing import Any, cast

import numpy as np

from ..audio.continuity import continuity_row
from ..constants import FRAME_S, SAMPLE_RATE
from ..engine.stand_ins import null_backbone_factory, null_codec_factory
from ..model.backbone import KV_PAD

log = logging.getLogger(__name__)


# a stream's chunk sizes (StreamOptions.chunk_frames); None: the config's
Policy = tuple[int, ...] | None


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return float(np.percentile(np.asarray(values), q))


async def _one(engine: Any, text: str, frames: int, seed: int, chunks: Policy = None) -> dict[str, Any]:
    from ..request import StreamOptions

    s = engine.stream(text, options=StreamOptions(seed=seed, fixed_frames=frames, chunk_frames=chunks))
    n = 0
    arrivals = []  # (when, audio seconds): what a listener would hear (audio/continuity.py)
    async with s:
        async for chunk in s:
            n += len(chunk.frames)
            arrivals.append((time.monotonic(), chunk.pcm.shape[0] / SAMPLE_RATE))
    d: dict[str, Any] = s.stats.as_dict()
    d["frames_received"] = n
    d["arrivals"] = arrivals
    return d


def _level_row(
    concurrency: int, arrival: str, frames: int, wall: float, total_frames: int, results: list[dict[str, Any]]
) -> dict[str, Any]:
    """One level's numbers from its measured streams' stats."""
    ttfa = [r["ttfa_ms"] for r in results]
    rtf = [r["rtf"] for r in results]
    return {
        "concurrency": concurrency,
        "arrival": arrival,
        "frames_per_stream": frames,
        "wall_s": round(wall, 3),
        "aggregate_frames_per_s": round(total_frames / wall, 2),
        "ttfa_ms_p50": round(_pct(ttfa, 50), 2),
        "ttfa_ms_p95": round(_pct(ttfa, 95), 2),
        "rtf_p50": round(_pct(rtf, 50), 4),
        "rtf_p95": round(_pct(rtf, 95), 4),
        "ms_per_step_p50": round(statistics.median(r["ms_per_step"] for r in results), 3),
        "ms_per_tick_p50": round(statistics.median(r["ms_per_tick"] for r in results), 3),
        "prefill_rows_computed": int(statistics.median(r["prompt_rows"] - r["prefix_cached_rows"] for r in results)),
        "prompt_rows": int(statistics.median(r["prompt_rows"] for r in results)),
        "realtime_streams": sum(1 for r in rtf if r < 1.0),
        **continuity_row([r["arrivals"] for r in results]),
    }


async def run_level(engine: Any, concurrency: int, frames: int, text: str, chunks: Policy = None) -> dict[str, Any]:
    t0 = time.monotonic()
    results = await asyncio.gather(*(_one(engine, text, frames, 1000 + i, chunks) for i in range(concurrency)))
    wall = time.monotonic() - t0
    total = sum(r["frames_received"] for r in results)
    return _level_row(concurrency, "burst", frames, wall, total, list(results))


async def run_level_joining(
    engine: Any, concurrency: int, frames: int, text: str, joiners: int, chunks: Policy = None
) -> dict[str, Any]:
    """Streams joining a busy engine: ``concurrency - 1`` long streams run (read as fast as
    produced, as a server pushes to clients that buffer); once each is 1.5 s ahead of a
    real-time listener, ``joiners`` streams join one after another. TTFA/RTF are the
    joiners'; frames/s counts every stream over the joiners' window; late chunks are the
    background's that would reach a listener (playback 200 ms after its first chunk) late."""
    from ..request import StreamOptions

    state = {"late": 0, "frames": 0, "counting": False}
    ready = [asyncio.Event() for _ in range(concurrency - 1)]

    async def background(i: int) -> None:
        s = engine.stream(text, options=StreamOptions(seed=500 + i, fixed_frames=1_000_000, chunk_frames=chunks))
        t0 = 0.0
        async with s:
            async for c in s:
                now = time.monotonic()
                t0 = t0 or now
                if now > t0 + 0.2 + c.frames.start * FRAME_S:
                    state["late"] += 1
                if state["counting"]:
                    state["frames"] += len(c.frames)
                if now + 1.5 < t0 + c.frames.stop * FRAME_S:
                    ready[i].set()

    tasks = [asyncio.create_task(background(i)) for i in range(concurrency - 1)]
    try:
        await asyncio.wait_for(asyncio.gather(*(ev.wait() for ev in ready)), 120)
        state["counting"], late0 = True, state["late"]
        t0 = time.monotonic()
        results = [await _one(engine, text, frames, 1000 + i, chunks) for i in range(joiners)]
        wall = time.monotonic() - t0
        state["counting"] = False
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    total = state["frames"] + sum(r["frames_received"] for r in results)
    row = _level_row(concurrency, "joining", frames, wall, total, results)
    # the background streams (none late) and the joining slot (every joiner real time)
    row["realtime_streams"] = (concurrency - 1 if state["late"] == late0 else 0) + int(
        all(r["rtf"] < 1.0 for r in results)
    )
    row["late_background_chunks"] = state["late"] - late0
    return row


def _make_engine(args: argparse.Namespace, levels: list[int]) -> Any:
    from ..engine.frontend import Engine

    engine = Engine.from_config(
        args.config,
        max_streams=max(levels),
        n_threads=args.n_threads,
        decode_context_frames=args.context_frames,
        tick_threads=args.tick_threads,
        # one policy: the engine's own (the kernel side's codec decodes its chunks too)
        chunk_frames=list(args.chunk_frames[0]) if args.chunk_frames and len(args.chunk_frames) == 1 else None,
    )
    if args.null_codec:
        engine.codec_factory = null_codec_factory
    if args.null_backbone:
        engine.backbone_factory = null_backbone_factory
        if engine.config.heads_backend == "auto":
            # what a GPU runs: the heads in the backbone's graph, their logits handed back
            # (``heads_backend: numpy`` in the config measures the NumPy heads instead)
            engine.config.heads_backend = "fused"
        if engine.config.codec_turns == "auto":
            # and, as on a GPU, the codec's thread does not take turns with the backbone's
            # compute: its decodes overlap the engine's ticks on the other cores
            engine.config.codec_turns = "never"
    return engine


async def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    levels = sorted(set(args.concurrency))
    # --kernel-bound with --repeat R: R sessions, each the engine's levels then (engine closed)
    # the kernel side, so every engine run has a kernel measurement taken next to it, and the
    # ratios are medians of those pairs (the machine's drift between them cancels out)
    paired = bool(args.kernel_bound and not args.null_backbone and args.arrival == "burst")
    sessions, reps = (args.repeat, 1) if paired else (1, args.repeat)
    out: dict[str, Any] = {
        "levels": [], "machine": platform.machine(), "null_backbone": bool(args.null_backbone),
        "null_codec": bool(args.null_codec),
    }  # fmt: skip
    runs: list[dict[str, Any]] = []
    kbs: list[dict[str, Any]] = []
    # --chunk-frames: policies compared in one engine, each level's policies back to back
    policies: list[Policy] = list(args.chunk_frames) if args.chunk_frames and len(args.chunk_frames) > 1 else [None]
    for _ in range(sessions):
        engine = _make_engine(args, levels)
        session: list[dict[str, Any]] = []
        async with engine:
            out["engine"] = engine.info
            await run_level(engine, 1, 40, args.text)  # warm-up
            for _ in range(reps):  # levels interleaved, so drift spreads over all of them
                for n in levels:
                    for chunks in policies:
                        session.append(await _run_one_level(engine, args, n, chunks))
            out["step_profile_ms"] = engine.step_profile()
        runs += session
        if paired:
            computed = session[-1]["prefill_rows_computed"]
            rows = max(computed, session[-1]["prompt_rows"])
            kb = kernel_bound(engine, levels, max(1, computed), args.frames, context_rows=rows)
            kbs.append(kb)
            by_n = {k["concurrency"]: k for k in kb["levels"]}
            for r in session:
                k = by_n[r["concurrency"]]
                r["engine_vs_kernel_throughput"] = round(r["aggregate_frames_per_s"] / k["frames_per_s"], 3)
                r["engine_vs_kernel_codec_throughput"] = round(
                    r["aggregate_frames_per_s"] / k["frames_per_s_with_codec"], 3
                )
    names = [_policy_name(p or engine.config.chunk_frames) for p in policies]
    out["levels"] = [
        _median_row([r for r in runs if r["concurrency"] == n and r["chunk_frames"] == name])
        for n in levels
        for name in names
    ]
    if args.repeat > 1:
        out["runs"] = runs
    for name in names:
        rows = [lv for lv in out["levels"] if lv["chunk_frames"] == name]
        base = next((lv for lv in rows if lv["concurrency"] == 1), None)
        if base is None:
            continue
        for lv in rows:
            lv["throughput_vs_1"] = round(lv["aggregate_frames_per_s"] / base["aggregate_frames_per_s"], 2)
            lv["ttfa_p95_vs_1"] = round(lv["ttfa_ms_p95"] / base["ttfa_ms_p95"], 2)
    out["arrival"] = args.arrival
    if kbs:
        kb = _median_kernel(kbs)
        out["kernel_bound"] = kb
        by_n = {k["concurrency"]: k for k in kb["levels"]}
        for lv in out["levels"]:
            k = by_n[lv["concurrency"]]
            lv["kernel_throughput_vs_1"] = k["throughput_vs_1"]
            lv["kernel_ttfa_vs_1"] = k["ttfa_vs_1"]
            for key in ("engine_vs_kernel_throughput", "engine_vs_kernel_codec_throughput"):
                lv[key] = round(lv[key], 2)  # the median of the sessions' ratios
    return out


async def _run_one_level(engine: Any, args: argparse.Namespace, n: int, chunks: Policy) -> dict[str, Any]:
    """One level (``n`` streams) of one chunk policy, its row naming the policy."""
    if args.arrival == "joining":
        res = await run_level_joining(engine, n, args.frames, args.text, args.joiners, chunks)
    else:
        res = await run_level(engine, n, args.frames, args.text, chunks)
    res["chunk_frames"] = _policy_name(chunks or engine.config.chunk_frames)
    log.info("concurrency %d, chunks %s: %s", n, res["chunk_frames"], res)
    return res


def _policy_name(chunks: tuple[int, ...] | list[int]) -> str:
    return ",".join(str(c) for c in chunks)


def _median_kernel(kbs: list[dict[str, Any]]) -> dict[str, Any]:
    """The kernel side over sessions: per level, the median of each number."""
    out = dict(kbs[0])
    out["levels"] = [
        _median_row([kb["levels"][i] for kb in kbs]) for i in range(len(kbs[0]["levels"]))
    ]
    out["prefill_ms"] = round(statistics.median(kb["prefill_ms"] for kb in kbs), 3)
    if len(kbs) > 1:
        out["sessions"] = kbs
    return out


def _median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-field median of repeated runs of one level."""
    out = dict(rows[0])
    for k, v in rows[0].items():
        if isinstance(v, (int, float)) and k != "concurrency":
            m = statistics.median(r[k] for r in rows)
            out[k] = type(v)(round(m, 4)) if isinstance(v, float) else int(m)
    out["repeats"] = len(rows)
    return out


def _median_ms(fn: Any, iters: int) -> float:
    fn()  # warm
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return 1000.0 * statistics.median(ts)


def kernel_bound(
    engine: Any, levels: list[int], prefill_rows: int, frames: int, iters: int = 20, *, context_rows: int = 0
) -> dict[str, Any]:
    """What llama.cpp alone allows: a bare backbone (same GGUF, threads, heads) times one
    decode of N rows (one per sequence) and one prefill of ``prefill_rows`` rows (at the
    positions after the prompt's cached prefix, where the engine computes them); from
    those, the best throughput and TTFA any scheduler could reach if everything else
    (Python, sampling, codec, threads) were free. Run with the engine closed.

    The decodes run where a stream's steps are: from its prompt (``context_rows``, the
    cached prefix included) on. A step's cost is set by the cells attended over, which
    llama.cpp rounds up to a multiple of 256 (14 % more per step past 1024 cells on the
    ``deep`` model), so the steps are timed in each run of positions with the same rounded
    count their streams pass through, and weighted by its length."""
    from ..errors import ModelFileError
    from ..model.backbone import Backbone, BackboneParams
    from ..model.fused import fused_columns, read_fused_info
    from ..model.tables import AudioHeads

    cfg, ids, info = engine.config, engine.ids, engine.info
    n_max = max(levels)
    try:  # the file the engine runs: plain, text rows only, or audio heads in the graph
        finfo = read_fused_info(info["backbone"])
    except ModelFileError:
        finfo = None
    fused = finfo is not None and finfo.has_audio
    steps = frames + ids.n_vq - 1  # steps per stream for `frames` frames
    first = max(prefill_rows, context_rows)  # a stream's first step decodes at about this position
    # runs of positions with the same rounded cell count, and the steps timed in each
    # (centred in it): (timed from, steps timed, positions of the run)
    runs = []
    for a in range(first, first + steps):
        if a == first or a % KV_PAD == 0:
            runs.append([a, 0])
        runs[-1][1] += 1
    timed = [(a + (n - min(iters, n)) // 2, min(iters, n), n) for a, n in runs]
    span = first + steps + 64
    params = BackboneParams(
        model_path=info["backbone"],
        n_ctx=n_max * (-(-span // 256) * 256),
        n_batch=max(prefill_rows, n_max),
        n_seq_max=n_max,
        n_threads=int(info["threads"]),
        n_gpu_layers=cfg.n_gpu_layers,
        type_k=cfg.kv_cache_type_k,
        type_v=cfg.kv_cache_type_v,
        flash_attn=str(cfg.flash_attn).lower(),
    )
    rng = np.random.default_rng(0)
    out: dict[str, Any] = {"prefill_rows": prefill_rows, "frames_per_stream": frames, "levels": []}
    with Backbone(params) as bb:
        h = bb.n_embd
        if finfo is not None:
            bb.set_logit_columns(fused_columns(bb, ids))
        else:
            bb.set_logit_columns(np.asarray([ids.gen_slot, ids.delay_slot], np.int32))
        # the heads as the engine runs them (same thread count)
        heads = None if fused else AudioHeads(cfg.lm_head_dir, ids, h, threads=cfg.heads_threads or int(info["threads"]))
        rows_max = max(prefill_rows, n_max)
        embd = rng.standard_normal((rows_max, h), dtype=np.float32) * 0.5
        pos, seq = np.zeros(rows_max, np.int32), np.zeros(rows_max, np.int32)
        flags = np.zeros(rows_max, np.int8)
        hidden = None if fused else np.zeros((n_max, h), np.float32)
        logits = np.zeros((n_max, bb.n_logit_columns), np.float32)
        audio = np.zeros((n_max, ids.n_vq * ids.audio_rows), np.float32)
        bb.bind(embd, pos, seq, flags, hidden, logits)
        next_pos = np.zeros(n_max, np.int32)

        def fill(n: int, a: int, b: int) -> None:  # positions [a, b) of sequences 0..n-1, untimed
            for i in range(n):
                for c in range(a, b, rows_max):
                    m = min(rows_max, b - c)
                    pos[:m] = np.arange(c, c + m, dtype=np.int32)
                    seq[:m] = i
                    flags[:m] = 0
                    bb.decode_bound(m, False, 0)

        # the rows a prompt computes come after the prefix the engine loads from its cache,
        # and cost more there than at position 0 (attention over the prefix: 22 rows after 47
        # cost 93 ms on the `mid` demo model, at position 0 76 ms)
        prefix = max(0, context_rows - prefill_rows)
        fill(1, 0, prefix)

        def prefill() -> None:  # one prompt's computed rows, one call (as the engine feeds it), then removed
            pos[:prefill_rows] = np.arange(prefix, prefix + prefill_rows, dtype=np.int32)
            seq[:prefill_rows] = 0
            flags[:prefill_rows] = 0
            flags[prefill_rows - 1] = 1
            bb.decode_bound(prefill_rows, not fused, 0)
            bb.seq_rm(0, prefix)

        t_prefill = _median_ms(prefill, max(3, iters // 4))
        bb.seq_rm(0)

        for n in sorted({1, *levels}):
            for i in range(n):
                bb.seq_rm(i)

            def step(n: int = n) -> None:
                pos[:n] = next_pos[:n]
                seq[:n] = np.arange(n, dtype=np.int32)
                flags[:n] = 1
                bb.decode_bound(n, not fused, 0)
                if heads is not None and hidden is not None:
                    heads(hidden[:n], audio[:n])
                next_pos[:n] += 1

            filled, total = 0, 0.0
            for at, k, length in timed:
                fill(n, filled, at)
                next_pos[:n] = at
                total += length * _median_ms(step, k)
                filled = at + k
            t_step = total / steps
            out["levels"].append({"concurrency": n, "step_ms": round(t_step, 3)})
        for i in range(n_max):
            bb.seq_rm(i)
    if heads is not None:
        heads.close()
    out["prefill_ms"] = round(t_prefill, 3)
    out["context_rows"] = first
    out["kv_runs"] = [length for _, _, length in timed]
    by_n = {lv["concurrency"]: lv["step_ms"] for lv in out["levels"]}
    for lv in out["levels"]:
        n, t = lv["concurrency"], lv["step_ms"]
        # all prompts prefilled, then every stream stepped together
        wall = n * t_prefill + steps * t
        lv["frames_per_s"] = round(1000.0 * n * frames / wall, 2)
        lv["ttfa_ms"] = round(n * t_prefill + ids.n_vq * t, 2)
        lv["throughput_vs_1"] = round(lv["frames_per_s"] / (1000.0 * frames / (t_prefill + steps * by_n[1])), 2)
        lv["ttfa_vs_1"] = round(lv["ttfa_ms"] / (t_prefill + ids.n_vq * by_n[1]), 2)
    # The codec's work on the same frames, bare: on a machine where it shares the backbone's
    # cores no scheduler avoids it, so the engine is also held to kernel + codec.
    codec_ms = codec_bound(engine, sorted(by_n), frames)
    for lv in out["levels"]:
        n = lv["concurrency"]
        wall = n * t_prefill + steps * lv["step_ms"] + codec_ms[n]
        lv["codec_ms"] = round(codec_ms[n], 2)
        lv["frames_per_s_with_codec"] = round(1000.0 * n * frames / wall, 2)
    return out


def codec_bound(engine: Any, levels: list[int], frames: int) -> dict[int, float]:
    """Bare codec time (ms) for N streams of ``frames`` frames each, decoded as the engine
    sends them: chunks of ``chunk_frames`` (the last size repeating), the N streams' chunks
    of one tick in one call. A fresh codec of the engine's kind, with the engine closed."""
    from ..engine.assemble import build_codec
    from ..engine.decoding import DecodeJob

    cfg, ids = engine.config, engine.ids
    codec = build_codec(cfg, ids)
    sizes = list(cfg.chunk_frames) or [1]
    rng = np.random.default_rng(0)
    out: dict[int, float] = {}
    for n in levels:
        rids = [100_000 * n + i for i in range(n)]
        total = 0.0
        sent = chunk = 0
        while sent < frames:
            size = min(sizes[min(chunk, len(sizes) - 1)], frames - sent)
            jobs = [
                DecodeJob(rid, cast(Any, None), rng.integers(0, ids.audio_vocab_size, (size, ids.n_vq)), sent, 0)
                for rid in rids
            ]
            for a in range(0, n, codec.max_batch):
                t0 = time.perf_counter()
                codec.decode(jobs[a : a + codec.max_batch])
                total += time.perf_counter() - t0
            sent += size
            chunk += 1
        for rid in rids:
            codec.forget(rid)
        out[n] = 1000.0 * total
    return out


# (key in a level row, column header); the legend below says what they mean
COLUMNS = [
    ("concurrency", "streams"),
    ("chunk_frames", "chunks"),
    ("aggregate_frames_per_s", "frames/s"),
    ("throughput_vs_1", "x1"),
    ("ttfa_ms_p50", "TTFA p50 ms"),
    ("ttfa_ms_p95", "TTFA p95 ms"),
    ("ttfa_p95_vs_1", "p95 x1"),
    ("rtf_p50", "RTF p50"),
    ("rtf_p95", "RTF p95"),
    ("ms_per_step_p50", "ms/step"),
    ("ms_per_tick_p50", "ms/tick"),
    ("realtime_streams", "real time"),
    ("c50", "C50"),
    ("c100", "C100"),
    ("c200", "C200"),
    ("underrun_ms_p95", "underrun p95 ms"),
]
KERNEL_COLUMNS = [
    ("kernel_throughput_vs_1", "kernel x1"),
    ("kernel_ttfa_vs_1", "kernel TTFA x1"),
    ("engine_vs_kernel_throughput", "engine/kernel"),
    ("engine_vs_kernel_codec_throughput", "engine/(kernel+codec)"),
]
LEGEND = (
    "frame: 80 ms of audio (12.5 per second of speech). frames/s: audio frames of all streams per "
    "wall-clock second. TTFA: time to first audio, request to first chunk. RTF: real-time factor, "
    "generation time / audio length (< 1 is faster than real time). x1: relative to 1 stream. "
    "real time: streams with RTF < 1. ms/step: a tick's decode and sampling (a tick: all streams "
    "advance one frame). ms/tick: wall time per tick from a stream's first audio to its last "
    "(all the machine did meanwhile: routing, the codec, the other threads). C50/C100/C200: "
    "streams a real-time listener, playing from its first audio plus a 50/100/200 ms buffer, "
    "hears without an underrun; underrun p95: the p95 of each stream's longest underrun at 100 ms. "
    "chunks: the frames of a stream's first chunk, then the ramp (the last repeating)."
)
KERNEL_LEGEND = (
    " kernel: bare llama.cpp decodes of N rows, the ratios a perfect scheduler would reach; "
    "engine/kernel: the engine's share of that throughput; engine/(kernel+codec): its share "
    "when the kernel side also decodes the same frames with the codec, bare, after the backbone "
    "(what no scheduler avoids when the codec shares the backbone's cores)."
)
JOINING_LEGEND = (
    " joining: N-1 streams run, then streams join one by one (their TTFA); late chunks: "
    "background chunks a real-time listener would have got late."
)


def print_table(res: dict[str, Any]) -> None:
    """The levels as a table that fits the terminal, and a legend under it: one row per level
    when that fits, else one row per measure (a column per level)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    stand_ins = [name for name, on in (("backbone", res["null_backbone"]), ("codec", res.get("null_codec"))) if on]
    title = "streamtts bench" + (f" (zero-cost {' and '.join(stand_ins)})" if stand_ins else "")
    legend = LEGEND
    cols = list(COLUMNS)
    if "kernel_bound" in res:
        cols += KERNEL_COLUMNS
        legend += KERNEL_LEGEND
    if res.get("arrival") == "joining":
        title += ": streams joining N-1 running ones"
        cols.append(("late_background_chunks", "late chunks"))
        legend += JOINING_LEGEND
    console = Console()  # the terminal's width (80 columns when not a terminal)
    t = Table(title=title, box=box.SIMPLE_HEAD)
    for _, header in cols:
        t.add_column(header, justify="right", no_wrap=True)
    for lv in res["levels"]:
        t.add_row(*(_cell(lv, key) for key, _ in cols))
    natural = Console(width=10_000).measure(t).maximum  # unconstrained: measure() clamps to the width
    if natural > console.width:
        t = Table(title=title, box=box.SIMPLE_HEAD)
        t.add_column("streams", no_wrap=True)
        for lv in res["levels"]:
            t.add_column(f"{lv['concurrency']} ({lv['chunk_frames']})", justify="right", no_wrap=True)
        for key, header in cols[2:]:
            t.add_row(header, *(_cell(lv, key) for lv in res["levels"]))
    console.print(t)
    console.print(legend, style="dim")


def _cell(level: dict[str, Any], key: str) -> str:
    v = level.get(key, "")
    if key == "realtime_streams":
        return f"{v}/{level['concurrency']}"
    if key in ("c50", "c100", "c200") and isinstance(v, float):
        return f"{100 * v:.0f} %"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 10 else f"{v:.0f}"
    return str(v)


def add_parser(sub: Any) -> None:
    from .common import chunk_list

    p = sub.add_parser(
        "bench", help="benchmark N concurrent fixed-length streams (median / p95)",
        description="N concurrent fixed-length streams: throughput, time to first audio and "
        "real-time factor. A benchmark reports; run it on a quiet machine and compare ratios "
        "within one run.",
    )  # fmt: skip
    p.add_argument("--config", help="YAML config; default: the demo model")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1], help="levels, e.g. 1 2 4 8")
    p.add_argument("--frames", type=int, default=50, help="audio frames per stream (12.5 per second)")
    p.add_argument(
        "--repeat", type=int, default=1,
        help="runs per level (interleaved; with --kernel-bound each run a fresh engine followed by "
        "its own kernel measurement); the table shows medians",
    )  # fmt: skip
    p.add_argument("--text", default="The quick brown fox jumps over the lazy dog.", help="what every stream says")
    p.add_argument("--n-threads", type=int, help="llama.cpp CPU threads; default: the config's (0 = automatic)")
    p.add_argument(
        "--tick-threads", type=int,
        help="threads a tick's sampling and embedding are cut across; default: the config's (0 = automatic)",
    )  # fmt: skip
    p.add_argument("--context-frames", type=int, help="codec left context (decode_context_frames); default: the config's")
    p.add_argument("--null-backbone", action="store_true", help="zero-cost backbone: orchestration only")
    p.add_argument(
        "--null-codec", action="store_true",
        help="zero-cost codec (silence, nothing decoded): with --null-backbone, the CPU side of a tick alone",
    )  # fmt: skip
    p.add_argument(
        "--arrival", choices=["burst", "joining"], default="burst",
        help="burst: N streams start at once; joining: N-1 run, then --joiners streams join one by one",
    )  # fmt: skip
    p.add_argument("--joiners", type=int, default=5, help="streams that join, one by one, per level (--arrival joining)")
    p.add_argument(
        "--kernel-bound",
        action="store_true",
        help="also time bare llama.cpp decodes of N rows (same GGUF and threads): the ratios a "
        "perfect scheduler would reach, and the engine's share of that throughput",
    )
    p.add_argument(
        "--chunk-frames", type=chunk_list, nargs="+", metavar="SIZES",
        help="chunk policies to compare in one run, each the frames of the first chunk then the "
        "ramp, joined by commas (e.g. 1,2,4,8 2,4,8 4,8): every level runs once per policy, "
        "back to back; default: the config's chunk_frames",
    )  # fmt: skip
    p.add_argument("--json", metavar="FILE", help="also write every number as JSON to FILE (- = stdout, after the table)")
    p.set_defaults(handler=_main, check=_check)


def _check(args: argparse.Namespace) -> None:
    from ..errors import UsageError
    from .common import check_config, check_output_file

    check_config(args)
    if args.json and args.json != "-":
        check_output_file(args.json, "--json", audio=False)
    if args.null_codec and args.kernel_bound:
        raise UsageError("--kernel-bound times the real codec beside llama.cpp: drop --null-codec")
    if args.tick_threads is not None and args.tick_threads < 0:
        raise UsageError("--tick-threads must be >= 0 (0 = automatic)")
    if args.kernel_bound and args.chunk_frames and len(args.chunk_frames) > 1:
        raise UsageError("--kernel-bound times the codec for one chunk policy: give one --chunk-frames")
    if any(n < 1 for n in args.concurrency) or args.frames < 1 or args.repeat < 1 or args.joiners < 1:
        raise UsageError("--concurrency levels, --frames, --repeat and --joiners must be >= 1")


async def _main(args: argparse.Namespace) -> int:
    from .common import demo_notice

    demo_notice(args)
    res = await run_bench(args)
    print_table(res)
    if args.json == "-":
        print(json.dumps(res, indent=2))
    elif args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(json.dumps(res, indent=2) + "\n")
    return 0
