"""What ``POST /v1/audio/speech`` sends back: OpenAI's ``response_format`` and ``speed``.

``response_format``:

* ``pcm``: raw 24 kHz 16-bit little-endian samples (``audio/pcm``), and any raw format name
  of :data:`streamtts.audio.formats.FORMATS` (``pcm_s16le_16000``, ``ulaw_8000``, ...);
* ``wav``, ``mp3``, ``opus`` (in Ogg), ``aac`` (ADTS): the streaming variant of each
  container, encoded by FFmpeg through PyAV (:mod:`streamtts.audio.encoders`);
* ``flac``: encoded as it comes but sent whole at the end, its STREAMINFO stating the true
  length (a streamed FLAC states none, and libsndfile/soundfile cannot read that).

``speed`` (0.25 to 4.0, OpenAI's range) stretches the tempo with FFmpeg's ``atempo``
(pitch kept); 1.0 leaves the samples untouched. With ``stream_format: "sse"`` the events
carry the same bytes base64-encoded, except that ``wav`` deltas carry its samples without
the header (an event holds audio, not a file header).

Encoding and stretching run in a worker thread, one call at a time per response: a chunk
costs about 2 ms of mp3/AAC/Opus encoding, too much to spend on the event loop for every
chunk of every client.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..audio.encoders import (
    CONTAINER_FORMATS,
    MAX_SPEED,
    MIN_SPEED,
    ContainerEncoder,
    ContainerFormat,
    TimeStretch,
)
from ..audio.formats import FORMATS, AudioFormat, StreamEncoder, get_format
from ..errors import InputError
from .protocol import ErrorCode

__all__ = ["SpeechFormat", "SpeechOutput", "SpeechRequestError", "resolve_format", "check_speed"]

OPENAI_FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")


class SpeechRequestError(InputError):
    """A speech request field the server cannot honour: a 400 naming the field (``param``)."""

    def __init__(self, code: str, param: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.code = code
        self.param = param
        self.status = status


@dataclass(frozen=True, slots=True)
class SpeechFormat:
    name: str  # as the client asked
    raw: AudioFormat | None  # raw samples ...
    container: ContainerFormat | None  # ... or a container
    sample_rate: int  # what a decoder gets
    mime_type: str


def resolve_format(response_format: str, sse: bool = False) -> SpeechFormat:
    """The output for ``response_format``; :class:`SpeechRequestError` (``invalid_format``)
    naming the formats there are."""
    name = response_format
    if name == "wav" and sse:
        return SpeechFormat(name, get_format("pcm_s16le_24000"), None, 24000, "audio/pcm")
    container = CONTAINER_FORMATS.get(name)
    if container is not None:
        return SpeechFormat(name, None, container, container.sample_rate, container.mime_type)
    try:
        raw = get_format(name)
    except ValueError:
        raise SpeechRequestError(
            ErrorCode.INVALID_FORMAT,
            "response_format",
            f"response_format {name!r} is not supported; use one of "
            f"{', '.join(OPENAI_FORMATS)} or a raw format ({', '.join(FORMATS)})",
        ) from None
    mime = "audio/pcm" if raw.name == "pcm_s16le_24000" else raw.mime_type
    return SpeechFormat(name, raw, None, raw.sample_rate, mime)


def check_speed(speed: float) -> float:
    if not (MIN_SPEED <= speed <= MAX_SPEED):  # NaN fails too
        raise SpeechRequestError(
            ErrorCode.INVALID_OPTION,
            "speed",
            f"speed must be between {MIN_SPEED} and {MAX_SPEED} (1.0 = as generated), got {speed}",
        )
    return speed


class SpeechOutput:
    """float32 24 kHz chunks in, the response's bytes out: time-stretch, then encode."""

    def __init__(self, fmt: SpeechFormat, speed: float = 1.0) -> None:
        self.format = fmt
        self._stretch = TimeStretch(speed) if speed != 1.0 else None
        self._container = ContainerEncoder(fmt.container) if fmt.container is not None else None
        self._raw = StreamEncoder(fmt.raw) if fmt.raw is not None else None
        # raw samples without stretching: cheap enough for the loop (as before)
        self._threaded = self._container is not None or self._stretch is not None
        # held by the worker thread while it encodes: close() waits for it (FFmpeg state must
        # not be freed under a running call)
        self._lock = threading.Lock()
        self.samples_out = 0  # at 24 kHz, after stretching

    def _feed(self, pcm: npt.NDArray[np.float32]) -> bytes:
        with self._lock:
            return self._feed_locked(pcm)

    def _feed_locked(self, pcm: npt.NDArray[np.float32]) -> bytes:
        x = self._stretch.push(pcm) if self._stretch is not None else pcm
        self.samples_out += int(x.shape[0])
        if self._container is not None:
            return self._container.encode(x)
        assert self._raw is not None
        return self._raw.encode(x)

    def _finish(self) -> bytes:
        with self._lock:
            return self._finish_locked()

    def _finish_locked(self) -> bytes:
        out = b""
        if self._stretch is not None:
            x = self._stretch.flush()
            self.samples_out += int(x.shape[0])
            if x.shape[0]:
                out += self._container.encode(x) if self._container else self._raw_encode(x)
        if self._container is not None:
            return out + self._container.flush()
        assert self._raw is not None
        return out + self._raw.flush()

    def _raw_encode(self, x: npt.NDArray[np.float32]) -> bytes:
        assert self._raw is not None
        return self._raw.encode(x)

    async def feed(self, pcm: npt.NDArray[np.float32]) -> bytes:
        if self._threaded:
            return await asyncio.to_thread(self._feed, pcm)
        return self._feed(pcm)

    async def finish(self) -> bytes:
        """The last bytes (codec and filter tails, container end)."""
        if self._threaded:
            return await asyncio.to_thread(self._finish)
        return self._finish()

    def close(self) -> None:
        """An aborted response: release the codec (after a call still running in the worker
        thread, at most one chunk's encoding)."""
        if self._container is not None:
            with self._lock:
                self._container.close()
