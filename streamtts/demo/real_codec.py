"""A demo codec with the real MOSS-Audio-Tokenizer decoder architecture (small, random weights).

Why: the tone codec of the default demo costs nothing and has a 4-frame reach, so it cannot
show what the real decoder does to streaming. This one is the published architecture (RLFQ
de-quantiser, four causal transformer stages at 12.5/25/50/100 tokens per second with
10 s attention windows: 125/250/500/1000 tokens, patch reshapes 2/2/2/240, RoPE,
LayerNorm, layer scale) at a small width, written as a checkpoint in the official layout
and turned into ONNX by the same builder users run on the real weights
(``streamtts codec build``): ``decoder.onnx`` (the official stateless I/O contract) and
``decoder_streaming.onnx`` (the exact stateful decoder). Its audio is noise-like: random
weights, not speech. The encoder stays the tone codec's (a reference voice only needs codes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..codec.build.decoders import build_decoders
from ..codec.build.random_ckpt import write_random_checkpoint
from ..constants import AUDIO_VOCAB, FRAME_SAMPLES, N_VQ, SAMPLE_RATE

__all__ = ["CHECKPOINT_DIR", "demo_codec_config", "write_real_codec"]

CHECKPOINT_DIR = "MOSS-Audio-Tokenizer"  # the checkpoint, as `streamtts download` lays it out


def _stage(d_model: int, heads: int, layers: int, d_in: int, d_out: int) -> dict[str, Any]:
    return {
        "module_type": "Transformer", "causal": True, "conv_layout": True,
        "d_model": d_model, "dim_feedforward": 2 * d_model, "gating": "none",
        "input_dimension": d_in, "output_dimension": d_out, "layer_scale": 0.5,
        "max_period": 10000, "norm": "layer_norm", "num_heads": heads,
        "num_layers": layers, "positional_embedding": "rope",
    }  # fmt: skip


def _patch(size: int) -> dict[str, Any]:
    return {"module_type": "PatchedPretransform", "patch_size": size}


def demo_codec_config(width: int = 64, layers: tuple[int, int, int, int] = (2, 1, 1, 1)) -> dict[str, Any]:
    """A MOSS-Audio-Tokenizer ``config.json``: the published decoder's structure and contexts,
    ``width`` wide (stage 1; the later stages half as wide), with ``layers`` per stage."""
    w2 = max(16, width // 2)
    heads1, heads2 = max(1, width // 16), max(1, w2 // 16)
    decoder = [
        _stage(width, heads1, layers[0], width, width), _patch(2),
        _stage(w2, heads2, layers[1], width // 2, w2), _patch(2),
        _stage(w2, heads2, layers[2], w2 // 2, w2), _patch(2),
        _stage(w2, heads2, layers[3], w2 // 2, FRAME_SAMPLES // 8), _patch(FRAME_SAMPLES // 8),
    ]  # fmt: skip
    return {
        "architectures": ["MossAudioTokenizerModel"],
        "model_type": "moss-audio-tokenizer",
        "causal_transformer_context_duration": 10,
        "code_dim": width,
        "decoder_kwargs": decoder,
        "downsample_rate": FRAME_SAMPLES,
        "quantizer_type": "rlfq",
        "quantizer_kwargs": {
            "codebook_dim": 8, "codebook_size": AUDIO_VOCAB, "input_dim": width,
            "num_quantizers": N_VQ, "output_dim": width, "quantizer_type": "rlfq", "rvq_dim": w2,
        },  # fmt: skip
        "sampling_rate": SAMPLE_RATE,
    }


def write_real_codec(
    onnx_dir: str | Path,
    checkpoint_dir: str | Path,
    seed: int = 0,
    config: dict[str, Any] | None = None,
    n_vq: int = N_VQ,
) -> tuple[Path, Path]:
    """Write the checkpoint into ``checkpoint_dir`` and build ``onnx_dir/decoder.onnx``
    (offline, official I/O) and ``onnx_dir/decoder_streaming.onnx`` from it.
    ``config``: another codec config.json (default: :func:`demo_codec_config`). The
    checkpoint has the codec's 32 levels; the decoders take the first ``n_vq``
    (``streamtts codec build --n-vq``), as a 16-codebook model's do."""
    ckpt = Path(checkpoint_dir)
    out = Path(onnx_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_random_checkpoint(ckpt, config or demo_codec_config(), seed=seed)
    res = build_decoders(
        ckpt, out=out / "decoder_streaming.onnx", offline_out=out / "decoder.onnx", external=False,
        n_vq=n_vq,
    )  # fmt: skip
    assert res.streaming is not None and res.offline is not None
    return res.offline, res.streaming
