"""Every rule about a request's fields, stated once: each front door decodes into the field
structs (fields.py, voices.py) and calls :func:`check`; the engine relies on it.

A broken rule is a :class:`~streamtts.errors.FieldError` whose ``field`` is the field as the
request spells it (``tokens``, ``sampling.text_top_p``, ``speakers``): the WebSocket maps it to
an error code, HTTP to a 400 naming ``param``, the CLI to its flag.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from ..config import SamplingParams
from ..errors import FieldError, SamplingError
from .fields import PROMPT_FIELDS, GenerationFields

__all__ = [
    "MAX_PLAYBACK_BUFFER_MS",
    "MAX_SEED",
    "TIMESTAMP_MODES",
    "FieldError",
    "check",
    "check_chunk_frames",
    "check_language",
    "check_playback_buffer",
    "check_lexicon_value",
    "check_sampling",
    "check_timestamps",
    "check_written",
    "unwritten_fields",
]

MAX_SEED = 1 << 63  # seeds are in [0, 2**63)
TIMESTAMP_MODES = ("none", "words", "chars")
# a minute: more is no player's buffer but a unit mistaken (seconds x 1000 twice)
MAX_PLAYBACK_BUFFER_MS = 60_000.0


def check(
    fields: GenerationFields, *, fixed_frames: int | None = None, chunk_frames: Sequence[int] | None = None
) -> SamplingParams | None:
    """Every field rule on ``fields`` (and the Python API's ``fixed_frames`` and
    ``chunk_frames``, StreamOptions); the sampling, validated (None when not set)."""
    check_language(fields.language)
    if fields.tokens is not None and fields.tokens < 1:
        raise FieldError("tokens", f"tokens (duration in frames) must be >= 1, got {fields.tokens}")
    if fields.max_new_tokens is not None and fields.max_new_tokens < 1:
        raise FieldError("max_new_tokens", f"max_new_tokens must be >= 1, got {fields.max_new_tokens}")
    if fields.seed is not None and not (0 <= fields.seed < MAX_SEED):
        raise FieldError("seed", f"seed must be in [0, 2**63), got {fields.seed}")
    if fixed_frames is not None and fixed_frames < 1:
        raise FieldError("fixed_frames", f"fixed_frames must be >= 1, got {fixed_frames}")
    check_timestamps(fields.timestamps)
    check_playback_buffer(fields.playback_buffer_ms)
    check_chunk_frames(chunk_frames)
    check_lexicon_value(fields.lexicon)
    return None if fields.sampling is None else check_sampling(fields.sampling)


def check_sampling(sampling: SamplingParams) -> SamplingParams:
    """The sampling values in range; a wrong one named as the request nests it."""
    try:
        return sampling.validate()
    except SamplingError as exc:
        raise FieldError(f"sampling.{exc.field}", f"sampling.{exc}") from exc


def check_playback_buffer(value: float | None) -> None:
    """A client's playback buffer, when given, is a finite number of ms in [0, a minute]."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise FieldError("playback_buffer_ms", f"playback_buffer_ms must be a number of milliseconds, got {value!r}")
    if not 0 <= value <= MAX_PLAYBACK_BUFFER_MS:
        raise FieldError(
            "playback_buffer_ms",
            f"playback_buffer_ms must be in [0, {MAX_PLAYBACK_BUFFER_MS:.0f}] (milliseconds), got {value:g}",
        )


def check_chunk_frames(sizes: Sequence[int] | None) -> None:
    """A stream's own chunk sizes (StreamOptions.chunk_frames), when given: frames >= 1."""
    if sizes is not None and (not sizes or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in sizes)):
        raise FieldError("chunk_frames", f"chunk_frames must be a non-empty list of ints >= 1, got {list(sizes)!r}")


def check_lexicon_value(value: object) -> None:
    """A lexicon is a map (its entries: text/lexicon.py checks each) or a stored one's id or name."""
    if value is None or isinstance(value, dict):
        return
    if not isinstance(value, str) or not value.strip():
        raise FieldError(
            "lexicon",
            'lexicon must be a JSON object mapping words to how they are read ({"nginx": "engine x"}) '
            "or the id or name of a stored lexicon (POST /v1/lexicons)",
        )


def check_language(value: str | None) -> None:
    """A language, when given, is not blank (its form is the member's: core/family.py)."""
    if value is not None and not value.strip():
        raise FieldError(
            "language", "language is empty: give an ISO code ('en') or a name ('English'), or leave it out"
        )


def check_timestamps(mode: str | None) -> str:
    """The word-time mode (None = "none"); another value names the choices."""
    m = mode or "none"
    if m not in TIMESTAMP_MODES:
        raise FieldError("timestamps", f"timestamps must be one of {', '.join(TIMESTAMP_MODES)}, got {mode!r}")
    return m


def unwritten_fields(written: Iterable[str], values: object) -> list[str]:
    """The prompt fields set in ``values`` (a field struct, a PromptSpec) that a template
    writing ``written`` does not write."""
    kept = frozenset(written)
    return [f for f in PROMPT_FIELDS if getattr(values, f, None) is not None and f not in kept]


def check_written(name: str, written: Iterable[str], values: object, *, why: str = "") -> None:
    """A field set that the template ``name`` does not write would be dropped silently: an
    error naming every such field (``field``: the first), and ``why`` the template leaves it
    out when it says (MOSS-TTSD's: its processor writes ``None`` whatever is asked)."""
    unused = unwritten_fields(written, values)
    if unused:
        kept = sorted(written)
        raise FieldError(
            unused[0],
            f"{', '.join(unused)}: "
            + (why or f"not a field of the prompt template {name!r} (its fields: {', '.join(kept)}; "
               "EngineConfig.prompt_template picks another)"),
        )  # fmt: skip
