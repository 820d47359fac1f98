"""A random MOSS-TTS-shaped model in the official layout, fast, at any size up to the real 8B
(``benchmarks/gpu_check.py``'s model, and the quantized model of ``tests/model/test_fused.py``).

Why random quant blocks instead of f16 + quantize: the GPU check needs a file
with exactly the real model's bytes per weight and tensor types (so llama.cpp
runs the same kernels at the same memory traffic), and needs it in seconds.
Quantizing 8B f16 weights in Python takes far longer than the whole check may.
So the blocks are written directly: random bytes for the quants and sub-block
scales, and fixed, sane f16 super-block scales (``d``, ``dmin``) so that weights
have a std of about 0.02 and activations stay finite through 36 layers. The
tensor types follow llama.cpp's Q4_K_M recipe (``llama_tensor_get_type``):
Q4_K everywhere, Q6_K for ``output`` and for ``attn_v`` / ``ffn_down`` in the
layers ``use_more_bits`` picks. ``--quant Q4_0`` writes Q4_0 blocks instead.

Values are meaningless; speed is what is measured. The npy tables are random
float16 of the real shapes, the tokenizer and codec are the demo ones.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ..convert.config_file import gguf_file_name
from ..convert.qwen3_gguf import ARCH, Qwen3Shape, add_qwen3_header
from .model import V_TEXT

Shape = Qwen3Shape

SHAPES = {
    # Qwen3-8B (config.json: hidden 4096, 36 layers, 32 heads, 8 KV heads, head_dim 128,
    # intermediate 12288, vocab 151936): MOSS-TTS-Delay's backbone.
    "8b": Shape(4096, 36, 32, 8, 128, 12288, V_TEXT, n_ctx_train=40960),
    # Qwen3-1.7B (hidden 2048, 28 layers, 16 heads, 8 KV heads, head_dim 128, intermediate
    # 6144, vocab 151936): MOSS-VoiceGenerator's backbone (benchmarks/family_voicegen.py).
    "1.7b": Shape(2048, 28, 16, 8, 128, 6144, V_TEXT, n_ctx_train=40960),
    # Same structure, CPU-sized: every K dimension a multiple of 256 (K-quant blocks).
    "tiny": Shape(256, 2, 4, 2, 64, 512, V_TEXT, n_ctx_train=40960),
}

# block size, bytes per block, (offset of d, offset of dmin or -1)
_BLOCKS = {
    "Q4_0": (32, 18, (0, -1)),
    "Q4_K": (256, 144, (0, 2)),
    "Q6_K": (256, 210, (208, -1)),
}
# f16 super-block scales giving weights of std ~0.02 with random quants / sub-scales
_SCALES = {"Q4_0": (0.0045, 0.0), "Q4_K": (1.0e-4, 4.0e-5), "Q6_K": (2.0e-5, 0.0)}


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's choice of the layers that get Q6_K in Q4_K_M (llama-quant.cpp)."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_types(shape: Shape, quant: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (NumPy shape, type) for every tensor, in the order llama.cpp's converter writes."""
    e, q, kv = shape.n_embd, shape.n_head * shape.head_dim, shape.n_head_kv * shape.head_dim
    base = "Q4_0" if quant == "Q4_0" else "Q4_K"
    big = "Q4_0" if quant == "Q4_0" else "Q6_K"
    out: dict[str, tuple[tuple[int, ...], str]] = {
        "token_embd.weight": ((shape.n_vocab, e), base),
        "output_norm.weight": ((e,), "F32"),
        "output.weight": ((shape.n_vocab, e), big),
    }
    for i in range(shape.n_layer):
        more = quant != "Q4_0" and use_more_bits(i, shape.n_layer)
        b = f"blk.{i}."
        out[b + "attn_norm.weight"] = ((e,), "F32")
        out[b + "attn_q.weight"] = ((q, e), base)
        out[b + "attn_k.weight"] = ((kv, e), base)
        out[b + "attn_v.weight"] = ((kv, e), "Q6_K" if more else base)
        out[b + "attn_output.weight"] = ((e, q), base)
        out[b + "attn_q_norm.weight"] = ((shape.head_dim,), "F32")
        out[b + "attn_k_norm.weight"] = ((shape.head_dim,), "F32")
        out[b + "ffn_norm.weight"] = ((e,), "F32")
        out[b + "ffn_gate.weight"] = ((shape.n_ff, e), base)
        out[b + "ffn_up.weight"] = ((shape.n_ff, e), base)
        out[b + "ffn_down.weight"] = ((e, shape.n_ff), "Q6_K" if more else base)
    return out


def _quant_chunks(
    rng: np.random.Generator, shape: tuple[int, ...], qtype: str
) -> Iterator[np.ndarray]:
    """Random blocks of one quantized tensor, ~64 MB at a time."""
    block, size, (d_off, m_off) = _BLOCKS[qtype]
    rows, cols = shape
    if cols % block:
        raise ValueError(f"{qtype} needs rows of a multiple of {block} values, got {cols}")
    per_row = cols // block
    d, dmin = (np.float16(x).tobytes() for x in _SCALES[qtype])
    step = max(1, (64 << 20) // (per_row * size))
    for r in range(0, rows, step):
        n = min(step, rows - r) * per_row
        blk = np.frombuffer(rng.bytes(n * size), dtype=np.uint8).reshape(n, size).copy()
        blk[:, d_off : d_off + 2] = np.frombuffer(d, dtype=np.uint8)
        if m_off >= 0:
            blk[:, m_off : m_off + 2] = np.frombuffer(dmin, dtype=np.uint8)
        yield blk


def _nbytes(shape: tuple[int, ...], qtype: str) -> int:
    if qtype == "F32":
        return int(np.prod(shape)) * 4
    block, size, _ = _BLOCKS[qtype]
    return int(np.prod(shape)) // block * size


def write_gguf(path: Path, shape: Shape, quant: str = "Q4_K_M", seed: int = 0) -> Path:
    """Stream a random qwen3 GGUF of ``shape`` to ``path`` (memory stays ~100 MB)."""
    import gguf

    rng = np.random.default_rng(seed)
    plan = tensor_types(shape, quant)
    ftype = 2 if quant == "Q4_0" else 15  # llama_ftype MOSTLY_Q4_0 / MOSTLY_Q4_K_M
    tmp = path.with_name(f".{path.name}.tmp")
    w = gguf.GGUFWriter(tmp, ARCH)
    add_qwen3_header(w, shape, f"streamtts random qwen3 {quant}", ftype)
    w.add_quantization_version(2)
    for name, (shp, qt) in plan.items():
        raw = gguf.GGMLQuantizationType[qt]
        w.add_tensor_info(name, shp, np.dtype(np.float32), _nbytes(shp, qt), raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    assert w.fout is not None
    fout = w.fout[0]
    for name, (shp, qt) in plan.items():
        w.write_padding(fout, fout.tell())
        if qt == "F32":
            chunks: Iterator[np.ndarray] = iter(
                [(1.0 + 0.1 * rng.standard_normal(shp)).astype(np.float32)]
            )
        else:
            chunks = _quant_chunks(rng, shp, qt)
        n = 0
        for c in chunks:
            fout.write(c.data)
            n += c.nbytes
        assert n == _nbytes(shp, qt), name
        w.write_padding(fout, n)
    w.close()
    os.replace(tmp, path)
    return path


def _save_random(path: Path, shape: tuple[int, int], rng: np.random.Generator, std: float) -> None:
    """Random float16 .npy written in row chunks (the 1.2 GB table never sits in memory twice)."""
    arr = np.lib.format.open_memmap(path, mode="w+", dtype=np.float16, shape=shape)
    step = max(1, (32 << 20) // (shape[1] * 4))
    for r in range(0, shape[0], step):
        n = min(step, shape[0] - r)
        arr[r : r + n] = (rng.standard_normal((n, shape[1]), dtype=np.float32) * std).astype(
            np.float16
        )
    arr.flush()
    del arr


def write_model(
    root: Path,
    shape: Shape,
    quant: str = "Q4_K_M",
    seed: int = 0,
    *,
    text_head: bool = False,
    n_vq: int = 32,
) -> Path:
    """The official layout (contract section 1) with random weights; returns DIR/config.yaml.
    ``n_vq``: codebooks (16: a VoiceGenerator-shaped model; its config.json says so)."""
    import msgspec

    from .codec import write_codec
    from .model import demo_ids
    from .tokenizer import write_tokenizer

    ids = demo_ids(n_vq)
    gg = root / "MOSS-TTS-GGUF"
    for d in (gg / "embeddings", gg / "lm_heads"):
        d.mkdir(parents=True, exist_ok=True)
    if n_vq != 32:  # the token ids and n_vq the engine reads (32 is the default without one)
        (gg / "config.json").write_text(json.dumps(msgspec.to_builtins(ids)) + "\n", encoding="utf-8")
    rng = np.random.default_rng(seed + 1)
    h = shape.n_embd
    # embeddings: a summed row of 33 tables should have O(1) values
    std = float(1.0 / np.sqrt(1 + ids.n_vq))
    _save_random(gg / "embeddings" / "embed_tokens.npy", (shape.n_vocab, h), rng, std)
    for k in range(ids.n_vq):
        _save_random(gg / "embeddings" / f"emb_ext_{k:02d}.npy", (ids.audio_rows, h), rng, std)
        _save_random(
            gg / "lm_heads" / f"lm_head_audio_{k:02d}.npy",
            (ids.audio_rows, h),
            rng,
            2.0 / np.sqrt(h),
        )
    if text_head:
        _save_random(
            gg / "lm_heads" / "lm_head_text.npy", (shape.n_vocab, h), rng, 0.5 / np.sqrt(h)
        )
    write_tokenizer(gg / "tokenizer")
    gguf_path = write_gguf(gg / gguf_file_name(quant), shape, quant, seed)
    write_codec(root / "MOSS-Audio-Tokenizer-ONNX", n_vq=n_vq)
    cfg = root / "config.yaml"
    cfg.write_text(
        "\n".join(
            [
                f"backbone_gguf: {gguf_path.relative_to(root)}",
                "embedding_dir: MOSS-TTS-GGUF/embeddings",
                "lm_head_dir: MOSS-TTS-GGUF/lm_heads",
                "tokenizer_dir: MOSS-TTS-GGUF/tokenizer",
                "audio_backend: onnx",
                "audio_encoder_onnx: MOSS-Audio-Tokenizer-ONNX/encoder.onnx",
                "audio_decoder_onnx: MOSS-Audio-Tokenizer-ONNX/decoder.onnx",
                "use_gpu_audio: false",
                "",
            ]
        ),
        encoding="utf-8",
    )
    (root / "random-model.json").write_text(
        json.dumps({"shape": shape.__dict__, "quant": quant, "seed": seed, "n_vq": n_vq}) + "\n",
        encoding="utf-8",
    )
    return cfg
