"""The synthetic demo model: a small random MOSS-TTS-Delay in the official layout.

Why: real weights (16 GB backbone, 1.6B-parameter codec) cannot be downloaded
here and are too slow for a test-suite, yet every engine path (GGUF loading,
npy tables, tokenizer by id, codec ONNX, config YAML) must run on the exact
published formats. ``write_demo_model`` writes such a model in seconds::

    DIR/MOSS-TTS-GGUF/MOSS_TTS_Q4_K_M.gguf        (name as official; f16 inside)
    DIR/MOSS-TTS-GGUF/embeddings/embed_tokens.npy  (151936, H) f16; emb_ext_00..31.npy (1025, H)
    DIR/MOSS-TTS-GGUF/lm_heads/lm_head_text.npy    (151936, H) f16 (= GGUF output); lm_head_audio_00..31
    DIR/MOSS-TTS-GGUF/tokenizer/                   tokenizer.json, tokenizer_config.json
    DIR/MOSS-TTS-GGUF/config.json                  token ids (HF MossTTSDelayConfig keys)
    DIR/MOSS-Audio-Tokenizer-ONNX/{encoder,decoder}.onnx   (see demo/codec.py)
    DIR/config.yaml                                official YAML keys, relative paths
    DIR/streamtts-demo.json                        what was written (preset, seed, version)

How the random backbone is shaped to behave like TTS
----------------------------------------------------
With random weights the audio-mode choice between the gen slot (keep
speaking) and the delay slot (end speech) is arbitrary, so greedy decoding
would never stop, or stop at once. Three residual dimensions are reserved:

- dim 0, *constant*: every text embedding row holds ``const_value`` there and
  audio rows 0; no layer reads it (zero input columns) or writes it (zero
  output rows of ``attn_output``/``ffn_down``), so the final residual has
  exactly ``const_value`` in dim 0: a bias for the text head.
- dim 1, *counter input*: text tokens of the prompt hold a value that makes
  the layer-0 attention input (after RMSNorm) exactly 1 there; the gen/delay
  slot tokens hold 0; the reference-audio user slot holds about ``f*``
  (below), so a reference clip barely changes the utterance length.
- dim 2, *counter*: layer 0 has one KV head whose queries are zero, so its
  attention is uniform over all rows so far; its value reads dim 1 and its
  output is written (weight 1) into dim 2, which nothing else touches. The
  final residual's dim 2 is then ``f`` = the prompt's share of all rows so
  far: 1 during the prompt, falling as speech rows accumulate.

The text head's gen-slot row weighs dim 2 and its delay-slot row dim 0 so
that ``logit(gen) - logit(delay) = stop_slope * (f - f*)`` with
``f* = 1 / (1 + speech_ratio)``: greedy decoding ends speech after about
``speech_ratio`` x (prompt text rows) steps, and sampling (text temperature
1.5) within a few steps of that point (the gap moves by about
``stop_slope * f*^2 / P`` per step, P = prompt rows). The default ratio 0.5
gives ~30 frames (2.5 s) for a one-word text with the ~60-token prompt
template, ~40 frames for a sentence, growing with the text. The
``<|im_end|>`` row gives it the logit ``im_end_weight`` (24) while every
other row is random with logits of std ``text_logit_std`` (0.5) and no weight
on the reserved dims, so once ``<|audio_end|>`` is forced the next sampled
token is ``<|im_end|>`` (stop) by a wide margin.

The final RMSNorm divides the reserved dims by the residual's RMS, which
grows with depth; it is measured when the model is written (a NumPy forward
of the exact weights, ``numpy_forward``) and the head rows are scaled by
it, so the margins above hold for every preset.

Everything else is random (layers, other heads, audio embeddings and heads).
The audio heads ignore the reserved dims and are scaled so their logits have
a standard deviation of ``audio_logit_std`` (2): sampled codes vary from
frame to frame, and the demo codec turns them into soft tones.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from ..constants import N_VQ
from ..convert.qwen3_gguf import Qwen3Shape
from ..core.family import KIND_KEY, Member
from ..core.family import member as family_member
from ..core.tokens import TokenIds
from ..model.files import MARKER
from ..paths import cache_dir, quiet_gguf
from .codec import write_codec
from .numpy_forward import Qwen3NumpyForward
from .tokenizer import write_tokenizer

log = logging.getLogger(__name__)

#: Bumped whenever the files written change; part of the cache folder name.
DEMO_MODEL_VERSION = "2"

V_TEXT = 151936  # Qwen3's padded text vocabulary (embedding / text head rows)
GGUF_NAME = "MOSS_TTS_Q4_K_M.gguf"  # the official file name (contents are f16 here)

# Reserved residual dimensions (see the module docstring).
DIM_CONST, DIM_COUNT_IN, DIM_COUNTER = 0, 1, 2
RESERVED_DIMS = (DIM_CONST, DIM_COUNT_IN, DIM_COUNTER)


@dataclass(frozen=True, kw_only=True)
class DemoPreset(Qwen3Shape):
    """A preset's backbone: its Qwen3 shape (the text vocabulary Qwen3's), name and matrix type."""

    n_vocab: int = V_TEXT
    name: str
    #: GGUF matrix type. Published backbones are quantized (Q4_K_M ... Q8_0): the mid preset is
    #: q4_0 so CPU timings (and how they scale with batch size) resemble a real deployment.
    dtype: str = "f16"


PRESETS: dict[str, DemoPreset] = {
    # Whole model in ~1 s; the test-suite's model.
    "tiny": DemoPreset(name="tiny", n_embd=64, n_layer=2, n_head=4, n_head_kv=2, head_dim=16, n_ff=128),
    # A backbone step of tens of ms on 2 CPU threads (benchmarks, latency work).
    "mid": DemoPreset(
        name="mid", n_embd=1024, n_layer=24, n_head=16, n_head_kv=8, head_dim=64, n_ff=3072, dtype="q4_0"
    ),
    # Narrow and deep like the published backbone's 36 layers, Q8_0 (a published quant): many
    # small kernels per step, so per-operation costs (thread barriers, dispatch) show
    # (issue #16 measures the engine's overhead on it).
    "deep": DemoPreset(
        name="deep", n_embd=512, n_layer=36, n_head=8, n_head_kv=4, head_dim=64, n_ff=1536, dtype="q8_0"
    ),
}


@dataclass(frozen=True)
class DemoBehaviour:
    """Knobs of the backbone shaping (see the module docstring)."""

    #: Speech frames per prompt text row (greedy): f* = 1 / (1 + speech_ratio).
    speech_ratio: float = 0.5
    #: Logit gap gen - delay per unit of f - f*: larger = sampled lengths closer to greedy.
    stop_slope: float = 240.0
    #: Logit of <|im_end|> (its lead over every other token after <|audio_end|>).
    im_end_weight: float = 24.0
    #: Value of the constant dim.
    const_value: float = 1.0
    #: Standard deviation of the audio logits.
    audio_logit_std: float = 2.0
    #: Standard deviation of the logits of the random text-head rows.
    text_logit_std: float = 0.5
    #: Standard deviation of the random backbone weights (``random_qwen3_tensors``).
    init_scale: float = 0.02

    @property
    def f_star(self) -> float:
        return 1.0 / (1.0 + self.speech_ratio)


def _rng(seed: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, stream])


def _normal(rng: np.random.Generator, shape: tuple[int, ...], std: float) -> np.ndarray:
    x = rng.standard_normal(shape, dtype=np.float32)
    x *= np.float32(std)
    return x


@dataclass
class DemoWeights:
    """All tables of a demo model (float32 here; written as float16)."""

    preset: DemoPreset
    layers: dict[str, np.ndarray]  # GGUF tensor names (layers + output_norm)
    embed_tokens: np.ndarray  # (V_TEXT, H)
    emb_ext: list[np.ndarray]  # n_vq x (1025, H)
    lm_head_text: np.ndarray  # (V_TEXT, H)
    lm_head_audio: list[np.ndarray]  # n_vq x (1025, H)
    final_rms: float  # mean RMS of the final residual over speech rows (see measure_final_rms)


def build_embeddings(
    p: DemoPreset, ids: TokenIds, seed: int, b: DemoBehaviour
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Text and audio embedding tables with the reserved dims set."""
    h = p.n_embd
    # Random parts with per-dim variance 1 for a summed row (1 text + n_vq audio rows).
    std = float(1.0 / np.sqrt(1 + ids.n_vq))
    emb_ext = []
    for k in range(ids.n_vq):
        t = _normal(_rng(seed, 100 + k), (ids.audio_rows, h), std)
        t[:, RESERVED_DIMS] = 0.0
        emb_ext.append(t.astype(np.float16).astype(np.float32))
    embed = _normal(_rng(seed, 1), (V_TEXT, h), std)
    embed[:, DIM_CONST] = b.const_value
    embed[:, DIM_COUNT_IN] = 0.0
    embed[:, DIM_COUNTER] = 0.0
    embed = embed.astype(np.float16).astype(np.float32)
    # Counter input: x[1] / rms(x) == 1 for a prompt text row (pad audio), so with
    # A = |x|^2 without dim 1: c^2 = (A + c^2) / H  =>  c = sqrt(A / (H - 1)).
    pad_sum = np.sum([e[ids.audio_pad_code] for e in emb_ext], axis=0)
    rest = embed + pad_sum
    a = np.einsum("ij,ij->i", rest, rest, dtype=np.float64)
    embed[:, DIM_COUNT_IN] = np.sqrt(a / (h - 1)).astype(np.float32)
    for tid in (ids.gen_slot, ids.delay_slot):
        embed[tid, DIM_COUNT_IN] = 0.0
    # The user slot carries reference codes: aim at x[1] / rms(x) == f* for a typical row.
    rng = _rng(seed, 2)
    codes = rng.integers(0, ids.audio_vocab_size, size=(256, ids.n_vq))
    rows = embed[ids.user_slot] + np.sum([emb_ext[k][codes[:, k]] for k in range(ids.n_vq)], axis=0)
    rows[:, DIM_COUNT_IN] = 0.0
    a_slot = float(np.mean(np.einsum("ij,ij->i", rows, rows)))
    f = b.f_star
    embed[ids.user_slot, DIM_COUNT_IN] = float(np.sqrt(f * f * a_slot / (h - f * f)))
    return embed.astype(np.float16).astype(np.float32), emb_ext


def shape_backbone(tensors: dict[str, np.ndarray], p: DemoPreset) -> None:
    """Reserve dims 0..2 and build the layer-0 counter head (in place; see docstring)."""
    group = p.n_head // p.n_head_kv  # query heads per KV head (llama.cpp: contiguous groups)
    hd = p.head_dim
    for i in range(p.n_layer):
        for name in ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up"):
            tensors[f"blk.{i}.{name}.weight"][:, RESERVED_DIMS] = 0.0  # nobody reads them
        for name in ("attn_output", "ffn_down"):
            w = tensors[f"blk.{i}.{name}.weight"]
            w[DIM_CONST, :] = 0.0  # nobody writes the constant or the counter
            w[DIM_COUNTER, :] = 0.0
    # Layer 0, KV head 0: zero queries => uniform attention over all rows so far.
    tensors["blk.0.attn_q.weight"][: group * hd, :] = 0.0
    wv = tensors["blk.0.attn_v.weight"]
    wv[:hd, :] = 0.0
    wv[0, DIM_COUNT_IN] = 1.0  # value = normalised counter input
    tensors["blk.0.attn_norm.weight"][DIM_COUNT_IN] = 1.0
    wo = tensors["blk.0.attn_output.weight"]
    wo[:, : group * hd] = 0.0
    wo[DIM_COUNTER, 0] = 1.0  # head 0, value dim 0 -> residual dim 2
    tensors["output_norm.weight"][list(RESERVED_DIMS)] = 1.0


def measure_final_rms(
    layers: dict[str, np.ndarray],
    p: DemoPreset,
    embed: np.ndarray,
    emb_ext: list[np.ndarray],
    ids: TokenIds,
    seed: int,
    b: DemoBehaviour,
) -> float:
    """Mean RMS of the final residual over speech rows (NumPy reference forward).

    The final RMSNorm divides every dim, the reserved ones included, by this
    RMS, which grows with depth (about 1 for ``tiny``, 2.5 for ``mid``); the
    head weights are scaled by it so the logit margins do not depend on the preset.
    """
    fwd = Qwen3NumpyForward(layers, n_head=p.n_head, n_head_kv=p.n_head_kv, head_dim=p.head_dim)
    rng = _rng(seed, 4)
    pad_sum = np.sum([e[ids.audio_pad_code] for e in emb_ext], axis=0)
    text = [
        ids.im_start,
        *rng.integers(1000, 100000, size=40).tolist(),
        ids.im_end,
        ids.audio_start,
    ]
    fwd.forward(embed[text] + pad_sum)
    codes = rng.integers(0, ids.audio_vocab_size, size=(16, ids.n_vq))
    rows = embed[ids.gen_slot] + np.sum([emb_ext[k][codes[:, k]] for k in range(ids.n_vq)], axis=0)
    h = fwd.forward(rows)
    # h[:, 0] = const_value / rms (the output norm weight of dim 0 is 1)
    return float(np.mean(b.const_value / h[:, DIM_CONST]))


def build_heads(
    p: DemoPreset, ids: TokenIds, seed: int, b: DemoBehaviour, final_rms: float = 1.0
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Text head (= GGUF output layer) and audio heads; ``final_rms`` from measure_final_rms."""
    h = p.n_embd
    # The final hidden state has RMS ~1 over its H dims, so a row of std s gives
    # logits of std ~ s * sqrt(H).
    text = _normal(_rng(seed, 3), (V_TEXT, h), b.text_logit_std / float(np.sqrt(h)))
    text[:, RESERVED_DIMS] = 0.0
    for tid in (ids.gen_slot, ids.delay_slot, ids.im_end):
        text[tid, :] = 0.0
    # h[DIM_COUNTER] = f / final_rms and h[DIM_CONST] = const_value / final_rms, so:
    # logit(gen) - logit(delay) = stop_slope * (f - f*), logit(im_end) = im_end_weight.
    slope = b.stop_slope * final_rms
    text[ids.gen_slot, DIM_COUNTER] = slope
    text[ids.delay_slot, DIM_CONST] = slope * b.f_star / b.const_value
    text[ids.im_end, DIM_CONST] = b.im_end_weight * final_rms / b.const_value
    std = b.audio_logit_std / float(np.sqrt(h - len(RESERVED_DIMS)))
    audio = []
    for k in range(ids.n_vq):
        t = _normal(_rng(seed, 200 + k), (ids.audio_rows, h), std)
        t[:, RESERVED_DIMS] = 0.0
        audio.append(t)
    return text, audio


def build_weights(
    preset: str | DemoPreset = "tiny",
    seed: int = 0,
    behaviour: DemoBehaviour | None = None,
    n_vq: int = N_VQ,
) -> DemoWeights:
    """All weights of a demo model with ``n_vq`` codebooks, in memory."""
    from .gguf_writer import random_qwen3_tensors

    p = PRESETS[preset] if isinstance(preset, str) else preset
    b = behaviour or DemoBehaviour()
    ids = demo_ids(n_vq)
    layers = random_qwen3_tensors(p, seed=seed, init_scale=b.init_scale)
    layers = {k: np.array(v, dtype=np.float32) for k, v in layers.items()}
    shape_backbone(layers, p)
    # llama.cpp reads the layers as f16: calibrate on the rounded values
    layers = {
        k: (v.astype(np.float16).astype(np.float32) if v.ndim == 2 else v)
        for k, v in layers.items()
    }
    embed, emb_ext = build_embeddings(p, ids, seed, b)
    final_rms = measure_final_rms(layers, p, embed, emb_ext, ids, seed, b)
    text, audio = build_heads(p, ids, seed, b, final_rms)
    return DemoWeights(p, layers, embed, emb_ext, text, audio, final_rms)


def demo_ids(n_vq: int = N_VQ) -> TokenIds:
    """The demo model's ids: the published ones, with ``n_vq`` codebooks (32: MOSS-TTS;
    16: the TTSD, VoiceGenerator and SoundEffect members)."""
    if isinstance(n_vq, bool) or not isinstance(n_vq, int) or not 3 <= n_vq <= N_VQ:
        # the tone codec reads codebooks 0..2; the codec has 32 levels
        raise ValueError(f"demo n_vq must be an integer in 3..{N_VQ}, got {n_vq!r}")
    return TokenIds(n_vq=n_vq)


def _save_f16(path: Path, x: np.ndarray) -> None:
    np.save(path, x.astype(np.float16), allow_pickle=False)


def _model_config(p: DemoPreset, ids: TokenIds) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "architectures": ["MossTTSDelayModel"],
        "model_type": "moss_tts_delay",
        "streamtts_demo": True,
    }
    cfg.update(msgspec.to_builtins(ids))  # the config.json keys
    cfg["language_config"] = {
        "model_type": "qwen3",
        "hidden_size": p.n_embd,
        "num_hidden_layers": p.n_layer,
        "num_attention_heads": p.n_head,
        "num_key_value_heads": p.n_head_kv,
        "head_dim": p.head_dim,
        "intermediate_size": p.n_ff,
        "vocab_size": V_TEXT,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": p.n_ctx_train,  # the GGUF's training context
    }
    return cfg


_CONFIG_YAML = """\
# streamtts synthetic demo model ({preset}, seed {seed}): random weights in the official
# MOSS-TTS llama.cpp layout. It "speaks" in soft tones, not words.
# Official config keys; relative paths resolve against this file's folder.

backbone_gguf: MOSS-TTS-GGUF/{gguf}
embedding_dir: MOSS-TTS-GGUF/embeddings
lm_head_dir: MOSS-TTS-GGUF/lm_heads
tokenizer_dir: MOSS-TTS-GGUF/tokenizer

audio_backend: onnx
audio_encoder_onnx: MOSS-Audio-Tokenizer-ONNX/encoder.onnx
audio_decoder_onnx: MOSS-Audio-Tokenizer-ONNX/decoder.onnx
use_gpu_audio: false

n_ctx: 4096
n_batch: 512
n_threads: 0          # 0 = the physical cores other processes leave idle
n_gpu_layers: 0
max_new_tokens: {max_new_tokens}
"""
_SAMPLING_YAML = """
text_temperature: 1.5
text_top_p: 1.0
text_top_k: 50
audio_temperature: 1.7
audio_top_p: 0.8
audio_top_k: 25
audio_repetition_penalty: 1.0
"""


def _member(kind: str | None, n_vq: int | None) -> Member | None:
    """The member a demo stands in for (None: none); ``n_vq``, if given too, must be its."""
    if kind is None:
        return None
    m = family_member(kind)
    if n_vq is not None and n_vq != m.n_vq:
        raise ValueError(f"demo n_vq {n_vq}: {m.title} has {m.n_vq} codebooks")
    return m


def _config_yaml(preset: str, seed: int, m: Member | None) -> str:
    """The demo's config.yaml: a member's demo leaves sampling to its model_kind (config.json)."""
    head = _CONFIG_YAML.format(preset=preset, seed=seed, gguf=GGUF_NAME,
                               max_new_tokens=1024 if m is None else m.max_new_tokens)  # fmt: skip
    if m is not None:
        return head.replace("synthetic demo model", f"synthetic {m.title} demo model", 1)
    return head + _SAMPLING_YAML


CODECS = ("tones", "real")


def write_demo_model(
    dir: str | Path,
    preset: str = "tiny",
    seed: int = 0,
    *,
    behaviour: DemoBehaviour | None = None,
    codec: str = "tones",
    n_vq: int | None = None,
    member: str | None = None,
) -> Path:
    """Write a demo model into ``dir`` (created if needed); returns ``dir/config.yaml``.

    ``codec``: ``"tones"`` (default) maps codes to soft tones with a stateless toy decoder;
    ``"real"`` writes the real decoder architecture at a small width with random weights
    (``demo/real_codec.py``) and builds its offline and streaming graphs, so the engine
    decodes with the exact streaming decoder.
    ``n_vq``: codebooks per frame (tables, heads, config.json, the decoders; 16 as the TTSD,
    VoiceGenerator and SoundEffect members). The encoder keeps the codec's 32 levels, as the
    published one: the engine keeps the first n_vq.
    ``member``: the family member it stands in for (``core.family.MEMBERS``): its codebooks,
    its ``model_kind`` in config.json (so its template, presets and normaliser, as a converted
    bundle of that member gets them) and its ``max_new_tokens``; the config.yaml then sets no
    sampling keys of its own. None: the flagship's layout with the demo's own config.
    """
    from .gguf_writer import write_qwen3_gguf

    m = _member(member, n_vq)
    n_vq = m.n_vq if m is not None else (N_VQ if n_vq is None else n_vq)

    if preset not in PRESETS:
        raise ValueError(f"unknown demo preset {preset!r}; choose one of {', '.join(PRESETS)}")
    if codec not in CODECS:
        raise ValueError(f"unknown demo codec {codec!r}; choose one of {', '.join(CODECS)}")
    t0 = time.perf_counter()
    b = behaviour or DemoBehaviour()
    root = Path(dir)
    gg = root / "MOSS-TTS-GGUF"
    (gg / "embeddings").mkdir(parents=True, exist_ok=True)
    (gg / "lm_heads").mkdir(parents=True, exist_ok=True)
    ids = demo_ids(n_vq)
    w = build_weights(preset, seed, b, n_vq)
    p = w.preset

    write_tokenizer(gg / "tokenizer")
    _save_f16(gg / "embeddings" / "embed_tokens.npy", w.embed_tokens)
    for k, t in enumerate(w.emb_ext):
        _save_f16(gg / "embeddings" / f"emb_ext_{k:02d}.npy", t)
    _save_f16(gg / "lm_heads" / "lm_head_text.npy", w.lm_head_text)
    for k, t in enumerate(w.lm_head_audio):
        _save_f16(gg / "lm_heads" / f"lm_head_audio_{k:02d}.npy", t)
    # The GGUF's output layer is the text head: bit-identical to lm_head_text.npy in f16,
    # quantized like the published files otherwise.
    with quiet_gguf():
        write_qwen3_gguf(
            gg / GGUF_NAME,
            p,
            w.layers,
            output=w.lm_head_text.astype(np.float16),
            token_embd=None,
            # a member whose activations overflow float16 is refused in F16 (as its bundle would be)
            dtype="bf16" if m is not None and m.f16_overflows and p.dtype == "f16" else p.dtype,
        )
    model_cfg = _model_config(p, ids)
    if m is not None:
        model_cfg[KIND_KEY] = m.kind
    (gg / "config.json").write_text(json.dumps(model_cfg, indent=2) + "\n", encoding="utf-8")
    write_codec(root / "MOSS-Audio-Tokenizer-ONNX", n_vq=n_vq)
    if codec == "real":  # the real decoder architecture replaces the tone decoder
        from .real_codec import CHECKPOINT_DIR, write_real_codec

        write_real_codec(
            root / "MOSS-Audio-Tokenizer-ONNX", root / CHECKPOINT_DIR, seed=seed, n_vq=n_vq
        )
    cfg_path = root / "config.yaml"
    cfg_path.write_text(_config_yaml(p.name, seed, m), encoding="utf-8")
    marker = {
        "version": DEMO_MODEL_VERSION,
        "preset": asdict(p),
        "seed": seed,
        "behaviour": asdict(b),
        "codec": codec,
        "n_vq": n_vq,
        "member": m.kind if m is not None else None,
        "codec_builder": _codec_builder(),
        "f_star": b.f_star,
        "final_rms": w.final_rms,
    }
    (root / MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
    log.debug(
        "wrote demo model %s (seed %d) to %s in %.2f s",
        p.name,
        seed,
        root,
        time.perf_counter() - t0,
    )
    return cfg_path


default_cache_dir = (
    cache_dir  # ``$STREAMTTS_CACHE`` / ``$XDG_CACHE_HOME/streamtts`` / ``~/.cache/streamtts``
)


def _complete(d: Path) -> bool:
    try:
        marker = json.loads((d / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if marker.get("codec") == "real" and marker.get("codec_builder") != _codec_builder():
        return False  # its codec graphs were built by another builder version
    return marker.get("version") == DEMO_MODEL_VERSION and (d / "config.yaml").is_file()


def _codec_builder() -> int:
    from ..codec.stamp import BUILDER_VERSION

    return BUILDER_VERSION


def ensure_demo_model(cache_dir: str | Path | None = None) -> Path:
    """The cached tiny demo model's ``config.yaml``, written on first use.

    Written into a private temporary folder and renamed into place, so a
    reader never sees a half-written model and two processes racing to create
    it both end up using one complete copy (the loser discards its own).
    """
    base = (
        Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    ) / "demo-model"
    target = base / f"{DEMO_MODEL_VERSION}-tiny"
    if not _complete(target):
        base.mkdir(parents=True, exist_ok=True)
        tmp = base / f".tmp-{DEMO_MODEL_VERSION}-tiny-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            log.info("writing the synthetic demo model to %s (first use)", target)
            write_demo_model(tmp, "tiny", seed=0)
            if target.exists() and not _complete(target):
                # A broken leftover (e.g. from an interrupted older version): move it aside.
                stale = base / f".stale-{uuid.uuid4().hex[:8]}"
                with contextlib.suppress(OSError):
                    target.rename(stale)
                    shutil.rmtree(stale, ignore_errors=True)
            try:
                tmp.rename(target)
            except OSError:
                if not _complete(target):  # not a lost race: a real failure
                    raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    log.debug(
        "using the synthetic demo model at %s (random weights: it speaks in soft tones, not words)",
        target,
    )
    return target / "config.yaml"


def demo_model_main(
    dir: str | Path, preset: str = "tiny", seed: int = 0, codec: str = "tones", n_vq: int | None = None,
    member: str | None = None,
) -> Path:
    """``streamtts demo-model DIR [--preset tiny|mid|deep] [--seed N] [--codec tones|real]
    [--n-vq N] [--member KIND]``."""
    t0 = time.perf_counter()
    cfg = write_demo_model(dir, preset, seed, codec=codec, n_vq=n_vq, member=member)
    size = sum(f.stat().st_size for f in Path(dir).rglob("*") if f.is_file())
    log.info(
        "wrote the %s demo model (seed %d, %.0f MB) in %.1f s; use it with: streamtts synth --config %s",
        preset,
        seed,
        size / 1e6,
        time.perf_counter() - t0,
        cfg,
    )
    return cfg
