"""Output audio formats: streaming resampling and sample encoding.

The engine produces float32 mono at 24 kHz. A network client asks for one of
:data:`FORMATS`; :class:`StreamEncoder` turns the session's chunks into that
format as they arrive:

* resampling with ``soxr.ResampleStream``, which keeps its filter state from
  one chunk to the next, so chunk edges leave no seams (resampling each chunk
  on its own would click at every edge). The resampler delays its output by
  its filter length (a few ms); :meth:`StreamEncoder.flush` returns the tail;
* ``pcm_s16le``: ``round(x * 32767)`` clipped to [-32768, 32767];
* ``ulaw``: G.711 mu-law of that 16-bit value, bit-exact with the old
  ``audioop.lin2ulaw`` (gone in Python 3.13), written with NumPy.

One encoder serves a whole session, across segment joins, so the resampler
sees one continuous signal.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from ..constants import SAMPLE_RATE

__all__ = [
    "FORMATS",
    "SAMPLE_RATE",
    "AudioFormat",
    "StreamEncoder",
    "decode_audio",
    "float_to_s16",
    "get_format",
    "s16_to_ulaw",
    "ulaw_to_s16",
    "wav_header",
]

Encoding = Literal["pcm_s16le", "pcm_f32le", "ulaw"]
Float32Array = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class AudioFormat:
    name: str
    encoding: Encoding
    sample_rate: int

    @property
    def bytes_per_sample(self) -> int:
        return {"pcm_s16le": 2, "pcm_f32le": 4, "ulaw": 1}[self.encoding]

    @property
    def bytes_per_second(self) -> int:
        return self.bytes_per_sample * self.sample_rate

    @property
    def mime_type(self) -> str:
        if self.encoding == "pcm_s16le":
            return f"audio/L16;rate={self.sample_rate};channels=1"
        if self.encoding == "ulaw":
            return f"audio/PCMU;rate={self.sample_rate}"
        return "application/octet-stream"


FORMATS: dict[str, AudioFormat] = {
    f.name: f
    for f in (
        AudioFormat("pcm_s16le_24000", "pcm_s16le", 24000),
        AudioFormat("pcm_f32le_24000", "pcm_f32le", 24000),
        AudioFormat("pcm_s16le_16000", "pcm_s16le", 16000),
        AudioFormat("pcm_s16le_8000", "pcm_s16le", 8000),
        # the other rates voice-agent pipelines run at (Pipecat, LiveKit, WebRTC)
        AudioFormat("pcm_s16le_22050", "pcm_s16le", 22050),
        AudioFormat("pcm_s16le_32000", "pcm_s16le", 32000),
        AudioFormat("pcm_s16le_44100", "pcm_s16le", 44100),
        AudioFormat("pcm_s16le_48000", "pcm_s16le", 48000),
        AudioFormat("ulaw_8000", "ulaw", 8000),
    )
}
# Short names a client may use; the `ready` message always echoes the canonical one.
ALIASES = {
    "pcm_s16le": "pcm_s16le_24000",
    "pcm_f32le": "pcm_f32le_24000",
    "pcm": "pcm_s16le_24000",
    "pcm_24000": "pcm_s16le_24000",
    "pcm_16000": "pcm_s16le_16000",
    "pcm_8000": "pcm_s16le_8000",
    "pcm_22050": "pcm_s16le_22050",
    "pcm_32000": "pcm_s16le_32000",
    "pcm_44100": "pcm_s16le_44100",
    "pcm_48000": "pcm_s16le_48000",
    "ulaw": "ulaw_8000",
    "mulaw_8000": "ulaw_8000",
}


def get_format(name: str) -> AudioFormat:
    """The format called ``name`` (canonical or alias); ValueError naming the valid ones."""
    fmt = FORMATS.get(ALIASES.get(name, name))
    if fmt is None:
        names = ", ".join([*FORMATS, *ALIASES])
        raise ValueError(f"unknown audio format {name!r}; use one of: {names}")
    return fmt


# -- sample conversions ----------------------------------------------------------------------


def float_to_s16(x: npt.ArrayLike) -> npt.NDArray[np.int16]:
    """float in [-1, 1] -> int16, rounded, out-of-range values clipped (no wrap-around)."""
    a = np.asarray(x, dtype=np.float32)
    out: npt.NDArray[np.int16] = np.clip(np.rint(a * np.float32(32767.0)), -32768, 32767).astype(
        np.int16
    )
    return out


_ULAW_SEG_END = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF], dtype=np.int32)


def s16_to_ulaw(s16: npt.ArrayLike) -> npt.NDArray[np.uint8]:
    """G.711 mu-law bytes of 16-bit samples (bit-exact with ``audioop.lin2ulaw(b, 2)``)."""
    x = np.asarray(s16, dtype=np.int16).astype(np.int32) >> 2  # 14-bit magnitude domain
    mask = np.where(x < 0, 0x7F, 0xFF)
    mag = np.minimum(np.abs(x), 8159) + 33  # clip, then add the bias (0x84 >> 2)
    seg = np.searchsorted(_ULAW_SEG_END, mag, side="left")
    uval = (np.minimum(seg, 7) << 4) | ((mag >> (np.minimum(seg, 7) + 1)) & 0xF)
    uval = np.where(seg >= 8, 0x7F, uval)
    return (uval ^ mask).astype(np.uint8)


def _ulaw_table() -> npt.NDArray[np.int16]:
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    t = (((u & 0x0F) << 3) + 0x84) << ((u & 0x70) >> 4)
    return np.where(u & 0x80, 0x84 - t, t - 0x84).astype(np.int16)


_ULAW_TO_S16 = _ulaw_table()


def ulaw_to_s16(u: npt.ArrayLike) -> npt.NDArray[np.int16]:
    """Mu-law bytes -> 16-bit samples (as ``audioop.ulaw2lin(b, 2)``)."""
    out: npt.NDArray[np.int16] = _ULAW_TO_S16[np.asarray(u, dtype=np.uint8)]
    return out


def decode_audio(data: bytes, fmt: AudioFormat) -> Float32Array:
    """Bytes of ``fmt`` -> float32 samples in [-1, 1] (clients, tests)."""
    if fmt.encoding == "pcm_f32le":
        return np.frombuffer(data, dtype="<f4").astype(np.float32)
    if fmt.encoding == "pcm_s16le":
        return (np.frombuffer(data, dtype="<i2").astype(np.float32) / np.float32(32767.0)).astype(
            np.float32
        )
    return (
        ulaw_to_s16(np.frombuffer(data, dtype=np.uint8)).astype(np.float32) / np.float32(32767.0)
    ).astype(np.float32)


def _encode_samples(x: Float32Array, fmt: AudioFormat) -> bytes:
    if fmt.encoding == "pcm_f32le":
        return x.astype("<f4", copy=False).tobytes()
    s16 = float_to_s16(x)
    if fmt.encoding == "pcm_s16le":
        return s16.astype("<i2", copy=False).tobytes()
    return s16_to_ulaw(s16).tobytes()


def wav_header(
    sample_rate: int, encoding: Encoding = "pcm_s16le", data_bytes: int | None = None
) -> bytes:
    """A RIFF/WAVE header; ``data_bytes=None`` = unknown length (streaming: sizes 0xFFFFFFFF)."""
    tag, width = {"pcm_s16le": (1, 2), "pcm_f32le": (3, 4), "ulaw": (7, 1)}[encoding]
    size = 0xFFFFFFFF if data_bytes is None else data_bytes
    riff = 0xFFFFFFFF if data_bytes is None else 36 + data_bytes
    return (
        b"RIFF"
        + struct.pack("<I", riff)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, tag, 1, sample_rate, sample_rate * width, width, 8 * width)
        + b"data"
        + struct.pack("<I", size)
    )


class StreamResampler:
    """float32 mono chunks from one rate to another, as one continuous signal.

    ``soxr.ResampleStream`` keeps its filter state across chunks, so chunk edges leave no
    seams. ``push`` may return fewer samples than it was given (the filter's delay);
    ``flush`` returns the rest once, at the end. Equal rates pass samples through.
    """

    def __init__(self, input_rate: int, output_rate: int, quality: str = "HQ") -> None:
        self.input_rate = input_rate
        self.output_rate = output_rate
        self._soxr: Any = None
        if output_rate != input_rate:
            import soxr

            self._soxr = soxr.ResampleStream(input_rate, output_rate, 1, dtype="float32", quality=quality)
        self._flushed = False

    @property
    def active(self) -> bool:
        return self._soxr is not None

    def push(self, pcm: npt.ArrayLike) -> Float32Array:
        x = np.ascontiguousarray(pcm, dtype=np.float32).reshape(-1)
        if self._soxr is None or x.shape[0] == 0:
            return x
        return np.asarray(self._soxr.resample_chunk(x), dtype=np.float32)

    def flush(self) -> Float32Array:
        """The filter's tail; later calls (and equal rates) return nothing."""
        if self._soxr is None or self._flushed:
            return np.zeros(0, np.float32)
        self._flushed = True
        return np.asarray(self._soxr.resample_chunk(np.zeros(0, np.float32), last=True), dtype=np.float32)


class StreamEncoder:
    """float32 chunks at ``input_rate`` -> bytes of ``fmt``, one continuous stream.

    ``encode`` may return fewer samples than it was given (the resampler's
    delay); ``flush`` returns the rest at the end of the stream.
    """

    def __init__(self, fmt: AudioFormat, input_rate: int = SAMPLE_RATE, quality: str = "HQ") -> None:
        self.format = fmt
        self.input_rate = input_rate
        self._resampler = StreamResampler(input_rate, fmt.sample_rate, quality)
        self.samples_in = 0
        self.samples_out = 0

    def encode(self, pcm: npt.ArrayLike) -> bytes:
        x = np.ascontiguousarray(pcm, dtype=np.float32).reshape(-1)
        self.samples_in += x.shape[0]
        x = self._resampler.push(x)
        self.samples_out += x.shape[0]
        return _encode_samples(x, self.format) if x.shape[0] else b""

    def flush(self) -> bytes:
        """The resampler's tail; call once at the end of the stream (later calls return b"")."""
        x = self._resampler.flush()
        self.samples_out += x.shape[0]
        return _encode_samples(x, self.format) if x.shape[0] else b""


# -- audio files (synth --out, speak --save) -------------------------------------------------


def file_extensions() -> list[str]:
    """Extensions of the audio files libsndfile can write without more options (``.wav``,
    ``.flac``, ``.ogg``, ``.mp3`` where the library has it, ...), most common first."""
    import soundfile as sf

    common = ["WAV", "FLAC", "OGG", "MP3"]
    names = sorted(sf.available_formats(), key=lambda f: (f not in common, common.index(f) if f in common else 0, f))
    return ["." + f.lower() for f in names if sf.default_subtype(f) is not None]


def file_subtype(path: str) -> str | None:
    """The sample type a file is written with: 16-bit PCM for .wav (what players expect),
    libsndfile's default for the others."""
    return "PCM_16" if path.lower().endswith(".wav") else None
