"""Compressed and containered output (mp3, Ogg Opus, AAC, FLAC, WAV) and time-stretching,
streamed chunk by chunk through FFmpeg's libraries (PyAV): no encoder of ours.

:class:`ContainerEncoder` takes the engine's float32 24 kHz chunks as they come and returns
the container's bytes as soon as the codec has produced them (a few codec frames of delay:
mp3 and AAC hold about 50 ms, Opus 20 ms; WAV none). The muxer writes to a non-seekable
sink, so these containers are the streaming variant of their format: WAV with sizes
0xFFFFFFFF, Ogg pages flushed every packet, ADTS AAC, MP3 with an ID3 tag and no seek
table. FLAC is the exception (``whole``): a streamed FLAC states no length in its
STREAMINFO, which FFmpeg accepts but libsndfile (soundfile) cannot read (it takes the length
as 2**63 and fails to allocate it), so FLAC is muxed into a seekable buffer and comes out
whole from :meth:`ContainerEncoder.flush`, with its true length and MD5 written back by
FFmpeg. :meth:`ContainerEncoder.flush` drains the codec and ends the container.

:class:`TimeStretch` changes the tempo without changing the pitch with FFmpeg's ``atempo``
filter (WSOLA), also streaming; OpenAI's ``speed`` range 0.25 to 4.0 is two chained filters
below 0.5.

Neither is fast enough to run on an event loop for every chunk without thought: the server
calls them in a worker thread (``asyncio.to_thread``), one call at a time per stream.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from ..constants import SAMPLE_RATE
from ..errors import ConfigError
from .formats import float_to_s16

__all__ = [
    "CONTAINER_FORMATS",
    "MAX_SPEED",
    "MIN_SPEED",
    "ContainerEncoder",
    "ContainerFormat",
    "TimeStretch",
]

Float32Array = npt.NDArray[np.float32]

MIN_SPEED = 0.25
MAX_SPEED = 4.0


@dataclass(frozen=True, slots=True)
class ContainerFormat:
    name: str  # OpenAI's response_format name
    container: str  # FFmpeg muxer
    codec: str  # FFmpeg encoder
    mime_type: str
    sample_rate: int  # what a decoder of the stream outputs
    bit_rate: int | None = None
    s16: bool = False  # fed our 16-bit samples (WAV/FLAC: the same samples as `pcm`)
    whole: bool = False  # bytes only at the end: the header states the length (FLAC)


CONTAINER_FORMATS: dict[str, ContainerFormat] = {
    f.name: f
    for f in (
        ContainerFormat("mp3", "mp3", "libmp3lame", "audio/mpeg", SAMPLE_RATE, 64_000),
        # Opus runs at 24 kHz inside; its decoders always output 48 kHz
        ContainerFormat("opus", "ogg", "libopus", "audio/ogg", 48_000, 32_000),
        ContainerFormat("aac", "adts", "aac", "audio/aac", SAMPLE_RATE, 64_000),
        ContainerFormat("flac", "flac", "flac", "audio/flac", SAMPLE_RATE, s16=True, whole=True),
        ContainerFormat("wav", "wav", "pcm_s16le", "audio/wav", SAMPLE_RATE, s16=True),
    )
}


def _av() -> Any:
    try:
        import av
    except ImportError as exc:  # pragma: no cover - a dependency of streamtts
        raise ConfigError(
            "mp3/opus/aac/flac/wav output and speed need PyAV: pip install av "
            "(a dependency of streamtts; reinstall it)"
        ) from exc
    return av


class _Sink:
    """The muxer's output: bytes collected until taken (not seekable: streaming containers)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: Any) -> int:
        b = bytes(data)
        self.parts.append(b)
        return len(b)

    def take(self) -> bytes:
        out = b"".join(self.parts)
        self.parts.clear()
        return out


class _WholeSink(io.BytesIO):
    """A seekable output (the muxer writes the header back at the end); taken only once done."""

    def __init__(self) -> None:
        super().__init__()
        self.done = False

    def take(self) -> bytes:
        return self.getvalue() if self.done else b""


class ContainerEncoder:
    """float32 mono chunks at ``input_rate`` -> the bytes of ``fmt``'s container, streamed
    (a ``whole`` format: all of them from :meth:`flush`)."""

    def __init__(self, fmt: ContainerFormat | str, input_rate: int = SAMPLE_RATE) -> None:
        av = _av()
        self.format = CONTAINER_FORMATS[fmt] if isinstance(fmt, str) else fmt
        self.input_rate = input_rate
        self._sink: _Sink | _WholeSink = _WholeSink() if self.format.whole else _Sink()
        options = {"fflags": "+bitexact", "flush_packets": "1"}
        if self.format.container == "ogg":
            options["page_duration"] = "20000"  # µs: a page per packet, not one per second
        self._container = av.open(self._sink, mode="w", format=self.format.container, options=options)
        self._stream = self._container.add_stream(self.format.codec, rate=input_rate, layout="mono")
        if self.format.bit_rate:
            self._stream.codec_context.bit_rate = self.format.bit_rate
        self._pts = 0
        self._done = False
        self.samples_in = 0

    def _frame(self, x: Float32Array) -> Any:
        av = _av()
        if self.format.s16:
            frame = av.AudioFrame.from_ndarray(float_to_s16(x)[None, :], format="s16", layout="mono")
        else:
            frame = av.AudioFrame.from_ndarray(x[None, :], format="flt", layout="mono")
        frame.sample_rate = self.input_rate
        frame.pts = self._pts
        frame.time_base = Fraction(1, self.input_rate)
        self._pts += x.shape[0]
        return frame

    def encode(self, pcm: npt.ArrayLike) -> bytes:
        """The container bytes the codec has ready after this chunk (may be b"")."""
        if self._done:
            raise RuntimeError("encode() after flush()")
        x = np.ascontiguousarray(pcm, dtype=np.float32).reshape(-1)
        if x.shape[0]:
            self.samples_in += x.shape[0]
            for packet in self._stream.encode(self._frame(x)):
                self._container.mux(packet)
        return self._sink.take()

    def flush(self) -> bytes:
        """Drain the codec, end the container; the last bytes (later calls: b"")."""
        if self._done:
            return b""
        self._done = True
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()
        if isinstance(self._sink, _WholeSink):
            self._sink.done = True
        return self._sink.take()

    def close(self) -> None:
        """Release the codec without finishing (an aborted stream)."""
        if not self._done:
            self._done = True
            self._container.close()


class TimeStretch:
    """Tempo x ``speed`` at the same pitch: FFmpeg's ``atempo`` over a streaming filter graph.

    ``push`` returns what the filter has ready (its window holds back some tens of ms);
    ``flush`` the rest. The output lasts ``input / speed`` to within a few ms.
    """

    def __init__(self, speed: float, rate: int = SAMPLE_RATE) -> None:
        if not (MIN_SPEED <= speed <= MAX_SPEED) or speed != speed:
            raise ValueError(f"speed must be in [{MIN_SPEED}, {MAX_SPEED}], got {speed}")
        av = _av()
        self.speed = speed
        self.rate = rate
        # atempo takes 0.5..100 per instance: below 0.5, two instances of sqrt(speed)
        tempos = [math.sqrt(speed)] * 2 if speed < 0.5 else [speed]
        g = av.filter.Graph()
        src = g.add_abuffer(
            format="flt", sample_rate=rate, layout="mono", time_base=Fraction(1, rate)
        )
        prev = src
        for t in tempos:
            node = g.add("atempo", f"{t:.6f}")
            prev.link_to(node)
            prev = node
        sink = g.add("abuffersink")
        prev.link_to(sink)
        g.configure()
        self._graph, self._src, self._sink = g, src, sink
        self._pts = 0
        self._done = False

    def push(self, pcm: npt.ArrayLike) -> Float32Array:
        x = np.ascontiguousarray(pcm, dtype=np.float32).reshape(-1)
        if x.shape[0] == 0 or self._done:
            return np.zeros(0, np.float32)
        av = _av()
        frame = av.AudioFrame.from_ndarray(x[None, :], format="flt", layout="mono")
        frame.sample_rate = self.rate
        frame.pts = self._pts
        frame.time_base = Fraction(1, self.rate)
        self._pts += x.shape[0]
        self._src.push(frame)
        return self._pull()

    def flush(self) -> Float32Array:
        if self._done:
            return np.zeros(0, np.float32)
        self._done = True
        self._src.push(None)
        return self._pull()

    def _pull(self) -> Float32Array:
        av = _av()
        out: list[Float32Array] = []
        while True:
            try:
                frame = self._sink.pull()
            except (BlockingIOError, EOFError, av.error.EOFError):
                break
            out.append(np.asarray(frame.to_ndarray(), dtype=np.float32).reshape(-1))
        return np.concatenate(out) if out else np.zeros(0, np.float32)
