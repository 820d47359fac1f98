"""Does llama.cpp's arithmetic for one row depend on the batch around it?

    python benchmarks/batch_numerics.py [--config CFG] [--steps 40]

Decodes a probe sequence step by step alone (1 row per call) and inside batches of
B sequences, and reports, per batch size, the largest difference of the probe's hidden
state and of its audio logits over all steps, against the 1-row run and against B=2.
Run it once with the default build and once with ``STREAMTTS_BATCH_INVARIANT=1
native/build.sh`` (point STREAMTTS_BRIDGE_LIB at that build) to compare.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from streamtts.config import find_model_config, load_config
from streamtts.core.tokens import load_token_ids
from streamtts.demo.model import ensure_demo_model
from streamtts.model.backbone import Backbone, BackboneParams
from streamtts.model.tables import AudioHeads


def probe(cfg_path: str, batch: int, steps: int, prompt: int, threads: int, flash_attn: str = "auto") -> tuple[np.ndarray, np.ndarray]:
    cfg = load_config(cfg_path)
    ids = load_token_ids(find_model_config(cfg))
    params = BackboneParams(
        model_path=cfg.backbone_gguf, n_ctx=1024 * batch, n_batch=512, n_seq_max=batch, n_threads=threads,
        flash_attn=flash_attn,
    )
    with Backbone(params) as bb:
        h_dim = bb.n_embd
        heads = AudioHeads(cfg.lm_head_dir, ids, h_dim)
        bb.set_logit_columns(np.array([ids.gen_slot, ids.delay_slot], np.int32))
        seqs = [np.random.default_rng(s).standard_normal((prompt + steps, h_dim)).astype(np.float32) * 0.5 for s in range(batch)]
        for s, x in enumerate(seqs):
            bb.decode(x[:prompt], np.arange(prompt, dtype=np.int32), np.full(prompt, s, np.int32), np.zeros(prompt, np.int8))
        h = np.zeros((batch, h_dim), np.float32)
        lg = np.zeros((batch, 2), np.float32)
        audio = np.zeros((batch, ids.n_vq * ids.audio_rows), np.float32)
        hs, als = [], []
        for t in range(steps):
            rows = np.stack([x[prompt + t] for x in seqs])
            bb.decode(rows, np.full(batch, prompt + t, np.int32), np.arange(batch, dtype=np.int32), np.ones(batch, np.int8), h, lg)
            hs.append(h[0].copy())
            als.append(heads(h[:1], audio)[0].copy())
    return np.stack(hs), np.stack(als)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--prompt", type=int, default=60)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--flash-attn", default="auto", help="auto | enabled | disabled")
    ap.add_argument("--batches", type=int, nargs="+", default=[2, 4, 8])
    a = ap.parse_args()
    cfg = a.config or str(ensure_demo_model())
    runs = {b: probe(cfg, b, a.steps, a.prompt, a.threads, a.flash_attn) for b in [1, *a.batches]}
    h1, l1 = runs[1]
    h2, l2 = runs[a.batches[0]]
    out = {
        "config": cfg,
        "vs_alone": {b: {"hidden": float(np.abs(runs[b][0] - h1).max()), "audio_logits": float(np.abs(runs[b][1] - l1).max())} for b in a.batches},
        "vs_batch2": {b: {"hidden": float(np.abs(runs[b][0] - h2).max()), "audio_logits": float(np.abs(runs[b][1] - l2).max())} for b in a.batches},
        "hidden_scale": float(np.abs(h1).max()),
        "audio_logit_scale": float(np.abs(l1).max()),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
