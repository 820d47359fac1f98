"""The fields a request may set besides its text and voices: the one list of them.

Every front door (the WebSocket ``start``, the speech body, the CLI, :class:`StreamOptions`
of the Python API) is a struct made of these, so a new prompt field is written here and on
its template line (core/prompt.py), nowhere else. msgspec lays a struct's fields out in one
row, so the two sets are a chain (``GenerationFields`` extends ``PromptFields``), not two
bases of one struct.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ..config import SamplingParams

__all__ = ["GENERATION_FIELDS", "PROMPT_FIELDS", "GenerationFields", "PromptFields"]


class PromptFields(msgspec.Struct, frozen=True, kw_only=True):
    """The prompt's field lines (each member's template writes a subset of them; a field a
    request sets that its template does not write is an error, core/prompt.py). ``None``:
    the template writes ``None``. The order is the one errors name them in."""

    instruction: str | None = None
    tokens: int | None = None  # desired duration in audio frames (the prompt's "Tokens" field)
    quality: str | None = None
    # SoundEffect's fields: with ambient_sound the text may be empty (the prompt says None)
    sound_event: str | None = None
    ambient_sound: str | None = None
    language: str | None = None  # an ISO code or a name; the member's own form is written
    # no template writes a scene (MOSS-TTSD's processor writes "Scene: None" whatever is
    # asked): set, it is an error saying so (core/prompt.py check_template_fields)
    scene: str | None = None


class GenerationFields(PromptFields, frozen=True, kw_only=True):
    """The prompt's fields and how to generate from it. ``None`` = the engine's default."""

    seed: int | None = None
    sampling: SamplingParams | None = None
    max_new_tokens: int | None = None
    # Estimated word times on the chunks (AudioChunk.words): "words" or "chars" (the server
    # sends character times too); None / "none": off.
    timestamps: str | None = None
    # The audio the client holds before it starts playing (ms): a client that buffers more
    # than the engine's first chunk assumes may get a smaller first chunk, so its first audio
    # comes sooner (engine/chunk_policy.py first_chunk_frames). None: the engine's chunks.
    playback_buffer_ms: float | None = None
    # A pronunciation lexicon (text/lexicon.py): {"word or phrase": "how to read it", ...}, or
    # the id or name of a lexicon stored on the server (POST /v1/lexicons). Applied after
    # normalisation, before tokenisation; the word times keep the words as written. The
    # entries are checked where the lexicon is compiled (text/lexicon.py names the entry).
    lexicon: dict[str, Any] | str | None = None


PROMPT_FIELDS: tuple[str, ...] = PromptFields.__struct_fields__
GENERATION_FIELDS: tuple[str, ...] = tuple(
    f for f in GenerationFields.__struct_fields__ if f not in PROMPT_FIELDS
)
