"""A MOSS-TTS-Delay Hugging Face checkpoint: its config, its tensors, and where each one goes.

Tensor names of ``MossTTSDelayModel`` and what the official chain (``extract_weights.py``,
then llama.cpp's ``convert_hf_to_gguf.py``) makes of them::

    language_model.embed_tokens.weight  embeddings/embed_tokens.npy, GGUF token_embd.weight
    language_model.layers.N.*           GGUF blk.N.* (names below)
    language_model.norm.weight          GGUF output_norm.weight
    emb_ext.K.weight                    embeddings/emb_ext_KK.npy       (audio codebook K)
    lm_heads.0.weight                   lm_heads/lm_head_text.npy, GGUF output.weight
    lm_heads.K.weight (K >= 1)          lm_heads/lm_head_audio_{K-1:02d}.npy

Everything is checked from the safetensors headers before a byte is written: every
expected tensor present, of the shape the config implies, in a float dtype; no backbone
tensor this converter would have to drop; as many audio tables as ``n_vq`` says.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.tokens import KEYS, TokenIds
from ..errors import ModelFileError
from .checkpoint import INDEX_FILE, SINGLE_FILE, Checkpoint
from .qwen3_gguf import Qwen3Shape

log = logging.getLogger(__name__)

__all__ = [
    "MossConfig",
    "check_tensors",
    "expected_shapes",
    "gguf_name",
    "npy_outputs",
    "official_order",
    "read_config",
]

CONFIG_NAME = "config.json"
_EXPECTED_CONFIG = "a MOSS-TTS-Delay config.json (MossTTSDelayConfig: language_config, n_vq, ...)"
_FLOAT_DTYPES = ("F32", "F16", "BF16")

# language_model.layers.N.<hf>  ->  blk.N.<gguf>  (llama.cpp's tensor map for Qwen3)
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_GLOBAL_NAMES = {
    "language_model.embed_tokens.weight": "token_embd.weight",
    "language_model.norm.weight": "output_norm.weight",
    "lm_heads.0.weight": "output.weight",
}
_LAYER_PREFIX = "language_model.layers."


@dataclass(frozen=True)
class MossConfig:
    path: Path  # the config.json
    data: dict[str, Any]  # all of it
    lang: dict[str, Any]  # its language_config (the Qwen3 backbone)
    shape: Qwen3Shape  # n_vocab = vocab_size, n_ctx_train = max_position_embeddings
    ids: TokenIds  # token ids, n_vq, audio_vocab_size (defaults for absent keys)
    has_head_dim: bool = True  # language_config names head_dim (llama.cpp then writes key_length)

    @property
    def n_vq(self) -> int:
        return self.ids.n_vq


def _int(path: Path, where: dict[str, Any], key: str, label: str) -> int:
    v = where.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ModelFileError(
            path, _EXPECTED_CONFIG, f"{label}{key} must be a positive integer, got {v!r}"
        )
    return v


def _rope_theta(path: Path, lang: dict[str, Any]) -> float:
    """transformers 4.x writes ``rope_theta`` (and ``rope_scaling``); 5.x nests both in
    ``rope_parameters``. Only plain RoPE is supported: MOSS-TTS-Delay uses no scaling."""
    params = lang.get("rope_parameters") or lang.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise ModelFileError(
            path, _EXPECTED_CONFIG, "language_config.rope_parameters is not an object"
        )
    kind = params.get("rope_type", params.get("type"))
    if kind not in (None, "default"):
        raise ModelFileError(
            path, "plain RoPE (rope_type default)", f"language_config asks for {kind!r} scaling"
        )
    theta = lang.get("rope_theta", params.get("rope_theta"))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 0:
        raise ModelFileError(
            path, _EXPECTED_CONFIG,
            "no positive language_config.rope_theta (transformers 4) or "
            "language_config.rope_parameters.rope_theta (transformers 5)",
        )  # fmt: skip
    return float(theta)


def read_config(folder: str | Path) -> MossConfig:
    """``folder/config.json`` read and checked as a MOSS-TTS-Delay config."""
    path = Path(folder) / CONFIG_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ModelFileError(path, _EXPECTED_CONFIG, "file not found") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFileError(path, _EXPECTED_CONFIG, f"not readable JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelFileError(path, _EXPECTED_CONFIG, f"got a JSON {type(data).__name__}")
    model_type = data.get("model_type")
    if model_type not in (None, "moss_tts_delay"):
        raise ModelFileError(
            path, _EXPECTED_CONFIG, f"model_type is {model_type!r}, not 'moss_tts_delay'"
        )
    lang = data.get("language_config")
    if not isinstance(lang, dict):
        raise ModelFileError(
            path, _EXPECTED_CONFIG, "no language_config object (the Qwen3 backbone's sizes)"
        )
    if lang.get("model_type", "qwen3") != "qwen3":
        raise ModelFileError(
            path, "a Qwen3 backbone (language_config.model_type qwen3)",
            f"it is {lang.get('model_type')!r}",
        )  # fmt: skip
    ids = _token_ids(path, data)
    n_embd = _int(path, lang, "hidden_size", "language_config.")
    n_head = _int(path, lang, "num_attention_heads", "language_config.")
    head_dim = lang.get("head_dim") or n_embd // n_head
    shape = Qwen3Shape(
        n_embd=n_embd,
        n_layer=_int(path, lang, "num_hidden_layers", "language_config."),
        n_head=n_head,
        n_head_kv=_int(path, lang, "num_key_value_heads", "language_config."),
        head_dim=int(head_dim),
        n_ff=_int(path, lang, "intermediate_size", "language_config."),
        n_vocab=_int(path, lang, "vocab_size", "language_config."),
        n_ctx_train=_int(path, lang, "max_position_embeddings", "language_config."),
        rope_theta=_rope_theta(path, lang),
        rms_eps=_positive_float(path, lang, "rms_norm_eps"),
    )
    try:
        shape.validate()
    except ValueError as exc:
        raise ModelFileError(path, _EXPECTED_CONFIG, f"language_config: {exc}") from exc
    return MossConfig(
        path=path, data=data, lang=lang, shape=shape, ids=ids, has_head_dim="head_dim" in lang
    )


def _positive_float(path: Path, lang: dict[str, Any], key: str) -> float:
    v = lang.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        raise ModelFileError(
            path, _EXPECTED_CONFIG, f"language_config.{key} must be a positive number, got {v!r}"
        )
    return float(v)


def _token_ids(path: Path, data: dict[str, Any]) -> TokenIds:
    import msgspec

    known = {k: v for k, v in data.items() if k in KEYS}
    for key in ("n_vq", "audio_vocab_size"):
        if key in known:
            _int(path, known, key, "")
    try:
        return msgspec.convert(known, TokenIds)
    except msgspec.ValidationError as exc:
        raise ModelFileError(path, "integer token ids", str(exc)) from exc


# -- tensors ------------------------------------------------------------------------------------


def gguf_name(hf_name: str) -> str | None:
    """The GGUF name of a backbone tensor (None: not part of the GGUF)."""
    if hf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[hf_name]
    if hf_name.startswith(_LAYER_PREFIX):
        bid, _, rest = hf_name[len(_LAYER_PREFIX) :].partition(".")
        if bid.isdecimal() and rest in _LAYER_NAMES:
            return f"blk.{int(bid)}.{_LAYER_NAMES[rest]}"
    return None


def hf_layer_name(gguf: str) -> str:
    """Inverse of :func:`gguf_name` (the demo checkpoint writer names its tensors with it)."""
    for hf, gg in _GLOBAL_NAMES.items():
        if gg == gguf:
            return hf
    blk, bid, rest = gguf.split(".", 2)
    for hf, gg in _LAYER_NAMES.items():
        if blk == "blk" and gg == rest:
            return f"{_LAYER_PREFIX}{bid}.{hf}"
    raise KeyError(gguf)


def npy_outputs(n_vq: int) -> list[tuple[str, str]]:
    """(bundle-relative .npy path, checkpoint tensor) of every table, in the bundle's order."""
    out = [("embeddings/embed_tokens.npy", "language_model.embed_tokens.weight")]
    out += [(f"embeddings/emb_ext_{k:02d}.npy", f"emb_ext.{k}.weight") for k in range(n_vq)]
    out.append(("lm_heads/lm_head_text.npy", "lm_heads.0.weight"))
    out += [
        (f"lm_heads/lm_head_audio_{k:02d}.npy", f"lm_heads.{k + 1}.weight") for k in range(n_vq)
    ]
    return out


def expected_shapes(cfg: MossConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the conversion reads, with the shape the config implies."""
    s = cfg.shape
    rows = cfg.ids.audio_rows
    out: dict[str, tuple[int, ...]] = {
        "language_model.embed_tokens.weight": (s.n_vocab, s.n_embd),
        "language_model.norm.weight": (s.n_embd,),
        "lm_heads.0.weight": (s.n_vocab, s.n_embd),
    }
    for k in range(cfg.n_vq):
        out[f"emb_ext.{k}.weight"] = (rows, s.n_embd)
        out[f"lm_heads.{k + 1}.weight"] = (rows, s.n_embd)
    for gg, shp in s.tensor_shapes().items():
        if gg != "output_norm.weight":
            out[hf_layer_name(gg)] = shp
    return out


def _table_indices(names: list[str], prefix: str) -> list[int]:
    out = []
    for n in names:
        if n.startswith(prefix) and n.endswith(".weight"):
            idx = n[len(prefix) : -len(".weight")]
            if idx.isdecimal():
                out.append(int(idx))
    return sorted(out)


def _listing(ck: Checkpoint) -> Path:
    """The file that lists the checkpoint's tensors: the shard index, else the one file."""
    index = ck.folder / INDEX_FILE
    return index if index.is_file() else ck.folder / SINGLE_FILE


def check_tensors(ck: Checkpoint, cfg: MossConfig) -> None:
    """Raise ModelFileError naming the file for the first tensor that is missing, of the
    wrong shape or dtype, or that the conversion would have to drop."""
    want = expected_shapes(cfg)
    for name, shape in want.items():
        if name not in ck:
            hint = (
                f"; {cfg.path.name} says n_vq = {cfg.n_vq}"
                if name.startswith(("emb_ext.", "lm_heads."))
                else ""
            )
            raise ModelFileError(_listing(ck), f"tensor {name!r} of shape {shape}", f"absent{hint}")
        if ck.shape(name) != shape:
            raise ModelFileError(
                ck.file_of(name),
                f"tensor {name!r} of shape {shape} (from {cfg.path.name})",
                f"it is {ck.shape(name)}",
            )
        if ck.dtype(name) not in _FLOAT_DTYPES:
            raise ModelFileError(
                ck.file_of(name), f"tensor {name!r} as F32, F16 or BF16", f"it is {ck.dtype(name)}"
            )
    names = ck.names()
    extra = [n for n in names if n.startswith(("emb_ext.", "lm_heads.")) and n not in want]
    if extra:
        n_emb = len(_table_indices(names, "emb_ext."))
        raise ModelFileError(
            cfg.path,
            f"n_vq matching the checkpoint, which has {n_emb} audio embedding tables "
            f"(emb_ext.*) and {len(_table_indices(names, 'lm_heads.'))} heads (lm_heads.*: "
            "1 text + n_vq audio)",
            f"n_vq is {cfg.n_vq}, leaving {extra[0]!r} and {len(extra) - 1} more unused",
        )
    ignored = []
    for name in names:
        if name in want:
            continue
        if name.startswith("language_model."):
            raise ModelFileError(
                ck.file_of(name),
                "only the tensors of a Qwen3 backbone under language_model.*",
                f"{name!r} has no place in the GGUF (a different architecture?)",
            )
        ignored.append(name)
    if ignored:  # extract_weights.py ignores them too
        log.warning(
            "%s: %d tensor(s) outside the backbone, tables and heads are not converted: %s",
            _listing(ck), len(ignored), ", ".join(ignored[:5]) + (" ..." if len(ignored) > 5 else ""),
        )  # fmt: skip


# extract_weights.py cuts the backbone into safetensors shards of at most this many bytes
_EXTRACT_SHARD_BYTES = 5 * 1024**3
_EXTRACT_NAMES = {"lm_heads.0.weight": "lm_head.weight"}


def _extract_name(hf_name: str) -> str:
    """The name extract_weights.py gives a backbone tensor (``language_model.`` -> ``model.``)."""
    if hf_name in _EXTRACT_NAMES:
        return _EXTRACT_NAMES[hf_name]
    return "model." + hf_name[len("language_model.") :]


def official_order(ck: Checkpoint, cfg: MossConfig) -> list[str]:
    """The checkpoint names of the GGUF's tensors in the order the official chain writes them.

    extract_weights.py walks the source shards in file-name order, each one's tensors in
    name order, and cuts the backbone into shards of at most 5 GiB; convert_hf_to_gguf.py
    reads those shards in order and each one's tensors sorted by (extracted) name. For a
    one-shard backbone that is plain name order, so ``lm_head.weight`` (output) comes first
    and ``model.layers.10`` before ``model.layers.2``. llama.cpp's quantizer sorts by layer
    itself, so only the F16 file's layout depends on this.
    """
    wanted = {n for n in expected_shapes(cfg) if gguf_name(n) is not None}
    by_file: dict[Path, list[str]] = {}
    for name in wanted:
        by_file.setdefault(ck.file_of(name), []).append(name)
    groups: list[list[str]] = [[]]
    size = 0
    for f in sorted(by_file, key=lambda p: p.name):
        for name in sorted(by_file[f]):
            nbytes = ck.nbytes(name)
            if size + nbytes > _EXTRACT_SHARD_BYTES and groups[-1]:
                groups.append([])
                size = 0
            groups[-1].append(name)
            size += nbytes
    return [n for g in groups for n in sorted(g, key=_extract_name)]
