"""A request's voice fields besides ``voice``: a dialogue's ``speakers`` and a continuation's
``prefix`` (WebSocket ``start`` and ``POST /v1/audio/speech`` alike).

Each value is a string, as ``voice`` is: a voice id from ``POST /v1/voices`` or a name of the
config's ``voices:`` table; or else the clip itself, base64-encoded (wav, flac, ogg), which
is encoded and stored like an upload (the same clip twice is encoded once, and its id works
afterwards). A ``start`` message is at most ``max_message_bytes`` (64 KiB by default): upload
longer clips first.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Collection, Mapping

from ..errors import InputError, ReferenceAudioError, VoiceStoreUnavailableError
from ..request import Voice
from ..request.voices import speaker_number
from .app_state import ServerState
from .protocol import ErrorCode
from .voices import is_voice_id

__all__ = ["VoiceFieldError", "resolve_voice", "resolve_voices"]

MIN_CLIP_CHARS = 64  # shorter than any audio file's base64: a mistyped id, not a clip


class VoiceFieldError(InputError):
    """A voice field that names no usable voice; ``code`` is the protocol's error code,
    ``field`` the field as the client wrote it (``speakers.S1``, ``prefix``)."""

    def __init__(self, code: str, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.code = code
        self.field = field


async def resolve_voice(state: ServerState, value: object, field: str, *, keep_clip: bool = False) -> Voice:
    """The voice ``value`` names or holds (see the module doc). ``keep_clip``: a base64 clip is
    encoded here and its Voice keeps the clip (a continuation of the speakers' own clips joins
    them: Engine.stream's ``speaker_texts``), not stored (the store keeps codes)."""
    if not isinstance(value, str) or not value:
        raise VoiceFieldError(ErrorCode.INVALID_OPTION, field, "expected a voice id, a voice name or a base64 clip")
    if value in state.voice_names.own:
        raise VoiceFieldError(
            ErrorCode.INVALID_OPTION, field,
            f"{value!r} is the model's own voice, which has no audio to give here: use a voice id "
            "from POST /v1/voices, a name of the config's voices, or a base64 clip",
        )  # fmt: skip
    try:
        voice = state.named_voice(value)
        if voice is None:  # an id or an upload's name (the shared store's too)
            voice = await state.voices.fetch(value)
        if voice is not None:
            return voice
        if is_voice_id(value) or len(value) < MIN_CLIP_CHARS:
            raise VoiceFieldError(ErrorCode.UNKNOWN_VOICE, field, state.unknown_voice(value))
        try:
            data = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise VoiceFieldError(
                ErrorCode.INVALID_REFERENCE_AUDIO, field,
                "neither a voice id or name nor a base64 clip (not valid base64)",
            ) from None  # fmt: skip
        if keep_clip:
            async with state.models.lease(state.models.encoder_id) as engine:
                clipped: Voice = await engine.encode_voice(data)
            return clipped
        info = await state.voices.add(data)
    except VoiceStoreUnavailableError as exc:
        raise VoiceFieldError(ErrorCode.VOICE_STORE_UNAVAILABLE, field, f"{exc}; try again shortly") from exc
    except ReferenceAudioError as exc:
        raise VoiceFieldError(ErrorCode.INVALID_REFERENCE_AUDIO, field, str(exc)) from exc
    stored = state.voices.get(info.voice_id)
    if stored is None:  # pragma: no cover - add() keeps it in the local cache
        raise VoiceFieldError(ErrorCode.INTERNAL_ERROR, field, "the encoded clip was not kept")
    return stored


async def resolve_voices(
    state: ServerState, speakers: Mapping[str, str] | None, prefix: str | None, keep_clips: Collection[int] = ()
) -> tuple[dict[str, Voice] | None, Voice | None]:
    """(the speakers' voices ``S1`` -> Voice, the prefix's voice); None where not given.
    ``keep_clips``: the speaker numbers whose clips are kept (:func:`resolve_voice`)."""
    cast: dict[str, Voice] | None = None
    if speakers:
        cast = {}
        for key, value in speakers.items():
            try:
                n = speaker_number(key)
            except InputError as exc:
                raise VoiceFieldError(ErrorCode.INVALID_OPTION, "speakers", str(exc).removeprefix("speakers: ")) from exc
            if f"S{n}" in cast:
                raise VoiceFieldError(ErrorCode.INVALID_OPTION, "speakers", f"S{n} is given twice")
            cast[f"S{n}"] = await resolve_voice(state, value, f"speakers.{key}", keep_clip=n in keep_clips)
    start = None if prefix is None else await resolve_voice(state, prefix, "prefix")
    return cast, start
