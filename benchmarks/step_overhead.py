"""Per-step overhead and time to first audio against their limits, measured in one run.

    python benchmarks/step_overhead.py [--config CFG] [--reps 5] [--json out.json]

The limits come from the same bridge and model used bare:
- step limit: one single-row ``llama_decode`` (hidden state out) + the audio-head matmul;
- TTFA limit: prefill of the same prompt (same call partition) + 32 x step limit + decoding
  one frame with the codec.
The engine's numbers come from a real stream (greedy, fixed length). Everything is
interleaved and repeated; medians are reported as ratios (this machine is noisy).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import numpy as np

from streamtts import Engine
from streamtts.codec import load_decoder
from streamtts.config import SamplingParams, find_model_config, load_config
from streamtts.core.prompt import HFTokenizer, PromptSpec, build_prompt
from streamtts.core.tokens import load_token_ids
from streamtts.demo.model import ensure_demo_model
from streamtts.model.backbone import Backbone, BackboneParams, physical_cores
from streamtts.model.weights import AudioHeads, Embedder
from streamtts.request import StreamOptions
from streamtts.text.normalize import normalize_text

TEXT = "The quick brown fox jumps over the lazy dog, then naps in the warm afternoon sun."


def bare_limits(cfg: Any, threads: int, steps: int) -> dict[str, float]:
    ids = load_token_ids(find_model_config(cfg))
    tok = HFTokenizer(cfg.tokenizer_dir)
    prompt = build_prompt(tok, ids, PromptSpec(text=normalize_text(TEXT)))
    emb = Embedder(cfg.embedding_dir, ids)
    heads = AudioHeads(cfg.lm_head_dir, ids, emb.n_embd)
    dec = load_decoder(cfg)
    s = prompt.shape[0]
    p = BackboneParams(model_path=cfg.backbone_gguf, n_ctx=cfg.n_ctx, n_batch=cfg.n_batch, n_threads=threads)
    with Backbone(p) as bb:
        bb.set_logit_columns(np.array([ids.gen_slot, ids.delay_slot], np.int32))
        h = np.zeros((1, emb.n_embd), np.float32)
        lg = np.zeros((1, 2), np.float32)
        audio = np.zeros((1, ids.n_vq * ids.audio_rows), np.float32)
        pe = emb.embed_rows(prompt)
        out = np.zeros(s, np.int8)
        out[-1] = 1
        t0 = time.perf_counter()
        bb.decode(pe, np.arange(s, dtype=np.int32), np.zeros(s, np.int32), out, h, lg)
        prefill = time.perf_counter() - t0
        row = np.ascontiguousarray(pe[-1:])
        dt_dec, dt_heads = [], []
        for i in range(steps):
            t0 = time.perf_counter()
            bb.decode(row, np.array([s + i], np.int32), np.zeros(1, np.int32), np.ones(1, np.int8), h, lg)
            t1 = time.perf_counter()
            heads(h, audio)
            dt_dec.append(t1 - t0)
            dt_heads.append(time.perf_counter() - t1)
    codes = np.zeros((1, 1, ids.n_vq), np.int64)
    dec.decode(codes)
    t0 = time.perf_counter()
    for _ in range(5):
        dec.decode(codes)
    window = (time.perf_counter() - t0) / 5
    step = statistics.median(dt_dec)
    head = statistics.median(dt_heads)
    return {
        "prompt_rows": s,
        "prefill_ms": 1000 * prefill,
        "bare_step_ms": 1000 * step,
        "heads_ms": 1000 * head,
        "decode_1frame_ms": 1000 * window,
        "ttfa_limit_ms": 1000 * (prefill + 32 * (step + head) + window),
    }


async def engine_numbers(cfg_path: str, threads: int, frames: int) -> dict[str, float]:
    async with Engine.from_config(cfg_path, n_threads=threads, max_streams=1) as e:
        await e.generate(TEXT, options=StreamOptions(sampling=SamplingParams.greedy(), fixed_frames=5))
        e.reset_profile()  # steady state only
        syn = await e.generate(TEXT, options=StreamOptions(sampling=SamplingParams.greedy(), fixed_frames=frames))
        prof = e.step_profile()
        step_ms = sum(prof.values())  # embed + backbone + heads + sampling + other, per tick
        return {"ttfa_ms": 1000 * syn.stats.ttfa_s, "engine_step_ms": step_ms, **{f"step_{k}_ms": v for k, v in prof.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="default: the demo model")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--frames", type=int, default=60)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json")
    a = ap.parse_args()
    cfg_path = a.config or str(ensure_demo_model())
    cfg = load_config(cfg_path)
    threads = a.threads or physical_cores()
    rows: list[dict[str, float]] = []
    for _ in range(a.reps):  # interleave bare and engine runs so drift hits both
        lim = bare_limits(cfg, threads, a.frames + 31)
        eng = asyncio.run(engine_numbers(cfg_path, threads, a.frames))
        rows.append({**lim, **eng})
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    limit_step = med["bare_step_ms"] + med["heads_ms"]
    report = {
        "config": cfg_path,
        "threads": threads,
        "reps": a.reps,
        "median": {k: round(v, 3) for k, v in med.items()},
        "step_overhead_ratio": round(med["engine_step_ms"] / limit_step - 1, 4),
        "non_backbone_non_heads_ms": round(
            med["step_embed_ms"] + med["step_sampling_ms"] + med["step_other_ms"], 3
        ),
        "ttfa_vs_limit": round(med["ttfa_ms"] / med["ttfa_limit_ms"], 3),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
