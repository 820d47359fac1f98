"""Write small random **qwen3** GGUF files that the vendored llama.cpp loads.

Used for the synthetic demo model and the tests. The file has no tokenizer
(``tokenizer.ggml.model = "none"``) and ``qwen3.vocab_size = n_vocab``: llama.cpp
then creates ``n_vocab`` dummy tokens, and ``token_embd`` / ``output`` have
``n_vocab`` rows. streamtts feeds embeddings, so ``token_embd`` is never read;
``output`` is the head whose logits llama.cpp computes (any rows we like).

Tensor shapes, written NumPy-style (rows, cols) = GGUF (ne1, ne0), as llama.cpp's
``llama_model_qwen3::load_arch_tensors`` expects them::

    token_embd.weight, output.weight   (n_vocab, n_embd)
    output_norm.weight                 (n_embd,)
    blk.{i}.attn_norm.weight           (n_embd,)
    blk.{i}.attn_q.weight              (n_head * head_dim, n_embd)
    blk.{i}.attn_k.weight              (n_head_kv * head_dim, n_embd)   (attn_v alike)
    blk.{i}.attn_output.weight         (n_embd, n_head * head_dim)
    blk.{i}.attn_q_norm.weight         (head_dim,)                      (attn_k_norm alike)
    blk.{i}.ffn_norm.weight            (n_embd,)
    blk.{i}.ffn_gate.weight            (n_ff, n_embd)                   (ffn_up alike)
    blk.{i}.ffn_down.weight            (n_embd, n_ff)
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import numpy.typing as npt

from ..convert.qwen3_gguf import ARCH, Qwen3Shape, add_qwen3_header
from ..paths import gguf_writer_at

# GGUF tensor type, general.file_type (llama_ftype) for each supported matrix dtype
_DTYPES: dict[str, tuple[str, int]] = {
    "f32": ("F32", 0),
    "f16": ("F16", 1),
    "bf16": ("BF16", 32),
    "q8_0": ("Q8_0", 7),
    "q4_0": ("Q4_0", 2),
}


def random_qwen3_tensors(
    shape: Qwen3Shape, seed: int = 0, *, init_scale: float = 0.02
) -> dict[str, np.ndarray]:
    """Random float32 weights for every layer tensor plus output_norm (not token_embd/output).

    Matrices are N(0, init_scale^2); norm weights are 1 + N(0, 0.1^2), so the model is
    a well-conditioned random transformer (hidden states stay O(1)).
    """
    shape.validate()
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shp in shape.tensor_shapes().items():
        if len(shp) == 1:
            out[name] = (1.0 + 0.1 * rng.standard_normal(shp, dtype=np.float32)).astype(np.float32)
        else:
            w = rng.standard_normal(shp, dtype=np.float32)
            w *= np.float32(init_scale)
            out[name] = w
    return out


def _encode(a: npt.NDArray[Any], dtype: str) -> tuple[npt.NDArray[Any], Any]:
    """Array in the file's representation and its GGUF raw type (None = infer from dtype)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    if a.ndim == 1 or dtype == "f32":  # 1-D tensors (norms) stay f32, as llama.cpp expects
        return np.ascontiguousarray(a, dtype=np.float32), None
    if dtype == "f16":
        return np.ascontiguousarray(a, dtype=np.float16), None
    qtype = GGMLQuantizationType[_DTYPES[dtype][0]]
    return quantize(np.ascontiguousarray(a, dtype=np.float32), qtype), qtype


def write_qwen3_gguf(
    path: str | os.PathLike[str],
    shape: Qwen3Shape,
    tensors: dict[str, np.ndarray],
    *,
    output: np.ndarray,
    token_embd: np.ndarray | None = None,
    dtype: str = "f16",
) -> None:
    """Write a qwen3 GGUF llama.cpp (llama-cpp-python 0.3.36's copy) loads.

    tensors: every name of ``shape.tensor_shapes()`` (e.g. from random_qwen3_tensors).
    output: (n_vocab, n_embd), the output layer (the head llama.cpp computes logits with).
    token_embd: (n_vocab, n_embd) or None; streamtts never reads it, so None writes zeros
    (Q8_0, the cheapest type llama.cpp reads for it).
    dtype: matrices as f16 (default), f32, bf16, q8_0 or q4_0 (quantized types need n_embd and n_ff to be
    multiples of 32); 1-D norm weights are always f32.
    The file is written next to ``path`` and renamed into place.
    """
    import gguf

    shape.validate()
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    expected = shape.tensor_shapes()
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise ValueError(
            f"missing tensors: {', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}"
        )
    extra = sorted(set(tensors) - set(expected))
    if extra:
        raise ValueError(f"unexpected tensors: {', '.join(extra[:6])}")
    for name, shp in expected.items():
        if tuple(tensors[name].shape) != shp:
            raise ValueError(f"{name}: shape {tuple(tensors[name].shape)}, expected {shp}")
    head = (shape.n_vocab, shape.n_embd)
    if tuple(output.shape) != head:
        raise ValueError(
            f"output: shape {tuple(output.shape)}, expected (n_vocab, n_embd) = {head}"
        )
    if token_embd is not None and tuple(token_embd.shape) != head:
        raise ValueError(f"token_embd: shape {tuple(token_embd.shape)}, expected {head}")

    with gguf_writer_at(path, ARCH) as w:
        add_qwen3_header(w, shape, "streamtts random qwen3", _DTYPES[dtype][1])

        # token_embd: zeros need no quantizing: an all-zero Q8_0 block is 34 zero bytes
        if token_embd is None:
            q8 = gguf.GGMLQuantizationType.Q8_0
            block, type_size = gguf.GGML_QUANT_SIZES[q8]
            if shape.n_embd % block == 0:
                zeros = np.zeros((shape.n_vocab, shape.n_embd // block * type_size), dtype=np.uint8)
                w.add_tensor("token_embd.weight", zeros, raw_dtype=q8)
            else:
                w.add_tensor("token_embd.weight", np.zeros(head, dtype=np.float16))
        else:
            data, raw = _encode(token_embd, dtype)
            w.add_tensor("token_embd.weight", data, raw_dtype=raw)

        data, raw = _encode(tensors["output_norm.weight"], dtype)
        w.add_tensor("output_norm.weight", data, raw_dtype=raw)
        data, raw = _encode(output, dtype)
        w.add_tensor("output.weight", data, raw_dtype=raw)
        for name in expected:
            if name == "output_norm.weight":
                continue
            data, raw = _encode(tensors[name], dtype)
            w.add_tensor(name, data, raw_dtype=raw)

        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
