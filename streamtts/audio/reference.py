"""Reference voice clips: load, convert and encode (contract section 3).

The codec encoder expects what the official pipeline feeds it: mono float32
at 24 kHz, loudness-normalised to -20 dBFS RMS with the gain clamped to
+-3 dB, zero-padded to a whole number of 1920-sample frames. Everything a
user can get wrong about a clip is reported as :class:`ReferenceAudioError`
naming the clip and the problem, before the encoder sees it.

Length limits (of the clip as given, before padding):

- at least ``MIN_REFERENCE_S`` = 0.5 s: a few frames carry too little of a
  voice to clone, and are almost always a mistake (a truncated upload);
- at most ``MAX_REFERENCE_S`` = 30 s: a clip of T frames adds T + 33 prompt
  rows (375 frames -> 408 rows at 30 s), which must leave room in ``n_ctx``
  for the text and the generated speech; longer clips also do not clone
  better.

Files are untrusted input (the server decodes uploads): a few hundred KB of
FLAC can hold hours of audio. The header (rate, channels, length) is checked
before any sample is decoded, and decoding reads blockwise into a buffer of
``MAX_REFERENCE_S`` of mono samples, stopping one block past it, so a header
that lies about the length costs no more memory than a 30 s clip.
"""

from __future__ import annotations

import io
import logging
from pathlib import Path
from typing import Protocol

import numpy as np

from ..constants import FRAME_SAMPLES, SAMPLE_RATE
from ..errors import ReferenceAudioError


class _Encoder(Protocol):  # what codec.AudioEncoder offers; audio/ sits beside codec/, not above it
    def encode(self, wav: np.ndarray) -> np.ndarray: ...

log = logging.getLogger(__name__)

MIN_REFERENCE_S = 0.5
MAX_REFERENCE_S = 30.0
MAX_CHANNELS = 8
MIN_SAMPLE_RATE = 8000  # below this a clip carries too little of a voice (telephone speech is 8 kHz)
MAX_SAMPLE_RATE = 192_000  # bounds the decoded size of a 30 s clip
_BLOCK_FRAMES = 1 << 15  # frames decoded per read (x channels x 4 bytes)
_UNKNOWN_FRAMES = (1 << 63) - 1  # libsndfile's SF_COUNT_MAX: a stream whose header has no length
TARGET_DBFS = -20.0
MAX_GAIN_DB = 3.0

ReferenceSource = str | Path | bytes | bytearray | memoryview | np.ndarray


def loudness_normalize(
    wav: np.ndarray, target_dbfs: float = TARGET_DBFS, max_gain_db: float = MAX_GAIN_DB
) -> np.ndarray:
    """Scale ``wav`` towards ``target_dbfs`` RMS, the gain clamped to +-``max_gain_db``.

    The clamp keeps quiet or loud clips close to how they were recorded (a
    whisper is not turned into a shout). Returns a new float32 array.
    """
    x = np.asarray(wav, dtype=np.float32)
    if x.size == 0:
        return x.copy()
    rms = float(np.sqrt(np.mean(np.square(x, dtype=np.float64)) + 1e-9))
    gain_db = min(max(target_dbfs - 20.0 * np.log10(rms), -max_gain_db), max_gain_db)
    return (x * np.float32(10.0 ** (gain_db / 20.0))).astype(np.float32, copy=False)


def _describe(source: object) -> str:
    if isinstance(source, (str, Path)):
        return str(source)
    if isinstance(source, np.ndarray):
        return f"array {source.shape} {source.dtype}"
    return (
        f"{len(source)} bytes of audio"
        if isinstance(source, (bytes, bytearray, memoryview))
        else "audio"
    )


def _read_encoded(
    source: str | Path | bytes | bytearray | memoryview, name: str
) -> tuple[np.ndarray, int, int]:
    """Mono float32 samples, sample rate and channel count of an audio file.

    The header is checked first; decoding is bounded (see the module doc).
    """
    import soundfile as sf

    if isinstance(source, (str, Path)):
        path = Path(source).expanduser()
        if not path.exists():
            raise ReferenceAudioError(f"reference audio {path}: file not found")
        if not path.is_file():
            raise ReferenceAudioError(f"reference audio {path}: not a file")
        target: object = str(path)
    else:
        if len(source) == 0:
            raise ReferenceAudioError("reference audio: empty (0 bytes)")
        target = io.BytesIO(source if isinstance(source, bytes) else bytes(source))  # bytes: no copy
    try:
        with sf.SoundFile(target) as f:
            _check_header(f.samplerate, f.channels, f.frames, name, f"{f.format}/{f.subtype}")
            return _decode_bounded(f, name), int(f.samplerate), int(f.channels)
    except ReferenceAudioError:
        raise
    except (sf.SoundFileError, RuntimeError, TypeError, ValueError) as exc:
        # libsndfile's own words: str(exc) would name the in-memory file by its repr
        reason = getattr(exc, "error_string", "") or str(exc)
        raise ReferenceAudioError(
            f"reference audio {name}: cannot read it as wav/flac/ogg audio ({reason.rstrip('.')})"
        ) from exc


def _check_header(sr: int, channels: int, frames: int, name: str, fmt: str = "") -> None:
    """Refuse what the header alone (``fmt``: its format) shows to be unusable, before decoding."""
    what = f"{fmt} " if fmt else ""
    if not MIN_SAMPLE_RATE <= sr <= MAX_SAMPLE_RATE:
        raise ReferenceAudioError(
            f"reference audio {name}: {what}at {sr} Hz; the sample rate must be "
            f"{MIN_SAMPLE_RATE} to {MAX_SAMPLE_RATE} Hz"
        )
    if not 1 <= channels <= MAX_CHANNELS:
        raise ReferenceAudioError(
            f"reference audio {name}: {what}with {channels} channels; at most {MAX_CHANNELS}"
        )
    if frames != _UNKNOWN_FRAMES and frames / sr > MAX_REFERENCE_S:
        said = f" by its {fmt} header" if fmt else ""
        raise ReferenceAudioError(
            f"reference audio {name}: too long ({frames / sr:.1f} s{said}; at most "
            f"{MAX_REFERENCE_S:.0f} s, trim it to a few seconds of clean speech)"
        )


def _decode_bounded(f: object, name: str) -> np.ndarray:
    """Decode to mono into a buffer of MAX_REFERENCE_S (+1 sample: more = too long)."""
    import soundfile as sf

    assert isinstance(f, sf.SoundFile)
    limit = int(MAX_REFERENCE_S * f.samplerate) + 1
    mono = np.empty(limit, dtype=np.float32)
    block = np.empty((_BLOCK_FRAMES, f.channels), dtype=np.float32)
    n = 0
    while n < limit:
        got = f.buffer_read_into(block, dtype="float32")
        if got == 0:
            break
        take = min(got, limit - n)
        np.mean(block[:take], axis=1, dtype=np.float32, out=mono[n : n + take])
        n += take
    if n >= limit:
        raise ReferenceAudioError(
            f"reference audio {name}: too long (more than {MAX_REFERENCE_S:.0f} s of audio, "
            "which its header did not say; trim it to a few seconds of clean speech)"
        )
    return mono[:n]


def _array_frames_channels(x: np.ndarray, name: str) -> np.ndarray:
    """1-D -> (N, 1); 2-D -> (N, C), accepting (C, N) when the first axis is the short one."""
    if x.ndim == 1:
        return x.reshape(-1, 1)
    if x.ndim == 2:
        if x.shape[1] <= MAX_CHANNELS and x.shape[1] <= x.shape[0]:
            return x
        if x.shape[0] <= MAX_CHANNELS:
            return x.T
    raise ReferenceAudioError(
        f"reference audio {name}: expected a 1-D array or (samples, channels), got shape {x.shape}"
    )


def _as_float(x: np.ndarray, name: str) -> np.ndarray:
    if np.issubdtype(x.dtype, np.floating):
        return x.astype(np.float32, copy=False)
    if x.dtype == np.int16:
        return (x / 32768.0).astype(np.float32)
    if x.dtype == np.int32:
        return (x / 2147483648.0).astype(np.float32)
    raise ReferenceAudioError(
        f"reference audio {name}: unsupported sample type {x.dtype} (use float, int16 or int32)"
    )


def load_clip(source: ReferenceSource, sample_rate: int | None = None) -> np.ndarray:
    """A reference clip checked and as mono float32 at 24 kHz, not yet normalised or padded.

    ``source`` is a path or the bytes of a wav/flac/ogg file (any rate, mono or
    multichannel), or an array of samples, which then needs ``sample_rate``.
    For files, ``sample_rate`` may be given to assert the file's rate.
    """
    name = _describe(source)
    if isinstance(source, np.ndarray):
        if sample_rate is None:
            raise ReferenceAudioError(f"reference audio {name}: an array needs its sample_rate")
        data = _as_float(_array_frames_channels(source, name), name)
        sr, channels = int(sample_rate), data.shape[1]
        _check_header(sr, channels, data.shape[0], name)
        mono = data.mean(axis=1, dtype=np.float32) if channels > 1 else data[:, 0]
    elif isinstance(source, (str, Path, bytes, bytearray, memoryview)):
        mono, sr, channels = _read_encoded(source, name)
        if sample_rate is not None and int(sample_rate) != sr:
            raise ReferenceAudioError(
                f"reference audio {name}: the file is {sr} Hz, not {sample_rate} Hz"
            )
    else:
        raise ReferenceAudioError(
            f"reference audio must be a path, file bytes or a numpy array, got {type(source).__name__}"
        )
    n = mono.shape[0]
    if n == 0:
        raise ReferenceAudioError(f"reference audio {name}: empty (no samples)")
    if not np.all(np.isfinite(mono)):  # a NaN or inf in any channel survives the mix-down
        raise ReferenceAudioError(f"reference audio {name}: has non-finite samples (NaN or inf)")
    seconds = n / sr
    if seconds < MIN_REFERENCE_S:
        raise ReferenceAudioError(
            f"reference audio {name}: too short ({seconds:.2f} s; at least {MIN_REFERENCE_S} s needed)"
        )
    if float(np.max(np.abs(mono))) < 1e-6:
        raise ReferenceAudioError(f"reference audio {name}: silent")
    if sr != SAMPLE_RATE:
        import soxr

        mono = soxr.resample(mono, sr, SAMPLE_RATE, quality="HQ").astype(np.float32, copy=False)
    log.debug("reference %s: %.2f s at %d Hz, %d channel(s)", name, seconds, sr, channels)
    return np.ascontiguousarray(mono, dtype=np.float32)


def encoder_input(clip: np.ndarray) -> np.ndarray:
    """A :func:`load_clip` clip (or several joined end to end) as the encoder wants it:
    loudness-normalised, zero-padded to whole frames (what the processor's encode does)."""
    wav = loudness_normalize(clip)
    pad = -wav.shape[0] % FRAME_SAMPLES
    if pad:
        wav = np.concatenate([wav, np.zeros(pad, dtype=np.float32)])
    return np.ascontiguousarray(wav, dtype=np.float32)


def load_reference(source: ReferenceSource, sample_rate: int | None = None) -> np.ndarray:
    """A reference clip as the encoder wants it: float32 mono 24 kHz, normalised, padded
    (:func:`load_clip`, then :func:`encoder_input`)."""
    return encoder_input(load_clip(source, sample_rate))


def encode_reference(encoder: _Encoder, wav: np.ndarray) -> np.ndarray:
    """Encode a :func:`load_reference` waveform -> (T, n_vq) int64 codes, T = len(wav) / 1920."""
    if wav.ndim != 1 or wav.shape[0] == 0 or wav.shape[0] % FRAME_SAMPLES:
        raise ReferenceAudioError(
            f"reference waveform must be 1-D with a positive multiple of {FRAME_SAMPLES} samples, "
            f"got shape {wav.shape} (use load_reference)"
        )
    codes = np.asarray(encoder.encode(wav))  # a CodecError is the codec's fault: not wrapped
    if codes.ndim != 2 or codes.shape[0] < 1:
        raise ReferenceAudioError(
            f"reference audio: the encoder returned codes of shape {codes.shape}"
        )
    return codes.astype(np.int64, copy=False)
