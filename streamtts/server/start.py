"""A WebSocket ``start`` or a speech body turned into what the engine takes: the request's
options, every field rule checked once (request/rules.py), and the rules between its voice
fields (request/voices.py). A broken rule is a :class:`~streamtts.errors.FieldError`: the
session sends it as an ``invalid_option`` error, the speech endpoint as a 400 naming ``param``.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..request import (
    PROMPT_FIELDS,
    FieldError,
    GenerationFields,
    LexiconLayer,
    StreamOptions,
    VoiceRequest,
    check,
)
from ..text.lexicon import Lexicon
from .openai_formats import SpeechRequestError
from .protocol import ErrorCode

__all__ = ["check_voice_fields", "http_error", "request_options"]


def request_options(
    fields: GenerationFields,
    cap: int | None,
    *,
    normalize: bool | None = None,
    instruction: str | None = None,
    lexicons: tuple[LexiconLayer, ...] | None = None,
) -> StreamOptions:
    """The options ``fields`` ask for, checked; ``max_new_tokens`` under the server's ``cap``.
    ``instruction``: the field under another name (the OpenAI body's ``instructions``).
    ``lexicons``: what the text is read with, compiled (lexicon_store.py's ``layers``: the
    request's, a stored one it names, the server's); None: the request's map, compiled here."""
    sampling = check(fields)
    if lexicons is None:
        if isinstance(fields.lexicon, str):
            raise FieldError("lexicon", f"lexicon: no stored lexicon {fields.lexicon[:80]!r} here")
        lexicons = () if fields.lexicon is None else (Lexicon.compile(fields.lexicon),)
    prompt = {f: getattr(fields, f) for f in PROMPT_FIELDS}
    if instruction is not None:
        prompt["instruction"] = instruction
    mnt = fields.max_new_tokens
    if cap is not None:
        mnt = cap if mnt is None else min(mnt, cap)
    return StreamOptions(
        **prompt,
        seed=fields.seed,
        sampling=sampling,
        max_new_tokens=mnt,
        normalize=normalize,
        timestamps=None if fields.timestamps in (None, "none") else fields.timestamps,
        playback_buffer_ms=fields.playback_buffer_ms,
        lexicons=lexicons,
    )


def check_voice_fields(
    reference: object | None, speakers: Mapping[str, object] | None, prefix: object | None, prefix_text: str | None
) -> None:
    """The rules between the voice fields (``reference``: the one voice, None for none or the
    model's own)."""
    VoiceRequest(
        reference=reference, speakers=speakers, prefix=prefix, prefix_text=prefix_text, reference_name="voice"
    ).check()


def http_error(exc: FieldError) -> SpeechRequestError:
    """A broken field rule as the speech endpoint's 400: ``invalid_option``, ``param`` the field."""
    return SpeechRequestError(ErrorCode.INVALID_OPTION, exc.field, str(exc))
