"""The engine's step and time to first audio against bare llama.cpp, measured in one run.

    python benchmarks/step_overhead.py [--config CFG] [--reps 5] [--json out.json]
        [--compare before=/path/to/old/checkout ...]

Engine side, as ``streamtts synth`` runs it (a fresh process and engine per run, the config
as it is, default sampling, seed 1), for this checkout and each ``--compare NAME=DIR`` (another
checkout's ``streamtts``, e.g. the commit before a change: before/after in one run):
- per-step slope: (wall time of a 300-step stream - that of a 100-step one) / 200, submit
  to last audio; fixed costs (prompt, prefill, first audio) cancel out;
- TTFA: request to first audio, the first request of a fresh engine (its warm-up at start,
  the ``warmup`` key, has cached the default prompt's prefix, as a server's first client
  finds it; ``start_s`` is the load with that warm-up);
- the engine's own per-step profile (embed / backbone / heads / sampling / other).

Bare side, the same bridge, threads and prompts, no engine around them, each step a
one-row ``llama_decode`` (hidden state out) then the audio heads, in one loop, at the
positions of the decodes the slope counts (a step's cost depends on its position):
- ``official``: the plain backbone GGUF (its whole text head, as the official pipeline runs
  it) and the heads as one NumPy matmul on 2 BLAS threads (issue #16's bare step);
- ``engine file``: the GGUF the engine runs (text rows only, or fused heads) and the heads
  the faster of two ways (2 BLAS threads; split in 2 single-threaded parts): the bound for
  the arrangement the engine uses;
- prefill of the whole TTFA prompt (``prefill_chunk`` rows a call, nothing cached, hidden
  state of the last row) with its first 32 steps, and one codec call decoding the first
  frame (streaming slot or window, as the engine does); also the prefill of only the rows
  after the cacheable prefix, that prefix already in the KV cache (``prefill_rest_ms``).
Limits: step = decode + heads, over the slope's positions: per run of positions with the
same padded cell count (llama.cpp attends over the used cells rounded up to 256) the median
step, weighted by the run's length; also the plain median and the mean step (which counts
stalls, as the engine's slope, a mean over 200 steps, does); ``plus_codec``: the step plus the codec's
bare work per step (the frames steps 100..300 complete, in the engine's chunk sizes), which
the engine's slope includes and a bare step does not; TTFA = prefill of the whole prompt + its
32 steps + codec call (issue #16's limit); ``cached_prefix``: the same with the prefill of the
rest only, the work the engine does for its first request once the prefix is cached. Everything is interleaved per repetition and the medians over repetitions reported
(a shared machine is noisy); ``*_paired`` is the median of each repetition's engine run
divided by the bare run next to it (drift between repetitions cancels).
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
import types
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from streamtts.cli.bench import codec_bound
from streamtts.codec import load_decoder, load_streaming_decoder
from streamtts.config import EngineConfig, find_model_config, load_config
from streamtts.core.prompt import HFTokenizer, PromptSpec, build_prompt_ex
from streamtts.core.tokens import TokenIds, load_token_ids
from streamtts.demo.model import ensure_demo_model
from streamtts.engine.prepare import Preparer
from streamtts.model.backbone import KV_PAD, Backbone, BackboneParams
from streamtts.model.fused import fused_columns, read_fused_info
from streamtts.model.tables import AudioHeads, Embedder
from streamtts.text.normalize import normalize_text

TEXT = "The quick brown fox jumps over the lazy dog, then naps in the warm afternoon sun."
# the demo model speaks about 380 steps of it; short enough for one generation (no segments)
LONG = " ".join(
    [
        "The quick brown fox jumps over the lazy dog, then naps in the warm afternoon sun.",
        "Meanwhile the river keeps running past the old mill, carrying leaves toward the sea.",
        "Children laugh in the square while the baker sets out bread that smells of honey.",
    ]
    * 6
)
SHORT_STEPS, LONG_STEPS = 100, 300


def emit(report: dict[str, Any], path: str | None) -> None:
    """Print the report as JSON, and write it to ``path`` too when one is given."""
    text = json.dumps(report, indent=2)
    print(text)
    if path:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text + "\n")


def _ms(xs: list[float]) -> float:
    return 1000.0 * statistics.median(xs)


def _block_ms(positions: list[int], xs: list[float]) -> float:
    """The mean over ``positions`` of a step's cost, robust to stalls: the median of each
    run of positions that attend over the same padded cell count, weighted by its length
    (a plain median would miss the dearer steps past a boundary, a mean counts stalls)."""
    blocks: dict[int, list[float]] = {}
    for p, x in zip(positions, xs, strict=True):
        blocks.setdefault(p // KV_PAD, []).append(x)
    return 1000.0 * sum(len(v) * statistics.median(v) for v in blocks.values()) / len(xs)


# -- engine -----------------------------------------------------------------------------------


async def synth_like(cfg_path: str, text: str, steps: int) -> dict[str, Any]:
    """One stream on a fresh engine, default config and sampling (what ``synth`` does)."""
    from streamtts import Engine
    from streamtts.request import StreamOptions

    t0 = time.perf_counter()
    async with Engine.from_config(cfg_path) as e:
        start_s = time.perf_counter() - t0
        s = e.stream(text, options=StreamOptions(seed=1, max_new_tokens=steps))
        async with s:
            async for _ in s:
                pass
        st = s.stats
        return {
            "start_s": start_s,
            "warmup_s": getattr(e, "warmup_s", None) or 0.0,
            "wall_s": st.t_done - st.t_submit,
            "ttfa_s": st.ttfa_s,
            "steps": st.steps,
            "profile": e.step_profile(),
            "threads": int(e.info["threads"]),
            "engine_file": e.info["backbone"],
            "heads": e.info["heads"],
            "codec": e.info["codec"],
        }


def engine_run(cfg_path: str, text: str, steps: int, pythonpath: str | None) -> dict[str, Any]:
    """``synth_like`` in a fresh process, on the ``streamtts`` found at ``pythonpath``."""
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    cmd = [sys.executable, __file__, "--engine-run", cfg_path, "--text", text, "--steps", str(steps)]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


# -- bare -------------------------------------------------------------------------------------


def _prompt(cfg: EngineConfig, ids: TokenIds, text: str) -> tuple[np.ndarray, int]:
    """The prompt, and the rows of it the engine's prefix cache holds (0: none)."""
    want = cfg.prefix_cache_mib > 0
    prompt, prefix = build_prompt_ex(HFTokenizer(cfg.tokenizer_dir), ids, PromptSpec(text=normalize_text(text)), prefix=want)
    return prompt, prefix if want and prefix >= Preparer.MIN_PREFIX_ROWS else 0


def _pieces(n_rows: int, prefix: int, chunk: int) -> list[tuple[int, int]]:
    """The engine's prefill partition: the prefix, then the rest, each in ``chunk``-row calls."""
    out = []
    for a, b in ((0, prefix), (prefix, n_rows)):
        out += [(s, min(s + chunk, b)) for s in range(a, b, chunk)]
    return out


# the audio heads after each one-row decode: (name, BLAS threads, our parts)
# (split first: OpenBLAS's idle workers spin for a while after a 2-thread call)
HEADS_WAYS = (("split2", 1, 2), ("blas2", 2, 1))


def slope_positions(prompt_rows: int, n: int) -> list[int]:
    """The positions of the decodes the slope counts, or ``n`` of them evenly spread: a
    stream of N steps decodes rows at positions S .. S + N - 2 (S prompt rows; its first
    row comes from the prompt's last), so a 300-step stream makes 200 decodes more than a
    100-step one, at S + 99 .. S + 298. Their cost is not a line in the position: llama.cpp
    pads the cells it attends over to a multiple of 256, so a step costs more from each
    such boundary on (on the ``deep`` model +14 % past 1024 cells, which the long text's
    stream crosses at step 263). The bare step is their mean, as the slope is."""
    first, count = prompt_rows + SHORT_STEPS - 1, LONG_STEPS - SHORT_STEPS
    n = max(1, min(n, count))
    return [first + (i * count) // n for i in range(n)]


def bare_file(
    cfg: EngineConfig,
    ids: TokenIds,
    emb: Embedder,
    gguf: str,
    threads: int,
    steps: int,
    ttfa_prompt: tuple[np.ndarray, int],
    long_prompt: np.ndarray,
) -> dict[str, float]:
    """On ``gguf``: prefill of the TTFA prompt (the engine's partition) and its first 32
    steps, then one-row steps at the positions the slope counts (``slope_positions``: all
    of them, or ``steps`` spread over them, the rows between filled untimed). Each step is a
    decode then the audio heads (unless the file computes them), timed apart but run in
    one loop as the engine does: the heads' 67-270 MB of weights and the backbone's evict
    each other from the caches, which a loop of heads alone would not show. The heads run
    each way of ``HEADS_WAYS`` in turn, ``steps`` steps each."""
    try:
        info = read_fused_info(gguf)
    except Exception:
        info = None
    in_graph = info is not None and info.has_audio
    prompt, prefix = ttfa_prompt
    s = prompt.shape[0]
    p = BackboneParams(model_path=gguf, n_ctx=cfg.n_ctx, n_batch=cfg.n_batch, n_threads=threads)
    res: dict[str, float] = {"heads_in_graph": float(in_graph)}
    seq0 = np.zeros(cfg.n_batch, np.int32)
    ways = [] if in_graph else [(name, blas, AudioHeads(cfg.lm_head_dir, ids, emb.n_embd, threads=parts)) for name, blas, parts in HEADS_WAYS]
    audio = np.zeros((1, ids.n_vq * ids.audio_rows), np.float32)
    with Backbone(p) as bb:
        cols = fused_columns(bb, ids, path=gguf) if info is not None else np.array([ids.gen_slot, ids.delay_slot], np.int32)
        bb.set_logit_columns(cols)
        h = None if in_graph else np.zeros((1, emb.n_embd), np.float32)
        lg = np.zeros((1, cols.size), np.float32)
        pos = np.arange(cfg.n_ctx, dtype=np.int32)

        def step(row: np.ndarray, at: int, heads: AudioHeads | None) -> tuple[float, float]:
            t0 = time.perf_counter()
            bb.decode(row, pos[at : at + 1], seq0[:1], np.ones(1, np.int8), h, lg)
            t1 = time.perf_counter()
            if heads is not None and h is not None:
                heads(h, audio)
            return t1 - t0, time.perf_counter() - t1

        pe = emb.embed_rows(prompt)

        def prefill(pieces: list[tuple[int, int]]) -> float:
            t0 = time.perf_counter()
            for a, b in pieces:
                out = np.zeros(b - a, np.int8)
                last = b == s
                out[-1] = 1 if last else 0
                bb.decode(np.ascontiguousarray(pe[a:b]), pos[a:b], seq0[: b - a], out, h if last else None, lg)
            return 1000 * (time.perf_counter() - t0)

        res["prefill_ms"] = prefill(_pieces(s, 0, cfg.prefill_chunk))
        row = np.ascontiguousarray(pe[-1:])
        with threadpool_limits(1, user_api="blas"):  # the decode steps to the first frame
            first = [step(row, s + i, ways[-1][2] if ways else None) for i in range(32)]
        res["first32_decode_ms"] = 1000 * sum(d for d, _ in first)
        bb.seq_rm(0)
        # the rows after the cached prefix, with the prefix in the KV cache
        prefill(_pieces(prefix, 0, cfg.prefill_chunk))
        res["prefill_rest_ms"] = prefill([(a, b) for a, b in _pieces(s, prefix, cfg.prefill_chunk) if a >= prefix])
        le = emb.embed_rows(long_prompt)
        at = slope_positions(le.shape[0], steps)
        ctx = np.concatenate([le, np.repeat(le[-1:], at[-1] + 1 - le.shape[0], 0)])
        row = np.ascontiguousarray(le[-1:])

        def fill(a: int, b: int) -> None:  # rows [a, b) into the KV cache, untimed
            for c in range(a, b, cfg.n_batch):
                d = min(c + cfg.n_batch, b)
                bb.decode(np.ascontiguousarray(ctx[c:d]), pos[c:d], seq0[: d - c], np.zeros(d - c, np.int8), None, None)

        for name, blas, heads in ways or [("none", 1, None)]:
            bb.seq_rm(0)
            dt = []
            with threadpool_limits(blas, user_api="blas"):
                last = 0
                for p in at:
                    fill(last, p)
                    dt.append(step(row, p, heads))
                    last = p + 1
            res[f"decode_{name}_ms"] = _block_ms(at, [d for d, _ in dt])
            if heads is not None:
                res[f"heads_{name}_ms"] = _ms([x for _, x in dt])
            res[f"step_{name}_ms"] = _block_ms(at, [d + x for d, x in dt])
            res[f"step_{name}_median_ms"] = _ms([d + x for d, x in dt])
            # the mean counts every stall as the engine's slope does (a median skips them)
            res[f"step_{name}_mean_ms"] = 1000.0 * sum(d + x for d, x in dt) / len(dt)
    for _, _, heads in ways:
        heads.close()
    return res


def codec_step_ms(cfg: EngineConfig, ids: TokenIds) -> float:
    """The codec's bare work per step of the slope: the frames steps 100..300 complete, in
    the engine's chunks (each step completes one frame once the first ``n_vq - 1`` are done)."""
    ns = types.SimpleNamespace(config=cfg, ids=ids)
    short, long = (codec_bound(ns, [1], n - (ids.n_vq - 1))[1] for n in (SHORT_STEPS, LONG_STEPS))
    return (long - short) / (LONG_STEPS - SHORT_STEPS)


def codec_first_frame_ms(cfg: EngineConfig, iters: int = 5) -> float:
    """One codec call for a stream's first frame, with the codec the engine uses."""
    codes = np.zeros((1, 1, 32), np.int64)
    streaming = load_streaming_decoder(cfg, 1)
    dt = []
    if streaming is not None:
        for i in range(iters + 1):
            slot = streaming.acquire()
            t0 = time.perf_counter()
            streaming.decode(np.array([slot], np.int64), codes, np.array([1], np.int64))
            if i:
                dt.append(time.perf_counter() - t0)
            streaming.release(slot)
    else:
        dec = load_decoder(cfg)
        dec.decode(codes)
        for _ in range(iters):
            t0 = time.perf_counter()
            dec.decode(codes)
            dt.append(time.perf_counter() - t0)
    return _ms(dt)


def _version_rows(cfg_path: str, pythonpath: str | None) -> dict[str, Any]:
    """One repetition of the engine side: slope (100 vs 300 steps, in alternating order
    across calls) and TTFA, each run in a fresh process."""
    runs = {n: engine_run(cfg_path, LONG, n, pythonpath) for n in (SHORT_STEPS, LONG_STEPS)}
    first = engine_run(cfg_path, TEXT, 40, pythonpath)  # TTFA of the short text: a fresh engine's first request
    return {
        "threads": runs[LONG_STEPS]["threads"],
        "slope_ms": 1000 * (runs[LONG_STEPS]["wall_s"] - runs[SHORT_STEPS]["wall_s"]) / (LONG_STEPS - SHORT_STEPS),
        "steps_short": runs[SHORT_STEPS]["steps"],
        "steps_long": runs[LONG_STEPS]["steps"],
        "ttfa_ms": 1000 * first["ttfa_s"],
        "start_ms": 1000 * first["start_s"],
        "warmup_ms": 1000 * first["warmup_s"],
        **{f"profile_{k}_ms": v for k, v in runs[LONG_STEPS]["profile"].items()},
        "_info": {k: runs[LONG_STEPS][k] for k in ("engine_file", "heads", "codec")},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="default: the demo model")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument(
        "--bare-steps", type=int, default=LONG_STEPS - SHORT_STEPS,
        help="bare steps per way: all the slope's positions (default), or this many spread over them",
    )  # fmt: skip
    ap.add_argument("--compare", nargs="*", default=[], metavar="NAME=DIR", help="other checkouts to run the engine side of")
    ap.add_argument("--json")
    ap.add_argument("--engine-run", metavar="CFG", help=argparse.SUPPRESS)  # internal: one engine run
    ap.add_argument("--text", help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.engine_run:
        print(json.dumps(asyncio.run(synth_like(a.engine_run, a.text, a.steps))))
        return
    cfg_path = a.config or str(ensure_demo_model())
    cfg = load_config(cfg_path)
    ids = load_token_ids(find_model_config(cfg))
    emb = Embedder(cfg.embedding_dir, ids)
    ttfa_prompt = _prompt(cfg, ids, TEXT)
    long_prompt = _prompt(cfg, ids, LONG)[0]
    versions: list[tuple[str, str | None]] = [("this", None)]
    versions += [(v.split("=", 1)[0], v.split("=", 1)[1]) for v in a.compare]
    eng: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in versions}
    bare: list[dict[str, Any]] = []
    info: dict[str, Any] = {}
    t_start = time.time()
    load0 = os.getloadavg()[0]
    for rep in range(a.reps):  # interleave versions and bare runs so drift hits all of them
        order = versions if rep % 2 == 0 else versions[::-1]
        for name, path in order:
            row = _version_rows(cfg_path, path)
            info[name] = row.pop("_info")
            eng[name].append(row)
        threads = eng["this"][-1]["threads"]
        engine_file = info["this"]["engine_file"]
        b: dict[str, Any] = {"threads": threads}
        b.update({f"official_{k}": v for k, v in bare_file(cfg, ids, emb, cfg.backbone_gguf, threads, a.bare_steps, ttfa_prompt, long_prompt).items()})
        if engine_file != cfg.backbone_gguf:
            fb = bare_file(cfg, ids, emb, engine_file, threads, a.bare_steps, ttfa_prompt, long_prompt)
        else:
            fb = {k[len("official_") :]: v for k, v in b.items() if k.startswith("official_")}
        b.update({f"file_{k}": v for k, v in fb.items()})
        b["codec_first_frame_ms"] = codec_first_frame_ms(cfg)
        b["codec_step_ms"] = codec_step_ms(cfg, ids)
        bare.append(b)
        print(json.dumps({"rep": rep, "bare": b, **{n: eng[n][-1] for n in eng}}, default=str), flush=True)
    med_b = {k: statistics.median(float(r[k]) for r in bare) for k in bare[0]}
    in_graph = med_b["file_heads_in_graph"] > 0.5
    # official: the plain file, heads as one matmul on 2 BLAS threads (issue #16's bare step);
    # engine file: its decode, and the heads the faster of the two ways
    official_step = med_b["official_step_blas2_ms"]
    best = "none" if in_graph else min(("blas2", "split2"), key=lambda k: med_b[f"file_step_{k}_ms"])

    def limits(b: dict[str, Any]) -> tuple[float, float, float, float]:
        """The engine file's bare step, the same plus the codec's work per step, and the TTFA
        limits (whole prompt; rest after the cached prefix), from one repetition or the medians."""
        heads = 0.0 if in_graph else float(b[f"file_heads_{best}_ms"])
        after = float(b["file_first32_decode_ms"]) + 32 * heads + float(b["codec_first_frame_ms"])
        step = float(b[f"file_step_{best}_ms"])
        return step, step + float(b["codec_step_ms"]), float(b["file_prefill_ms"]) + after, float(b["file_prefill_rest_ms"]) + after

    file_step, file_step_codec, file_ttfa, file_ttfa_rest = limits(med_b)
    file_step_mean = med_b[f"file_step_{best}_mean_ms"]
    official_ttfa = med_b["official_prefill_ms"] + med_b["official_first32_decode_ms"] + 32 * med_b["official_heads_blas2_ms"]
    official_ttfa += med_b["codec_first_frame_ms"]
    report: dict[str, Any] = {
        "config": cfg_path,
        "reps": a.reps,
        "load_average_start_end": [round(load0, 2), round(os.getloadavg()[0], 2)],
        "minutes": round((time.time() - t_start) / 60, 1),
        "bare_median": {k: round(v, 3) for k, v in med_b.items()},
        "bare_step_official_ms": round(official_step, 3),
        "bare_step_engine_file_ms": round(file_step, 3),
        "bare_step_engine_file_mean_ms": round(file_step_mean, 3),
        "bare_step_engine_file_median_ms": round(med_b[f"file_step_{best}_median_ms"], 3),
        "bare_step_engine_file_heads": best,
        "bare_step_engine_file_plus_codec_ms": round(file_step_codec, 3),
        "ttfa_limit_official_ms": round(official_ttfa, 1),
        "ttfa_limit_engine_file_ms": round(file_ttfa, 1),
        "ttfa_limit_engine_file_cached_prefix_ms": round(file_ttfa_rest, 1),
        "engines": {},
    }
    per_rep = [limits(b) for b in bare]
    for name, rows in eng.items():
        med = {k: statistics.median(float(r[k]) for r in rows) for k in rows[0]}
        # each repetition's engine run against the bare run next to it: drift between
        # repetitions cancels; the median of those ratios
        slope_pairs = [float(r["slope_ms"]) / lim[0] for r, lim in zip(rows, per_rep, strict=True)]
        codec_pairs = [float(r["slope_ms"]) / lim[1] for r, lim in zip(rows, per_rep, strict=True)]
        ttfa_pairs = [float(r["ttfa_ms"]) / lim[2] for r, lim in zip(rows, per_rep, strict=True)]
        rest_pairs = [float(r["ttfa_ms"]) / lim[3] for r, lim in zip(rows, per_rep, strict=True)]
        report["engines"][name] = {
            **info[name],
            "median": {k: round(v, 3) for k, v in med.items()},
            "slope_per_rep_ms": [round(r["slope_ms"], 2) for r in rows],
            "slope_vs_bare_official": round(med["slope_ms"] / official_step, 3),
            "slope_vs_bare_engine_file": round(med["slope_ms"] / file_step, 3),
            "slope_vs_bare_engine_file_mean": round(med["slope_ms"] / file_step_mean, 3),
            "ttfa_vs_limit_official": round(med["ttfa_ms"] / official_ttfa, 3),
            "ttfa_vs_limit_engine_file": round(med["ttfa_ms"] / file_ttfa, 3),
            "slope_vs_bare_engine_file_paired": round(statistics.median(slope_pairs), 3),
            "slope_vs_bare_engine_file_per_rep": [round(x, 3) for x in slope_pairs],
            "slope_vs_bare_engine_file_plus_codec": round(med["slope_ms"] / file_step_codec, 3),
            "slope_vs_bare_engine_file_plus_codec_paired": round(statistics.median(codec_pairs), 3),
            "ttfa_vs_limit_engine_file_paired": round(statistics.median(ttfa_pairs), 3),
            "ttfa_vs_limit_engine_file_per_rep": [round(x, 3) for x in ttfa_pairs],
            "ttfa_vs_limit_engine_file_cached_prefix": round(med["ttfa_ms"] / file_ttfa_rest, 3),
            "ttfa_vs_limit_engine_file_cached_prefix_paired": round(statistics.median(rest_pairs), 3),
        }
    emit(report, a.json)


if __name__ == "__main__":
    main()
