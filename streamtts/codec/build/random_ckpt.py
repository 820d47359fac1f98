"""Random MOSS-Audio-Tokenizer decoder checkpoints in the official layout (benchmarks, tests).

``write_random_checkpoint(folder, config)`` writes ``config.json`` and a
``model.safetensors`` holding every tensor the decoder reads, by its official name and
shape (no encoder tensors), with random values of a sane scale. The file is written one
tensor at a time (the safetensors header is computed first), so a published-size
checkpoint (~0.9 B parameters) never sits in memory.

``scale_config(config, scale)`` shrinks each decoder stage's width (d_model, feed-forward,
heads at a fixed head width) and keeps everything else, so a benchmark can run a smaller
model with the real depth, contexts and I/O.
"""

from __future__ import annotations

import copy
import json
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

from .arch import parse_arch
from .tensors import expected_tensors

__all__ = ["scale_config", "write_random_checkpoint"]

_ST_DTYPES = {"float32": ("F32", np.float32), "float16": ("F16", np.float16)}


def scale_config(config: dict[str, Any], scale: float, head_dim: int = 64) -> dict[str, Any]:
    """A copy of ``config`` with every decoder stage ``scale`` times as wide."""
    cfg = copy.deepcopy(config)
    if scale == 1.0:
        return cfg
    for kw in cfg["decoder_kwargs"]:
        if kw.get("module_type") != "Transformer":
            continue
        hd = min(head_dim, kw["d_model"] // kw["num_heads"])
        heads = max(1, round(kw["d_model"] * scale / hd))
        kw["num_heads"] = heads
        kw["d_model"] = heads * hd
        kw["dim_feedforward"] = max(hd, round(kw["dim_feedforward"] * scale))
    return cfg


def _value(
    name: str, shape: tuple[int, ...], rng: np.random.Generator, layer_scale: float
) -> np.ndarray:
    if name.endswith("layer_scale_1.scale") or name.endswith("layer_scale_2.scale"):
        return np.full(shape, layer_scale, dtype=np.float32)
    if name.endswith((".norm1.weight", ".norm2.weight")):
        return (1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    if name.endswith((".original0", ".weight_g")):
        return (1.0 + 0.1 * rng.random(shape, dtype=np.float32)).astype(np.float32)
    if name.endswith(".bias"):
        return 0.02 * rng.standard_normal(shape, dtype=np.float32)
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    std = np.float32(1.0 if name.endswith("codebook.weight") else 1.0 / np.sqrt(fan_in))
    return std * rng.standard_normal(shape, dtype=np.float32)


def write_random_checkpoint(
    folder: str | Path,
    config: dict[str, Any],
    *,
    dtype: str = "float32",
    seed: int = 0,
    layer_scale: float | None = None,
) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (decoder tensors only) into ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    arch = parse_arch(config, str(folder / "config.json"))
    st_dtype, np_dtype = _ST_DTYPES[dtype]
    item = np.dtype(np_dtype).itemsize
    specs = [(names[0], shape) for names, shape in expected_tensors(arch)]
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in specs:
        n = int(np.prod(shape)) * item
        header[name] = {
            "dtype": st_dtype,
            "shape": list(shape),
            "data_offsets": [offset, offset + n],
        }
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    if layer_scale is None:
        stage = next(
            kw for kw in config["decoder_kwargs"] if kw.get("module_type") == "Transformer"
        )
        layer_scale = float(stage.get("layer_scale") or 1.0)
    rng = np.random.default_rng(seed)
    path = folder / "model.safetensors"
    tmp = folder / f".model.safetensors.{os.getpid()}.tmp"
    try:
        with tmp.open("wb") as f:
            f.write(struct.pack("<Q", len(raw)))
            f.write(raw)
            for name, shape in specs:
                f.write(_value(name, shape, rng, layer_scale).astype(np_dtype).tobytes())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return path
