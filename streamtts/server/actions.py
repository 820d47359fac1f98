"""What a :class:`~streamtts.server.session.Session` asks its I/O layer (ws.py) to do, in order:
send a text or binary frame, configure the speech pipeline, synthesise a segment, end a
context's input, abort generation, close the connection."""

from __future__ import annotations

from dataclasses import dataclass

from ..request import StreamOptions, Voice

__all__ = ["Abort", "Action", "Close", "Configure", "EndInput", "SendAudio", "SendText", "Synthesize"]


@dataclass(frozen=True, slots=True)
class SendText:
    data: str
    error_code: str | None = None  # set for `error` messages (metrics)


@dataclass(frozen=True, slots=True)
class SendAudio:
    data: bytes
    seconds: float  # audio duration (send-buffer accounting)
    context_id: str | None = None  # a named context's audio (dropped when it is cancelled)
    header: str | None = None  # the `audio` message to send right before it (named contexts)


@dataclass(frozen=True, slots=True)
class Configure:
    """Set up the speech pipeline (sent once, before the first Synthesize)."""

    reference: Voice | None
    options: StreamOptions
    speakers: dict[str, Voice] | None = None  # a dialogue's voices (every context's)
    prefix: Voice | None = None  # continued by the implicit context's first segment
    prefix_text: str | None = None
    speaker_texts: dict[str, str] | None = None  # or: it continues the speakers' own clips
    model: str = ""  # the served model's id (server/model_names.py): "" the server's first


@dataclass(frozen=True, slots=True)
class Synthesize:
    index: int  # within its context
    text: str
    context_id: str | None = None  # None: the implicit context


@dataclass(frozen=True, slots=True)
class EndInput:
    """No more segments will come (for this context)."""

    context_id: str | None = None


@dataclass(frozen=True, slots=True)
class Abort:
    """Stop generation now and drop audio not yet sent: of one named context, or (None)
    of every context."""

    context_id: str | None = None


@dataclass(frozen=True, slots=True)
class Close:
    code: int
    reason: str
    # Don't wait for queued frames (the client is not reading, or must go now).
    immediate: bool = False


Action = SendText | SendAudio | Configure | Synthesize | EndInput | Abort | Close
