"""Which family member a checkpoint is, and the sampling defaults its bundle carries.

The bundle's config.json gets two keys besides the checkpoint's own (read back by
``core.family.bundle_member``)::

    "model_kind": "moss-ttsd"
    "sampling": {"text_temperature": 1.5, ..., "audio_repetition_penalty": 1.1}

The kind: ``--model-kind``, else the source's name (the hub id or folder name given, then the
config's ``_name_or_path``) through ``kind_from_name``, else ``moss-tts`` with a warning. The
sampling object: the member's preset (``Member.sampling_defaults``), each key that a
``generation_config.json`` in the checkpoint sets taking its place (:func:`generation_config`).
The bundle's config.yaml gets the member's ``max_new_tokens`` (generation_config.json's, for a
member whose ``generate()`` reads it) and an ``n_ctx`` that holds it after a long prompt.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from ..config import SamplingParams
from ..core.family import (
    DEFAULT_KIND,
    KIND_KEY,
    MEMBERS,
    SAMPLING_KEY,
    Member,
    ModelKind,
    kind_from_name,
    member,
    sampling_value,
)
from ..errors import ConfigError, InputError, ModelFileError

log = logging.getLogger(__name__)

__all__ = ["GENERATION_CONFIG", "GenerationConfig", "MemberChoice", "choose_member", "context_rows", "generation_config"]

GENERATION_CONFIG = "generation_config.json"
_EXPECTED = "a generation_config.json object"
# The names MossTTSDelayModel.generate() takes (and MOSS-TTS-Local's _build_generation_config):
# ours are the same, so a flat key maps to itself.
_FLAT = ("text_temperature", "text_top_p", "text_top_k",
         "audio_temperature", "audio_top_p", "audio_top_k", "audio_repetition_penalty")  # fmt: skip
# MOSS-TTS-Local's GenerationConfig form: ``layers`` = one dict per channel (text, then each
# codebook) of these keys -> our key, per channel kind
_LAYER_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
               "repetition_penalty": "repetition_penalty"}  # fmt: skip
# plain transformers keys: the GitHub Delay generate() never reads them (and a Qwen3 base
# model's own generation_config, temperature 0.6 / top_k 20 / top_p 0.95, would otherwise
# replace the audio preset), so they are reported and left out; except for a member whose own
# generate() reads them as its audio preset (MOSS-TTSD's: generation_config.temperature, ...)
_GENERIC = ("temperature", "top_p", "top_k", "repetition_penalty", "do_sample")
_PLAIN_AUDIO = {"temperature": "audio_temperature", "top_p": "audio_top_p", "top_k": "audio_top_k",
                "repetition_penalty": "audio_repetition_penalty"}  # fmt: skip
# A bundle's n_ctx: its default generation (max_new_tokens rows) after a long prompt (five
# speakers' 10 s voices are 705 rows; with their text and the template about 1000), at least
# the 4096 the published configs use, in steps of 1024. A longer text is spoken in segments.
LONG_PROMPT_ROWS = 1024
MIN_CONTEXT = 4096


def context_rows(max_new_tokens: int) -> int:
    """The bundle's ``n_ctx`` for a default generation of ``max_new_tokens`` rows."""
    return max(MIN_CONTEXT, -(-(max_new_tokens + LONG_PROMPT_ROWS) // 1024) * 1024)


@dataclass(frozen=True)
class MemberChoice:
    kind: ModelKind
    why: str  # "--model-kind", "the name 'X'", "default"
    sampling: dict[str, float | int]
    from_generation_config: tuple[str, ...] = ()  # keys generation_config.json set
    max_new_tokens: int = 3072  # the config.yaml's: the member's, or generation_config.json's

    @property
    def n_ctx(self) -> int:
        return context_rows(self.max_new_tokens)

    def config_keys(self) -> dict[str, Any]:
        """The keys the bundle's config.json gets."""
        return {KIND_KEY: self.kind, SAMPLING_KEY: dict(self.sampling)}


@dataclass(frozen=True)
class GenerationConfig:
    """What a checkpoint's generation_config.json sets for its member."""

    sampling: dict[str, float | int]
    max_new_tokens: int | None = None


def _layers(path: Path, layers: object) -> dict[str, float | int]:
    """``layers`` [text, codebook 1, ...] -> text_* and audio_* keys (one audio preset: every
    codebook must agree)."""
    if not isinstance(layers, list) or not all(isinstance(x, dict) for x in layers) or len(layers) < 2:
        raise ModelFileError(path, f"{_EXPECTED} whose layers is a list of per-channel objects "
                             "(text, then each codebook)", f"got {layers!r}")  # fmt: skip
    if any(x != layers[1] for x in layers[2:]):
        raise ModelFileError(
            path, "one sampling preset for every audio codebook (layers[1:] equal)",
            "the codebooks differ; streamtts samples every codebook alike",
        )  # fmt: skip
    out: dict[str, float | int] = {}
    for channel, layer in (("text", layers[0]), ("audio", layers[1])):
        for key, value in layer.items():
            if key not in _LAYER_KEYS:
                continue
            ours = f"{channel}_{_LAYER_KEYS[key]}"
            if ours == "text_repetition_penalty":
                if value != 1.0:
                    log.warning("%s: layers[0].repetition_penalty %r ignored (the official Delay "
                                "model has no text repetition penalty)", path, value)  # fmt: skip
                continue
            out[ours] = sampling_value(ours, value, str(path))
    return out


def generation_config(folder: Path, m: Member | None = None) -> GenerationConfig:
    """What ``folder/generation_config.json`` sets for member ``m`` (nothing when there is none).

    Read: our own key names (``audio_temperature``, ..., the keyword names of the official
    ``MossTTSDelayModel.generate()``) at the top level, and MOSS-TTS-Local's ``layers`` list
    (``[text, codebook 1, ...]`` of ``temperature``/``top_p``/``top_k``/``repetition_penalty``);
    a top-level key wins over ``layers``. Plain ``temperature``/``top_p``/``top_k``/
    ``repetition_penalty`` and ``max_new_tokens``: the audio preset and the length, for a member
    whose own ``generate()`` reads them (``Member.reads_generation_config``: MOSS-TTSD's); else
    ignored with a log line (the GitHub ``generate()`` does not read them)."""
    path = folder / GENERATION_CONFIG
    if not path.is_file():
        return GenerationConfig({})
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFileError(path, _EXPECTED, f"not readable JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelFileError(path, _EXPECTED, f"got a JSON {type(data).__name__}")
    reads = m is not None and m.reads_generation_config
    out: dict[str, float | int] = {}
    max_new: int | None = None
    if reads:
        for key, ours in _PLAIN_AUDIO.items():
            if key in data:
                out[ours] = sampling_value(ours, data[key], str(path))
        if "max_new_tokens" in data:
            n = data["max_new_tokens"]
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ModelFileError(path, "max_new_tokens as a positive integer", f"got {n!r}")
            max_new = n
    if "layers" in data:
        out.update(_layers(path, data["layers"]))
    out.update({k: sampling_value(k, data[k], str(path)) for k in _FLAT if k in data})
    generic = [k for k in _GENERIC if k in data and not (reads and k in _PLAIN_AUDIO)]
    if generic:
        log.info("%s: %s not used (%s reads only its own text_*/audio_* arguments)", path,
                 ", ".join(generic), "its generate()" if reads else "the GitHub MossTTSDelayModel.generate()")  # fmt: skip
    return GenerationConfig(out, max_new)


def _detect(names: list[str]) -> tuple[ModelKind, str]:
    for name in names:
        kind = kind_from_name(name)
        if kind is not None:
            return kind, f"the name {name!r}"
    log.warning(
        "cannot tell which MossTTSDelay member %s is (none of %s names one): writing model_kind "
        "%s and its sampling defaults; pass --model-kind (%s) to choose",
        names[0] if names else "the checkpoint", names, DEFAULT_KIND, ", ".join(MEMBERS),
    )  # fmt: skip
    return DEFAULT_KIND, "default"


def choose_member(
    folder: Path, src: str, data: dict[str, Any], n_vq: int, model_kind: str | None = None
) -> MemberChoice:
    """The member of the checkpoint in ``folder`` (given as ``src``, a path or hub id; ``data``
    its config.json, ``n_vq`` its codebooks) and its bundle's sampling defaults."""
    if model_kind is not None:
        try:
            kind: ModelKind = member(model_kind.strip().lower()).kind
        except InputError as exc:
            raise ConfigError(f"--model-kind: {exc}") from None
        why = "--model-kind"
        if MEMBERS[kind].n_vq != n_vq:
            raise ConfigError(
                f"--model-kind {kind}: {MEMBERS[kind].title} has {MEMBERS[kind].n_vq} codebooks, "
                f"the checkpoint {n_vq} (n_vq in config.json)"
            )
    else:
        # the hub id's repo name or the folder's own name; in the hub cache's layout
        # (models--Owner--Name/snapshots/<hash>/) the folder above; then the config's
        here = folder.resolve()
        cached = here.parent.parent.name if here.parent.name == "snapshots" else ""
        parts = [Path(src).name, here.name, cached, str(data.get("_name_or_path") or "")]
        names = [n for i, n in enumerate(parts) if n and n not in parts[:i]]
        kind, why = _detect(names)
        if MEMBERS[kind].n_vq != n_vq:
            log.warning(
                "%s is %s by %s, which has %d codebooks, but the checkpoint has %d: check "
                "--model-kind", src, kind, why, MEMBERS[kind].n_vq, n_vq,
            )  # fmt: skip
    m = MEMBERS[kind]
    sampling: dict[str, float | int] = dict(m.sampling_defaults())
    own = generation_config(folder, m)
    sampling.update(own.sampling)
    try:
        msgspec.convert(sampling, SamplingParams).validate()
    except (msgspec.ValidationError, ConfigError) as exc:
        raise ModelFileError(folder / GENERATION_CONFIG, "sampling values in range", str(exc)) from exc
    keys = [*own.sampling, *(["max_new_tokens"] if own.max_new_tokens is not None else [])]
    log.info("model_kind %s (from %s)%s", kind, why,
             f"; {GENERATION_CONFIG} sets {', '.join(keys)}" if keys else "")  # fmt: skip
    return MemberChoice(kind, why, sampling, tuple(own.sampling), own.max_new_tokens or m.max_new_tokens)
