"""The GGUF's tokenizer metadata, as llama.cpp's ``convert_hf_to_gguf.py`` writes it for Qwen3.

The official chain converts ``qwen3_backbone/``, a folder holding the backbone's
``config.json`` (the MOSS ``language_config``) and the tokenizer files
``extract_weights.py`` copies (``TOKENIZER_FILES``). For a Qwen3 model the converter
(``TextModel._set_vocab_gpt2`` and gguf-py's ``SpecialVocab``) writes:

- ``tokenizer.ggml.model`` ``gpt2`` and ``tokenizer.ggml.pre`` ``qwen2``: the pre-tokenizer
  is recognised by hashing how the tokenizer splits a test string; Qwen3's tokenizer hashes
  to ``qwen2``, and the official chain wrote ``qwen2`` for the fixture's tokenizer too.
- ``tokens``: one per id up to ``vocab_size`` (the model's padded vocabulary): the
  tokenizer's own spelling, ``[PAD<id>]`` for ids it lacks; ``token_type``: NORMAL,
  CONTROL for added tokens that are special or look special (``<|...|>``), USER_DEFINED
  for other added tokens, UNUSED for the padding.
- ``merges`` from ``tokenizer.json`` (``merges.txt`` when it has none).
- special token ids named in ``tokenizer_config.json`` (resolved through
  ``tokenizer.json``'s added tokens), then ``*_token_id`` keys of the backbone config;
  ``add_bos``/``add_eos`` from the post-processor (ByteLevel: false) and
  ``tokenizer_config.json``; its ``chat_template``; lower-case / strip-accents flags of the
  normalizer.

``tokenizers`` stands in for ``transformers.AutoTokenizer`` (same ``tokenizer.json``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ModelFileError

log = logging.getLogger(__name__)

# What extract_weights.py copies next to the backbone: all the official converter sees.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "merges.txt",
    "vocab.json",
)
PRE_TOKENIZER = "qwen2"

# gguf.TokenType values
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5

# The special-token kinds SpecialVocab looks for, in its order, and which of them the
# GGUF writer has keys for (ids; add_<kind>_token flags).
_KINDS = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
_ID_KEYS = {"bos", "eos", "unk", "sep", "pad", "mask", "eot", "eom"}
_ADD_KEYS = {"bos", "eos", "sep"}


@dataclass
class GGUFVocab:
    tokens: list[str]
    toktypes: list[int]
    merges: list[str]
    special_ids: dict[str, int] = field(default_factory=dict)  # insertion order = key order
    add_special: dict[str, bool] = field(default_factory=dict)
    chat_template: str | list[dict[str, str]] | None = None
    normalizer_lowercase: bool | None = None
    normalizer_strip_accents: bool | None = None
    pre: str = PRE_TOKENIZER


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFileError(path, "a readable JSON file", str(exc)) from exc


def _looks_special(token: str) -> bool:
    """Added tokens some models forget to mark special (the converter's heuristic)."""
    return (
        token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
        or (token.startswith("<|") and token.endswith("|>"))
        or (token.startswith("<｜") and token.endswith("｜>"))
        or (token.startswith("<unused") and token.endswith(">"))
    )


def _load_tokenizer(path: Path) -> Any:
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:  # pragma: no cover - a core dependency
        raise ModelFileError(path, "the tokenizers package", "pip install tokenizers") from exc
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust side raises its own exception type
        raise ModelFileError(path, "a Hugging Face tokenizer.json", str(exc)) from exc


def _tokens(
    folder: Path, tok_cfg: dict[str, Any] | None, n_vocab: int
) -> tuple[list[str], list[int]]:
    """Token strings and types for ids 0..n_vocab-1 (``get_vocab_base``)."""
    path = folder / "tokenizer.json"
    tk = _load_tokenizer(path)
    vocab: dict[str, int] = tk.get_vocab(with_added_tokens=True)
    if vocab and max(vocab.values()) >= n_vocab:
        raise ModelFileError(
            path, f"token ids below the model's vocab_size ({n_vocab})",
            f"it has id {max(vocab.values())}",
        )  # fmt: skip
    decoder = tk.get_added_tokens_decoder()
    # transformers lets tokenizer_config.json's added_tokens_decoder override the flags
    overrides = (tok_cfg or {}).get("added_tokens_decoder") or {}
    added: dict[int, tuple[str, bool, bool]] = {}  # id -> (content, special, normalized)
    for tid, at in decoder.items():
        o = overrides.get(str(tid), {}) if isinstance(overrides, dict) else {}
        added[int(tid)] = (
            str(o.get("content", at.content)),
            bool(o.get("special", at.special)),
            bool(o.get("normalized", at.normalized)),
        )
    added_contents = {c for c, _, _ in added.values()}
    reverse = {i: t for t, i in vocab.items()}
    tokens: list[str] = []
    types: list[int] = []
    for i in range(n_vocab):
        token = reverse.get(i)
        if token is None:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
            continue
        if token in added_contents and i in added:
            _, special, normalized = added[i]
            if not normalized:  # llama.cpp wants added tokens pre-normalised
                token = tk.decode(
                    tk.encode(token, add_special_tokens=False).ids, skip_special_tokens=False
                )
            if special or _looks_special(token):
                types.append(CONTROL)
            else:
                token = token.replace("\u2581", " ")
                types.append(USER_DEFINED)
        else:
            types.append(NORMAL)
        tokens.append(token)
    return tokens, types


def _merges(folder: Path, tok_json: dict[str, Any]) -> list[str]:
    merges = (tok_json.get("model") or {}).get("merges")
    if isinstance(merges, list) and merges:
        if isinstance(merges[0], str):
            return [str(m) for m in merges]
        if isinstance(merges[0], list) and len(merges[0]) == 2:
            # transformers >= 4.45 stores pairs; a space inside a part is written as U+0120
            return [
                " ".join(
                    "".join(chr(ord(c) + 256) if c == " " else c for c in part) for part in pair
                )
                for pair in merges
            ]
        raise ModelFileError(
            folder / "tokenizer.json", "BPE merges as strings or pairs", "unknown format"
        )
    path = folder / "merges.txt"
    if not path.is_file():
        return []
    out = []
    lines = path.read_text(encoding="utf-8").splitlines()
    if lines and lines[0].strip().startswith("#"):
        lines = lines[1:]
    for line in lines:
        parts = line.strip().split(None, 3)
        if len(parts) == 2:
            out.append(f"{parts[0]} {parts[1]}")
    return out


def _normalizer_flags(v: GGUFVocab, norm: Any) -> None:
    if not isinstance(norm, dict):
        return
    kind = norm.get("type")
    if kind == "Lowercase":
        v.normalizer_lowercase = True
    elif kind == "StripAccents":
        v.normalizer_strip_accents = True
    elif kind == "BertNormalizer":
        if "lowercase" in norm:
            v.normalizer_lowercase = bool(norm["lowercase"])
        if "strip_accents" in norm:
            v.normalizer_strip_accents = bool(norm["strip_accents"])
    elif kind == "Sequence":
        for n in norm.get("normalizers", []):
            _normalizer_flags(v, n)


def _set_id(v: GGUFVocab, kind: str, tid: Any, where: Path) -> None:
    if not isinstance(tid, int):
        return
    if tid < 0:
        raise ModelFileError(where, f"a non-negative {kind} token id", f"got {tid}")
    v.special_ids.setdefault(kind, tid)


def _post_processor(v: GGUFVocab, tok_json: dict[str, Any], path: Path) -> None:
    post = tok_json.get("post_processor")
    if not post:
        return
    for proc in post.get("processors", [post]):
        kind = proc.get("type")
        if kind == "ByteLevel":
            v.add_special.setdefault("bos", False)
            v.add_special.setdefault("eos", False)
        elif kind in ("RobertaProcessing", "TemplateProcessing", "BertProcessing"):
            # These add BOS/EOS/SEP tokens; MOSS-TTS-Delay's Qwen tokenizer has none.
            raise ModelFileError(
                path, "a Qwen byte-level BPE tokenizer (post-processor ByteLevel or none)",
                f"post-processor {kind} is not supported by convert-hf",
            )  # fmt: skip


def _special_tokens(
    v: GGUFVocab, folder: Path, tok_json: dict[str, Any], tok_cfg: dict[str, Any] | None,
    backbone_cfg: dict[str, Any], config_path: Path,
) -> None:  # fmt: skip
    """SpecialVocab: tokenizer_config.json first, then the backbone config's *_token_id."""
    _post_processor(v, tok_json, folder / "tokenizer.json")
    added = tok_json.get("added_tokens") or []
    if tok_cfg:
        cfg = dict(tok_cfg)
        if not cfg.get("bos_token") and cfg.get("cls_token"):
            cfg["bos_token"] = cfg["cls_token"]
        if not cfg.get("eos_token") and cfg.get("sep_token"):
            cfg["eos_token"] = cfg["sep_token"]
        tmpl = cfg.get("chat_template")
        if isinstance(tmpl, (str, list)):
            v.chat_template = tmpl
        elif tmpl is not None:
            log.warning(
                "%s: chat_template is neither text nor a list; ignored",
                folder / "tokenizer_config.json",
            )
        for kind in _KINDS:
            flag = cfg.get(f"add_{kind}_token")
            if isinstance(flag, bool):
                v.add_special.setdefault(kind, flag)
            entry = cfg.get(f"{kind}_token")
            content = entry.get("content") if isinstance(entry, dict) else entry
            if not isinstance(content, str):
                continue
            tid = next((a.get("id") for a in added if a.get("content") == content), None)
            _set_id(v, kind, tid, folder / "tokenizer_config.json")
    for kind in _KINDS:
        _set_id(v, kind, backbone_cfg.get(f"{kind}_token_id"), config_path)


def read_vocab(
    folder: str | Path, backbone_cfg: dict[str, Any], n_vocab: int, config_path: Path
) -> GGUFVocab:
    """The tokenizer metadata for a model of ``n_vocab`` rows from the tokenizer files in
    ``folder``; ``backbone_cfg`` is the MOSS ``language_config`` (the official chain's
    backbone config.json), ``config_path`` the file it came from (for messages)."""
    folder = Path(folder)
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise ModelFileError(
            path, "the model's tokenizer (a Hugging Face tokenizer.json)", "file not found"
        )
    tok_json = _read_json(path)
    if not isinstance(tok_json, dict) or (tok_json.get("model") or {}).get("type") != "BPE":
        raise ModelFileError(
            path, "a byte-level BPE tokenizer.json (Qwen3)", "its model is not BPE"
        )
    cfg_path = folder / "tokenizer_config.json"
    tok_cfg = _read_json(cfg_path) if cfg_path.is_file() else None
    if tok_cfg is not None and not isinstance(tok_cfg, dict):
        raise ModelFileError(cfg_path, "a JSON object", f"got {type(tok_cfg).__name__}")
    tokens, types = _tokens(folder, tok_cfg, n_vocab)
    v = GGUFVocab(tokens=tokens, toktypes=types, merges=_merges(folder, tok_json))
    if not v.merges:
        log.warning("%s: no BPE merges; llama.cpp's tokenizer will not work", path)
    _normalizer_flags(v, tok_json.get("normalizer"))
    _special_tokens(v, folder, tok_json, tok_cfg, backbone_cfg, config_path)
    return v


def add_vocab(w: Any, v: GGUFVocab) -> None:
    """Write the tokenizer keys in the converter's order."""
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(v.pre)
    w.add_token_list(v.tokens)
    w.add_token_types(v.toktypes)
    if v.merges:
        w.add_token_merges(v.merges)
    for kind, tid in v.special_ids.items():
        if kind in _ID_KEYS:  # the writer has no key for cls: the converter skips it too
            getattr(w, f"add_{kind}_token_id")(tid)
    for kind, flag in v.add_special.items():
        if kind in _ADD_KEYS:
            getattr(w, f"add_add_{kind}_token")(flag)
    if v.chat_template is not None:
        w.add_chat_template(v.chat_template)
    if v.normalizer_lowercase is not None:
        w.add_bool("tokenizer.ggml.normalizer.lowercase", v.normalizer_lowercase)
    if v.normalizer_strip_accents is not None:
        w.add_bool("tokenizer.ggml.normalizer.strip_accents", v.normalizer_strip_accents)
