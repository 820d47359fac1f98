"""Messages of the ``/v1/stream`` WebSocket protocol (see docs/protocol.md).

Every JSON message is a msgspec Struct in a tagged union keyed by ``type``;
one :data:`DECODER` (built once) decodes client messages, one :data:`ENCODER`
encodes server messages. Audio goes as binary frames, never as JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import msgspec

from ..errors import (
    CodecError,
    ConfigError,
    EngineClosedError,
    GenerationError,
    InputError,
    ModelLoadError,
    OverloadedError,
    PromptTooLongError,
    QueueTimeoutError,
)
from ..request.fields import GenerationFields

__all__ = [
    "DECODER",
    "ENCODER",
    "AlignedWord",
    "Alignment",
    "AudioHeader",
    "Cancel",
    "ClientMessage",
    "CloseCode",
    "Decoded",
    "Done",
    "End",
    "Error",
    "ErrorCode",
    "ContextId",
    "Flush",
    "Ready",
    "SegmentInfo",
    "Sent",
    "ServerMessage",
    "Start",
    "Text",
    "decode_client",
]

PROTOCOL_VERSION = 1
MAX_CONTEXT_ID_CHARS = 128

# A client's name for one stream of its session (see docs/protocol.md, Contexts); absent = the
# session's implicit context.
ContextId = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_CONTEXT_ID_CHARS)]


# -- client -> server ---------------------------------------------------------------------------


class Start(GenerationFields, tag="start", frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Optional first message: the session's settings (all optional): the request's fields
    (request/fields.py: language, instruction, quality, tokens, ambient_sound -- with it, a
    session without text makes one sound --, sound_event, scene, seed, sampling,
    max_new_tokens per segment, timestamps) and these."""

    voice: str | None = None  # a voice id from POST /v1/voices
    # a dialogue's voices instead: {"S1": voice id, name or base64 clip, ...} for [S1], ...
    speakers: dict[str, str] | None = None
    prefix: str | None = None  # audio to continue (as a voice): the first segment continues it
    prefix_text: str | None = None  # its transcript, spoken before the first segment's text
    # or continue the speakers' own clips (MOSS-TTSD's app): {"S1": what S1's clip says, ...}
    speaker_texts: dict[str, str] | None = None
    format: str | None = None  # see streamtts.audio.formats.FORMATS (default pcm_s16le_24000)
    min_chars: int | None = None  # segmenter: minimum length of a sentence segment
    clause_min_chars: int | None = None  # ... of a segment cut at a clause (comma) boundary
    normalize: bool | None = None
    model: str | None = None  # a served model's id (GET /v1/models); None: the URL's ?model=, else the first


class Text(msgspec.Struct, tag="text", kw_only=True, forbid_unknown_fields=True):
    """Text to speak: a whole text or one LLM token at a time; ``flush`` = then flush."""

    text: str
    flush: bool = False
    context_id: ContextId | None = None


class Flush(msgspec.Struct, tag="flush", kw_only=True, forbid_unknown_fields=True):
    """Synthesise what is pending now, even if it is not a whole sentence yet."""

    context_id: ContextId | None = None


class End(msgspec.Struct, tag="end", kw_only=True, forbid_unknown_fields=True):
    """No more text: finish speaking, send ``done``, close (with a ``context_id``: that
    context finishes and sends its ``done``; the session stays open)."""

    context_id: ContextId | None = None


class Cancel(msgspec.Struct, tag="cancel", kw_only=True, forbid_unknown_fields=True):
    """Stop now: abort generation, drop unsent audio, send ``done``, close (with a
    ``context_id``: only that context; the session stays open)."""

    context_id: ContextId | None = None


ClientMessage = Start | Text | Flush | End | Cancel
CLIENT_TYPES = ("start", "text", "flush", "end", "cancel")

DECODER: msgspec.json.Decoder[ClientMessage] = msgspec.json.Decoder(ClientMessage)


# -- server -> client ---------------------------------------------------------------------------


class Limits(msgspec.Struct, kw_only=True):
    max_message_bytes: int
    max_text_chars: int  # per text message
    max_session_chars: int
    idle_timeout_s: float
    max_contexts: int = 0  # named contexts open at once


class Ready(msgspec.Struct, tag="ready", kw_only=True):
    session: str
    protocol: int
    format: str  # canonical format name
    encoding: str  # pcm_s16le | pcm_f32le | ulaw
    sample_rate: int
    channels: int
    voice: str | None
    language: str | None
    seed: int | None
    min_chars: int
    clause_min_chars: int
    limits: Limits
    model: str = ""  # the served model's id that speaks this session (GET /v1/models)


class SegmentInfo(msgspec.Struct, tag="segment", kw_only=True):
    """Sent after the last audio of a segment: which text that stretch of audio speaks."""

    index: int
    text: str
    start_frame: int  # 80 ms frames from the start of the session's audio
    end_frame: int  # exclusive
    start_s: float
    end_s: float
    ttfa_ms: float | None  # this segment's own time to first audio (engine)
    finish_reason: str
    context_id: str | None = None  # omitted for the implicit context


class AlignedWord(msgspec.Struct):
    word: str
    start: float  # seconds of the context's audio
    end: float


class Alignment(msgspec.Struct, tag="alignment", kw_only=True):
    """Estimated times of the words whose audio starts in the binary frame that follows (or
    before it): sent before that audio. ``chars`` adds every character ElevenLabs-style."""

    words: list[AlignedWord]
    estimated: bool = True  # placed by a duration model snapped to the audio, not forced alignment
    characters: list[str] | None = None
    character_start_times_seconds: list[float] | None = None
    character_end_times_seconds: list[float] | None = None
    context_id: str | None = None


class Sent(msgspec.Struct, kw_only=True):
    """On a cancel: how much of the context's audio the server had handed to the socket."""

    audio_s: float
    samples: int  # at the session's output sample rate
    words: int | None = None  # words whose audio was sent whole (None: timestamps off)
    text: str | None = None  # those words, to keep in an agent's context


class Done(msgspec.Struct, tag="done", kw_only=True):
    reason: str  # "end" | "cancelled"
    segments: int
    frames: int
    audio_s: float
    ttfa_ms: float | None  # first segment cut -> first audio byte queued for sending
    rtf: float | None  # wall time from first segment to last audio / audio seconds
    chars: int
    sent: Sent | None = None  # on a cancel: how far the client was sent audio
    context_id: str | None = None  # omitted for the session's own (final) done


class Error(msgspec.Struct, tag="error", kw_only=True):
    code: str  # stable, see ErrorCode
    message: str  # readable, names what was wrong
    fatal: bool = False  # the server closes the connection after this message
    context_id: str | None = None  # the context the refused message or failed segment was for


class AudioHeader(msgspec.Struct, tag="audio", kw_only=True):
    """Sent right before a binary frame of a named context: that frame is ``context_id``'s.
    Binary frames of the implicit context have no header (clients without contexts see none)."""

    context_id: str
    bytes: int


ServerMessage = Ready | SegmentInfo | Done | Error | AudioHeader | Alignment

ENCODER = msgspec.json.Encoder()


class ErrorCode:
    """Stable error codes (``Error.code``); docs/protocol.md explains each."""

    INVALID_JSON = "invalid_json"
    UNKNOWN_TYPE = "unknown_type"
    INVALID_MESSAGE = "invalid_message"  # wrong field type, missing or unknown field
    BINARY_NOT_SUPPORTED = "binary_not_supported"
    MESSAGE_TOO_LARGE = "message_too_large"
    TEXT_TOO_LONG = "text_too_long"  # one text message over max_text_chars
    SESSION_TEXT_LIMIT = "session_text_limit"  # the session's text over max_session_chars
    TEXT_AFTER_END = "text_after_end"  # text after `end` (of the session or of that context)
    CONTEXT_CLOSED = "context_closed"  # a context_id used again after its `done`
    TOO_MANY_CONTEXTS = "too_many_contexts"  # a new context beyond the session's cap
    ALREADY_STARTED = "already_started"  # a start after the session began
    NOT_STARTED = "not_started"  # text after a refused start (send a corrected start)
    UNKNOWN_VOICE = "unknown_voice"
    INVALID_FORMAT = "invalid_format"
    INVALID_OPTION = "invalid_option"
    INVALID_TEXT = "invalid_text"  # a segment the engine refused (empty after normalisation, ...)
    PROMPT_TOO_LONG = "prompt_too_long"
    OVERLOADED = "overloaded"
    QUEUE_TIMEOUT = "queue_timeout"
    GENERATION_FAILED = "generation_failed"
    CODEC_ERROR = "codec_error"
    IDLE_TIMEOUT = "idle_timeout"
    SLOW_CLIENT = "slow_client"
    FIRST_MESSAGE_TIMEOUT = "first_message_timeout"  # connected, then silent
    TOO_MANY_SESSIONS = "too_many_sessions"  # this client address is at its session cap
    SERVER_SHUTDOWN = "server_shutdown"  # cut at the end of a drain (close 1001)
    # the replica is draining: new sessions are refused (1013 / HTTP 503 + Retry-After) and
    # sessions with nothing in progress are closed (1001); reconnect, the balancer picks another
    SERVER_DRAINING = "server_draining"
    VOICE_STORE_UNAVAILABLE = "voice_store_unavailable"  # the shared voice store is unreachable
    UNKNOWN_MODEL = "unknown_model"  # `model` names none of the server's models
    MODEL_UNAVAILABLE = "model_unavailable"  # the model could not be loaded for this request
    INTERNAL_ERROR = "internal_error"
    # HTTP only
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN_ORIGIN = "forbidden_origin"
    FORBIDDEN_HOST = "forbidden_host"  # Host header not allowed (DNS rebinding)
    INVALID_REQUEST = "invalid_request"
    INVALID_REFERENCE_AUDIO = "invalid_reference_audio"
    NOT_FOUND = "not_found"


class CloseCode:
    """WebSocket close codes the server uses."""

    NORMAL = 1000  # after `done`
    GOING_AWAY = 1001  # server shutting down
    POLICY = 1008  # a limit was broken: idle / first-message timeout, slow reader; bad Host
    TOO_BIG = 1009  # a message over the hard size limit (closed by the websockets library)
    INTERNAL = 1011  # generation / codec / server failure
    TRY_AGAIN_LATER = 1013  # overloaded: all sessions / engine queue busy


@dataclass(frozen=True, slots=True)
class Decoded:
    """A decoded client frame: the message, or the error to answer it with."""

    message: ClientMessage | None
    error: Error | None = None
    # The refused message is a `start`, or its type cannot be read (not JSON, nested too
    # deeply, too large, no `type`): it may have been the client's `start`.
    may_be_start: bool = False


def decode_client(data: str | bytes) -> Decoded:
    """Decode one client text frame; on failure an :class:`Error` with the right code."""
    try:
        return Decoded(DECODER.decode(data))
    except msgspec.ValidationError as exc:
        return _classify(data, exc)
    except msgspec.DecodeError as exc:
        return Decoded(None, Error(code=ErrorCode.INVALID_JSON, message=f"not valid JSON: {exc}"), True)
    except RecursionError:  # msgspec's guard against deep nesting: a clean error, not a crash
        return _too_deep()


def _too_deep() -> Decoded:
    return Decoded(
        None,
        Error(code=ErrorCode.INVALID_MESSAGE, message="the message is nested too deeply"),
        True,
    )


def _classify(data: str | bytes, exc: msgspec.ValidationError) -> Decoded:
    # Error path only: decode again loosely to tell an unknown `type` from a bad field.
    try:
        obj: Any = msgspec.json.decode(data)
    except RecursionError:
        return _too_deep()
    except msgspec.DecodeError:  # pragma: no cover - DECODER would have said so
        obj = None
    if not isinstance(obj, dict):
        return Decoded(
            None,
            Error(
                code=ErrorCode.INVALID_MESSAGE,
                message=f"a message must be a JSON object with a `type`: {exc}",
            ),
        )
    kind = obj.get("type")
    if "type" not in obj:
        err = Error(code=ErrorCode.INVALID_MESSAGE, message="the message has no `type` field")
        return Decoded(None, err, True)
    if not isinstance(kind, str) or kind not in CLIENT_TYPES:
        err = Error(
            code=ErrorCode.UNKNOWN_TYPE,
            message=f"unknown message type {kind!r}; expected one of {', '.join(CLIENT_TYPES)}",
        )
        return Decoded(None, err)
    err = Error(code=ErrorCode.INVALID_MESSAGE, message=f"invalid {kind!r} message: {exc}")
    return Decoded(None, err, kind == "start")


def encode(msg: ServerMessage) -> str:
    """A server message as JSON text (text frames carry ``str``). An absent ``context_id``
    (and a ``done``'s absent ``sent``) is left out, so clients that use no contexts see the
    messages they always saw."""
    if isinstance(msg, Alignment):  # the character lists only when asked for
        obj = {k: v for k, v in msgspec.to_builtins(msg).items() if v is not None}
        return ENCODER.encode(obj).decode("utf-8")
    if getattr(msg, "context_id", "") is None or getattr(msg, "sent", "") is None:
        obj = msgspec.to_builtins(msg)
        if obj.get("context_id", "") is None:
            del obj["context_id"]
        if obj.get("sent", "") is None:  # a `done` says what was sent only on a cancel
            del obj["sent"]
        return ENCODER.encode(obj).decode("utf-8")
    return ENCODER.encode(msg).decode("utf-8")


# -- shared by the WebSocket session and the HTTP speech endpoint ---------------------------


def error_for_exception(exc: BaseException) -> tuple[str, bool, int]:
    """(error code, fatal, close code) for an error raised by the engine."""
    if isinstance(exc, PromptTooLongError):
        return ErrorCode.PROMPT_TOO_LONG, False, CloseCode.NORMAL
    if isinstance(exc, (InputError, ConfigError)):
        return ErrorCode.INVALID_TEXT, False, CloseCode.NORMAL
    if isinstance(exc, QueueTimeoutError):
        return ErrorCode.QUEUE_TIMEOUT, True, CloseCode.TRY_AGAIN_LATER
    if isinstance(exc, OverloadedError):
        return ErrorCode.OVERLOADED, True, CloseCode.TRY_AGAIN_LATER
    if isinstance(exc, ModelLoadError):
        return ErrorCode.MODEL_UNAVAILABLE, True, CloseCode.TRY_AGAIN_LATER
    if isinstance(exc, EngineClosedError):
        return ErrorCode.SERVER_SHUTDOWN, True, CloseCode.GOING_AWAY
    if isinstance(exc, CodecError):
        return ErrorCode.CODEC_ERROR, True, CloseCode.INTERNAL
    if isinstance(exc, GenerationError):
        return ErrorCode.GENERATION_FAILED, True, CloseCode.INTERNAL
    return ErrorCode.INTERNAL_ERROR, True, CloseCode.INTERNAL
