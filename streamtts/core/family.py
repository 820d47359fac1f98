"""The MossTTSDelay family: each member's shape, fields and sampling defaults (model cards).

Pure data and two lookups: which member a checkpoint is (from its folder or repo name, or
told), and how a ``language`` value is written for it. Every member shares the architecture,
the special token ids and the codec; they differ in ``n_vq``, the prompt fields they use,
their audio sampling preset and the form of ``language``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..config import SAMPLING_KEYS
from ..errors import InputError, ModelFileError
from ..request.rules import check_language
from .tokens import read_model_config

ModelKind = Literal["moss-tts", "moss-tts-v1.5", "moss-ttsd", "moss-voice-generator", "moss-sound-effect"]
LanguageForm = Literal["code", "name", "as-given"]
# the normaliser a member's own code applies when normalisation is on: the GitHub processor's
# (v1.5's robustness normaliser, text/normalize.py, on the text), MOSS-TTSD's (text/ttsd.py, on
# the text) or MOSS-VoiceGenerator's (text/voicegen.py: one for the text, one for the instruction)
Normalizer = Literal["moss", "ttsd", "voicegen"]

# The GitHub MossTTSDelayModel.generate()'s text channel (OpenMOSS/MOSS-TTS
# moss_tts_delay/modeling_moss_tts.py): every member served with the GitHub code uses it.
_GITHUB_TEXT = (1.5, 1.0, 50)
GITHUB_SOURCE = "OpenMOSS/MOSS-TTS moss_tts_delay/ (processing_moss_tts.py, modeling_moss_tts.py)"
VOICEGEN_SOURCE = (
    "GitHub template and generate(); normalisers: MOSS-VoiceGenerator's own processing_moss_tts.py "
    "(normalize_inputs=True) as ported by Blaizzy/mlx-audio mlx_audio/tts/models/moss_tts/processor.py "
    "(unverified against the checkpoint's file, which could not be read)"
)
TTSD_SOURCE = (
    "MOSS-TTSD-v1.0's own processing_moss_tts.py and modeling_moss_tts.py (byte copy: "
    "diodiogod/TTS-Audio-Suite engines/moss_tts/impl/ttsd/) and OpenMOSS/MOSS-TTSD generation_utils.py"
)


@dataclass(frozen=True, slots=True)
class Member:
    """One member of the family."""

    kind: ModelKind
    title: str
    hf_repo: str
    n_vq: int
    backbone: str
    # audio temperature / top-p / top-k / repetition penalty
    audio_temperature: float
    audio_top_p: float
    audio_top_k: int
    audio_repetition_penalty: float
    # how its `language` field is written: ISO code ("en"), name ("English"), or as the
    # caller gave it (the model card does not say)
    language_form: LanguageForm
    fields: tuple[str, ...]  # the prompt fields its model card uses
    # its prompt template (core/prompt.py TEMPLATES); EngineConfig.prompt_template picks another
    template: str = "moss"
    # the text channel's temperature / top-p / top-k, as its generate() has them
    text_preset: tuple[float, float, int] = _GITHUB_TEXT
    normalizer: Normalizer = "moss"
    # its generate() reads the checkpoint's generation_config.json: plain temperature / top_p /
    # top_k / repetition_penalty as the audio preset, and max_new_tokens (convert/member.py)
    reads_generation_config: bool = False
    # steps of one generation by default (its generate()'s fallback where it has one that
    # reads generation_config.json; else the engine's)
    max_new_tokens: int = 3072
    source: str = GITHUB_SOURCE  # the code its template, presets and normaliser follow
    # its activations overflow float16 (reports: attention-sink activations near 169k, past
    # float16's 65504): llama.cpp multiplies by an F16 matrix in float16, on every backend (the
    # CPU's F16 dot product converts the activations to F16 too), so an F16 GGUF gives NaN
    f16_overflows: bool = False

    def sampling_defaults(self) -> dict[str, float | int]:
        """The sampling keys (EngineConfig / SamplingParams names) of this member's preset."""
        t, p, k = self.text_preset
        return {
            "text_temperature": t,
            "text_top_p": p,
            "text_top_k": k,
            "audio_temperature": self.audio_temperature,
            "audio_top_p": self.audio_top_p,
            "audio_top_k": self.audio_top_k,
            "audio_repetition_penalty": self.audio_repetition_penalty,
        }


MEMBERS: dict[str, Member] = {
    m.kind: m
    for m in (
        Member("moss-tts", "MOSS-TTS 1.0", "OpenMOSS-Team/MOSS-TTS", 32, "Qwen3-8B",
               1.7, 0.8, 25, 1.0, "code", ("text", "reference", "language")),
        Member("moss-tts-v1.5", "MOSS-TTS-v1.5", "OpenMOSS-Team/MOSS-TTS-v1.5", 32, "Qwen3-8B",
               1.7, 0.8, 25, 1.0, "name", ("text", "reference", "language")),
        # TTSD's generate(): text 1.1 / 0.9 / 50; audio preset and max_new_tokens from
        # generation_config.json, else 1.1 / 0.9 / 50 / 1.1 and 1000
        Member("moss-ttsd", "MOSS-TTSD-v1.0", "OpenMOSS-Team/MOSS-TTSD-v1.0", 16, "Qwen3-8B",
               1.1, 0.9, 50, 1.1, "as-given", ("text", "speakers", "prefix"),
               template="moss-ttsd", text_preset=(1.1, 0.9, 50), normalizer="ttsd",
               reads_generation_config=True, max_new_tokens=1000, source=TTSD_SOURCE, f16_overflows=True),
        # its own processor: the GitHub template; its own normalisers of the text and the instruction
        Member("moss-voice-generator", "MOSS-VoiceGenerator", "OpenMOSS-Team/MOSS-VoiceGenerator", 16,
               "Qwen3-1.7B", 1.5, 0.6, 50, 1.1, "as-given", ("text", "instruction"), normalizer="voicegen",
               source=VOICEGEN_SOURCE, f16_overflows=True),
        # its own processor: the GitHub template, a duration of 125 frames (10 s) when none is given
        Member("moss-sound-effect", "MOSS-SoundEffect", "OpenMOSS-Team/MOSS-SoundEffect", 16, "Qwen3-8B",
               1.5, 0.6, 50, 1.2, "as-given", ("ambient_sound", "sound_event", "tokens"),
               template="moss-sound-effect",
               source="MOSS-SoundEffect's own processing_moss_tts.py (the GitHub one, tokens=125 by default)"),
    )
}  # fmt: skip
DEFAULT_KIND: ModelKind = "moss-tts"

# Longest patterns first: "moss-tts-v1.5" must not read as "moss-tts".
_NAME_PATTERNS: tuple[tuple[str, ModelKind], ...] = (
    (r"voice[-_ ]?generator", "moss-voice-generator"),
    (r"sound[-_ ]?effect", "moss-sound-effect"),
    (r"ttsd", "moss-ttsd"),
    (r"tts[-_ ]?v?1[._-]?5", "moss-tts-v1.5"),
    (r"moss[-_ ]?tts", "moss-tts"),
)


F16_OVERFLOW = (
    "its activations reach about 169k (reported for MOSS-TTSD-8B and MOSS-VoiceGenerator), past "
    "float16's 65504, and llama.cpp multiplies by an F16 matrix in float16 on every backend (NaN): "
    "use --quant BF16, F32 or a quantized type (Q8_0, Q4_K_M)"
)


def member(kind: str) -> Member:
    """The member called ``kind``; an unknown name is an error listing the known ones."""
    try:
        return MEMBERS[kind]
    except KeyError:
        raise InputError(f"unknown model kind {kind!r}; known: {', '.join(MEMBERS)}") from None


def kind_from_name(name: str) -> ModelKind | None:
    """The member a folder or repo name names (``OpenMOSS-Team/MOSS-TTSD-v1.0`` -> moss-ttsd),
    or None when it names none."""
    low = name.lower()
    for pattern, kind in _NAME_PATTERNS:
        if re.search(pattern, low):
            return kind
    return None


# ISO 639-1 code -> the language name v1.5's prompts use. Names outside the table are sent
# as given; so is a code outside it (with a member that wants names, that is the caller's call).
LANGUAGE_NAMES: dict[str, str] = {
    "en": "English", "zh": "Chinese", "ja": "Japanese", "ko": "Korean", "fr": "French",
    "de": "German", "es": "Spanish", "it": "Italian", "pt": "Portuguese", "ru": "Russian",
    "ar": "Arabic", "fa": "Persian (Farsi)", "hi": "Hindi", "tr": "Turkish", "vi": "Vietnamese",
    "th": "Thai", "id": "Indonesian", "ms": "Malay", "nl": "Dutch", "pl": "Polish",
    "sv": "Swedish", "uk": "Ukrainian", "cs": "Czech", "el": "Greek", "he": "Hebrew",
    "hu": "Hungarian", "ro": "Romanian", "da": "Danish", "fi": "Finnish", "no": "Norwegian",
    "bn": "Bengali", "ur": "Urdu", "tl": "Tagalog", "yue": "Cantonese",
}
_CODES = {name.lower(): code for code, name in LANGUAGE_NAMES.items()}
_CODES.update({"persian": "fa", "farsi": "fa", "mandarin": "zh"})


def language_for(form: LanguageForm, value: str | None) -> str | None:
    """``value`` (an ISO code or a name, any case) in the form a member's prompt uses."""
    if value is None:
        return None
    check_language(value)
    v = value.strip()
    if form == "as-given":
        return v
    low = v.lower()
    code = low if low in LANGUAGE_NAMES else _CODES.get(low)
    if code is None:
        return v
    return code if form == "code" else LANGUAGE_NAMES[code]


def known_language(value: str) -> bool:
    """Whether ``value`` is a language whose code and name are known (any case)."""
    low = value.strip().lower()
    return low in LANGUAGE_NAMES or low in _CODES


def close_languages(value: str) -> list[str]:
    """The known languages ``value`` may have meant (``englsh`` -> ``English (en)``)."""
    import difflib

    low = value.strip().lower()
    names = difflib.get_close_matches(low, list(_CODES), n=3, cutoff=0.7)
    return [f"{LANGUAGE_NAMES[_CODES[n]]} ({_CODES[n]})" for n in names]


def unused_fields(m: Member, given: Mapping[str, object]) -> list[str]:
    """The fields of ``given`` (set, not None) that ``m``'s model card does not use."""
    return [k for k, v in given.items() if v is not None and v != [] and k not in m.fields]


# -- what a bundle's config.json says about its member ----------------------------------------------
#
# `streamtts convert-hf` writes two keys into the bundle's config.json besides the checkpoint's
# own: "model_kind" (a MEMBERS name) and "sampling" (the member's defaults under the
# EngineConfig / SamplingParams key names). The engine reads them back here.
KIND_KEY = "model_kind"
SAMPLING_KEY = "sampling"
_INT_KEYS = frozenset({"text_top_k", "audio_top_k"})


@dataclass(frozen=True, slots=True)
class BundleMember:
    """The member a bundle names (None: it names none) and its sampling defaults ({}: none)."""

    kind: ModelKind | None = None
    sampling: dict[str, float | int] = field(default_factory=dict)


def sampling_value(key: str, value: object, where: str) -> float | int:
    """One sampling default checked for type (ranges: ``SamplingParams.validate``); a bad one
    is a ModelFileError naming ``where``."""
    if key not in SAMPLING_KEYS:
        raise ModelFileError(where, f"sampling keys from {', '.join(SAMPLING_KEYS)}", f"got {key!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ModelFileError(where, f"{key} as a number", f"got {value!r}")
    if key in _INT_KEYS:
        if value != int(value):
            raise ModelFileError(where, f"{key} as an integer", f"got {value!r}")
        return int(value)
    return float(value)


def bundle_member(data: Mapping[str, Any], where: str) -> BundleMember:
    """The ``model_kind`` and ``sampling`` keys of a bundle's config.json (``data``, read from
    ``where``). A kind without a ``sampling`` object gets its member's table; a ``sampling``
    object's absent keys too."""
    kind = data.get(KIND_KEY)
    raw = data.get(SAMPLING_KEY)
    if kind is None and raw is None:
        return BundleMember()
    m: Member | None = None
    if kind is not None:
        if not isinstance(kind, str) or kind not in MEMBERS:
            raise ModelFileError(where, f"{KIND_KEY} one of {', '.join(MEMBERS)}", f"got {kind!r}")
        m = MEMBERS[kind]
    sampling: dict[str, float | int] = dict(m.sampling_defaults()) if m is not None else {}
    if raw is not None:
        if not isinstance(raw, dict):
            raise ModelFileError(where, f"{SAMPLING_KEY} as an object of sampling keys", f"got {raw!r}")
        sampling.update({k: sampling_value(k, v, where) for k, v in raw.items()})
    return BundleMember(m.kind if m is not None else None, sampling)


def load_bundle_member(config_json: str | Path | None) -> BundleMember:
    """:func:`bundle_member` of a model config.json (None: no file, no member)."""
    if config_json is None:
        return BundleMember()
    return bundle_member(read_model_config(config_json), str(config_json))
