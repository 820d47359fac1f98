"""The demo model as an original MOSS-TTS-Delay checkpoint (what ``streamtts convert-hf`` reads).

Same weights as :func:`streamtts.demo.model.write_demo_model` (same preset and seed), in the
Hugging Face layout of ``MossTTSDelayModel``::

    DIR/config.json                     MossTTSDelayConfig keys (token ids, n_vq, language_config)
    DIR/model.safetensors               or model-0000i-of-0000N.safetensors + index (max_shard_bytes)
    DIR/tokenizer.json, tokenizer_config.json

Tensor names are the real ones (``language_model.*``, ``emb_ext.K``, ``lm_heads.K``; see
``streamtts.convert.hf_source``). ``dtype="exact"`` stores matrices as float16 and norms as float32,
the values the demo bundle holds, so converting to F16 gives a bundle that computes exactly
what the demo bundle computes; ``dtype="bf16"`` stores everything as bfloat16, as the published
checkpoint does (the values are then rounded).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..core.tokens import TokenIds
from .model import (
    PRESETS,
    DemoBehaviour,
    DemoPreset,
    DemoWeights,
    _model_config,
    build_weights,
    demo_ids,
)
from .tokenizer import write_tokenizer

log = logging.getLogger(__name__)

CheckpointDtype = Literal["exact", "bf16", "f32"]


def hf_tensors(w: DemoWeights, ids: TokenIds) -> dict[str, np.ndarray]:
    """The demo weights under their MossTTSDelayModel names (float32)."""
    from ..convert.hf_source import hf_layer_name

    out: dict[str, np.ndarray] = {"language_model.embed_tokens.weight": w.embed_tokens}
    for gg, t in w.layers.items():
        out[hf_layer_name(gg)] = t
    for k in range(ids.n_vq):
        out[f"emb_ext.{k}.weight"] = w.emb_ext[k]
        out[f"lm_heads.{k + 1}.weight"] = w.lm_head_audio[k]
    out["lm_heads.0.weight"] = w.lm_head_text
    return out


def _cast(a: np.ndarray, dtype: CheckpointDtype) -> np.ndarray:
    if dtype == "f32":
        return np.ascontiguousarray(a, dtype=np.float32)
    if dtype == "bf16":
        import ml_dtypes

        return np.ascontiguousarray(a.astype(np.float32).astype(ml_dtypes.bfloat16))
    # exact: what the demo bundle stores (its GGUF keeps 1-D norms in F32)
    return np.ascontiguousarray(a, dtype=np.float32 if a.ndim == 1 else np.float16)


def _shards(names: list[str], sizes: dict[str, int], max_bytes: int) -> list[list[str]]:
    groups: list[list[str]] = [[]]
    used = 0
    for n in names:
        if groups[-1] and max_bytes and used + sizes[n] > max_bytes:
            groups.append([])
            used = 0
        groups[-1].append(n)
        used += sizes[n]
    return groups


def write_demo_hf_checkpoint(
    dir: str | Path,
    preset: str | DemoPreset = "tiny",
    seed: int = 0,
    *,
    dtype: CheckpointDtype = "exact",
    max_shard_bytes: int = 0,
    rope_style: Literal["transformers4", "transformers5"] = "transformers4",
    behaviour: DemoBehaviour | None = None,
    n_vq: int = 32,
) -> Path:
    """Write the demo checkpoint into ``dir``; returns ``dir``.

    max_shard_bytes: > 0 splits the tensors (in name order) into shards of at most that many
    bytes with a ``model.safetensors.index.json``, as large checkpoints are published.
    rope_style: where ``rope_theta`` goes in ``language_config`` (transformers 4.x: top level;
    5.x: ``rope_parameters``). n_vq: codebooks (16: a TTSD / VoiceGenerator / SoundEffect-shaped
    checkpoint).
    """
    from safetensors.numpy import save_file

    p = PRESETS[preset] if isinstance(preset, str) else preset
    root = Path(dir)
    root.mkdir(parents=True, exist_ok=True)
    ids = demo_ids(n_vq)
    w = build_weights(p, seed, behaviour, n_vq)
    tensors = {k: _cast(v, dtype) for k, v in hf_tensors(w, ids).items()}
    del w
    names = sorted(tensors)
    groups = _shards(names, {n: tensors[n].nbytes for n in names}, max_shard_bytes)
    if len(groups) == 1:
        save_file({n: tensors[n] for n in groups[0]}, str(root / "model.safetensors"))
    else:
        weight_map: dict[str, str] = {}
        for i, g in enumerate(groups, 1):
            fname = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
            save_file({n: tensors[n] for n in g}, str(root / fname))
            weight_map.update(dict.fromkeys(g, fname))
        index = {
            "metadata": {"total_size": sum(t.nbytes for t in tensors.values())},
            "weight_map": weight_map,
        }
        (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    cfg: dict[str, Any] = _model_config(p, ids)
    if rope_style == "transformers5":
        lang = cfg["language_config"]
        lang["rope_parameters"] = {"rope_theta": lang.pop("rope_theta"), "rope_type": "default"}
    (root / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    write_tokenizer(root)
    log.debug("wrote demo HF checkpoint %s (seed %d, %s) to %s", p.name, seed, dtype, root)
    return root
