"""The official llama.cpp pipeline's generation algorithm, step by step, on our bridge.

The oracle that greedy conformance is checked against (``tests/engine/test_engine.py``,
``tests/model/test_fused.py``, ``benchmarks/greedy_check.py``): the prompt prefilled in one
decode (hidden state of its last row), then one row per step; text logits from the plain
backbone GGUF's output layer, audio logits from the stacked NumPy heads (float32), the
contract's scalar state machine (the official step transcribed,
:func:`~streamtts.core.delay_state.official_step`). Nothing here is batched or cached: it is slow
on purpose, and exactly what the official pipeline computes.
"""

from __future__ import annotations

import numpy as np

from ..config import EngineConfig, SamplingParams, find_model_config
from ..core.delay import de_delay, drop_pad_frames
from ..core.delay_state import official_init, official_step
from ..core.prompt import HFTokenizer, PromptSpec, build_prompt
from ..core.tokens import load_token_ids
from ..text.normalize import normalize_text
from .backbone import Backbone, BackboneParams
from .tables import AudioHeads, Embedder


def official_greedy_frames(cfg: EngineConfig, text: str, max_new: int, threads: int = 1) -> np.ndarray:
    """Greedy (T, n_vq) audio codes of ``text`` (no voice), de-delayed, pad frames dropped."""
    ids = load_token_ids(find_model_config(cfg))
    prompt = build_prompt(HFTokenizer(cfg.tokenizer_dir), ids, PromptSpec(text=normalize_text(text)))
    emb = Embedder(cfg.embedding_dir, ids)
    heads = AudioHeads(cfg.lm_head_dir, ids, emb.n_embd)
    params = BackboneParams(
        model_path=cfg.backbone_gguf, n_ctx=cfg.n_ctx, n_batch=cfg.n_batch, n_threads=threads
    )
    rows: list[np.ndarray] = []
    with Backbone(params) as bb:
        h = np.zeros((1, emb.n_embd), np.float32)
        logits = np.zeros((1, bb.n_vocab), np.float32)
        s = prompt.shape[0]
        out = np.zeros(s, np.int8)
        out[-1] = 1
        bb.decode(emb.embed_rows(prompt), np.arange(s, dtype=np.int32), np.zeros(s, np.int32), out, h, logits)
        state = official_init(prompt, ids)
        audio = np.zeros((1, ids.n_vq * ids.audio_rows), np.float32)
        one = np.ones(1, np.int8)
        for t in range(max_new):
            row = official_step(state, logits[0], heads(h, audio)[0], SamplingParams.greedy(), 1, ids)
            rows.append(row)
            if state.is_stopping:
                break
            bb.decode(emb.embed_rows(row[None]), np.array([s + t], np.int32), np.zeros(1, np.int32), one, h, logits)
    return drop_pad_frames(de_delay(np.stack(rows)[:, 1:]), ids.audio_pad_code)
