"""streamtts.audio.formats: formats, s16/mu-law conversion, streaming resampling."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import soundfile as sf
import soxr
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtts.audio.formats import (
    FORMATS,
    StreamEncoder,
    decode_audio,
    float_to_s16,
    get_format,
    s16_to_ulaw,
    ulaw_to_s16,
    wav_header,
)


def tone(n: int, hz: float = 440.0, rate: int = 24000, amp: float = 0.5) -> np.ndarray:
    return (amp * np.sin(2 * np.pi * hz * np.arange(n) / rate)).astype(np.float32)


def test_formats_and_aliases() -> None:
    assert set(FORMATS) == {
        "pcm_s16le_24000", "pcm_f32le_24000", "pcm_s16le_16000", "pcm_s16le_8000", "ulaw_8000",
        "pcm_s16le_22050", "pcm_s16le_32000", "pcm_s16le_44100", "pcm_s16le_48000",
    }  # fmt: skip
    assert get_format("pcm_48000").sample_rate == 48000
    assert get_format("pcm_s16le").name == "pcm_s16le_24000"
    assert get_format("pcm").name == "pcm_s16le_24000"
    assert get_format("pcm_f32le").sample_rate == 24000
    assert get_format("ulaw").name == "ulaw_8000"
    assert get_format("ulaw_8000").bytes_per_second == 8000
    with pytest.raises(ValueError, match="unknown audio format 'mp3'.*pcm_s16le_24000"):
        get_format("mp3")


def test_s16_rounds_and_clips_without_wrapping() -> None:
    x = np.array([0.0, 1.0, -1.0, 1.5, -1.5, 0.5, 1e-6, np.float32(1 / 32767) * 0.6], np.float32)
    assert float_to_s16(x).tolist() == [0, 32767, -32767, 32767, -32768, 16384, 0, 1]


def test_ulaw_known_values() -> None:
    assert s16_to_ulaw(np.array([0, 32767, -32768, -1], np.int16)).tolist() == [0xFF, 0x80, 0x00, 0x7E]
    assert ulaw_to_s16(np.array([0xFF, 0x80, 0x00], np.uint8)).tolist() == [0, 32124, -32124]


def test_ulaw_is_bit_exact_with_audioop() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        audioop = pytest.importorskip("audioop", reason="audioop was removed in Python 3.13")
    x = np.arange(-32768, 32768, dtype=np.int16)
    assert np.frombuffer(audioop.lin2ulaw(x.tobytes(), 2), np.uint8).tolist() == s16_to_ulaw(x).tolist()
    u = np.arange(256, dtype=np.uint8)
    assert np.frombuffer(audioop.ulaw2lin(u.tobytes(), 2), np.int16).tolist() == ulaw_to_s16(u).tolist()


def test_ulaw_round_trip_error_is_small_relative() -> None:
    x = np.arange(-32768, 32768, 7, dtype=np.int16)
    y = ulaw_to_s16(s16_to_ulaw(x)).astype(np.int32)
    err = np.abs(y - x.astype(np.int32))
    assert np.all(err <= np.maximum(16, np.abs(x.astype(np.int32)) // 16))


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_encode_decode_each_format(name: str) -> None:
    fmt = get_format(name)
    x = tone(24000)
    enc = StreamEncoder(fmt)
    data = b"".join(enc.encode(x[i : i + 1920]) for i in range(0, x.size, 1920)) + enc.flush()
    assert len(data) == fmt.bytes_per_second  # one second in, one second out
    y = decode_audio(data, fmt)
    assert y.dtype == np.float32 and y.size == fmt.sample_rate
    ref = x if fmt.sample_rate == 24000 else soxr.resample(x, 24000, fmt.sample_rate, quality="HQ")
    tol = {"pcm_f32le": 1e-7, "pcm_s16le": 1e-4, "ulaw": 0.02}[fmt.encoding]
    mid = slice(fmt.sample_rate // 10, -fmt.sample_rate // 10)  # away from the filter's edges
    assert np.max(np.abs(y[mid] - ref[mid])) < tol + (2e-3 if fmt.sample_rate != 24000 else 0)


def test_f32_and_s16_pass_through_are_exact() -> None:
    x = tone(5000)
    enc = StreamEncoder(get_format("pcm_f32le_24000"))
    assert enc.encode(x) == x.astype("<f4").tobytes()
    enc = StreamEncoder(get_format("pcm_s16le_24000"))
    assert enc.encode(x) == float_to_s16(x).astype("<i2").tobytes()
    assert enc.flush() == b""


@settings(max_examples=25, deadline=None)
@given(cuts=st.lists(st.integers(1, 23999), max_size=30), rate=st.sampled_from([16000, 8000]))
def test_streaming_resampler_has_no_seams(cuts: list[int], rate: int) -> None:
    """Chunked resampling equals resampling the whole signal at once: no seams at chunk edges."""
    x = tone(24000, hz=1000.0) + tone(24000, hz=3100.0, amp=0.2)
    fmt = get_format(f"pcm_s16le_{rate}")
    whole = StreamEncoder(fmt)
    ref = whole.encode(x) + whole.flush()
    enc = StreamEncoder(fmt)
    parts = []
    prev = 0
    for c in sorted(set(cuts)) + [x.size]:
        parts.append(enc.encode(x[prev:c]))
        prev = c
    parts.append(enc.flush())
    got = np.frombuffer(b"".join(parts), np.int16).astype(np.int32)
    want = np.frombuffer(ref, np.int16).astype(np.int32)
    assert got.size == want.size == rate
    assert np.max(np.abs(got - want)) <= 1  # float rounding only


def test_flush_is_idempotent_and_empty_chunks_are_fine() -> None:
    enc = StreamEncoder(get_format("ulaw_8000"))
    assert enc.encode(np.zeros(0, np.float32)) == b""
    enc.encode(tone(2400))
    tail = enc.flush()
    assert enc.flush() == b""
    assert enc.samples_out == 800 and len(tail) > 0


@pytest.mark.parametrize("encoding,subtype", [("pcm_s16le", "PCM_16"), ("pcm_f32le", "FLOAT"), ("ulaw", "ULAW")])
def test_wav_header(encoding: str, subtype: str) -> None:
    fmt = next(f for f in FORMATS.values() if f.encoding == encoding)
    x = tone(fmt.sample_rate // 10, rate=fmt.sample_rate)
    data = StreamEncoder(fmt).encode(x) if fmt.sample_rate == 24000 else b""
    if not data:  # ulaw: encode at its own rate directly
        data = s16_to_ulaw(float_to_s16(x)).tobytes()
    blob = wav_header(fmt.sample_rate, fmt.encoding, len(data)) + data  # type: ignore[arg-type]
    info = sf.info(io.BytesIO(blob))
    assert (info.samplerate, info.channels, info.subtype, info.frames) == (fmt.sample_rate, 1, subtype, x.size)
    # streaming header: unknown length, still readable
    y, sr = sf.read(io.BytesIO(wav_header(24000) + float_to_s16(x).tobytes()), dtype="float32")
    assert sr == 24000 and y.size == x.size


def test_flac_comes_whole_with_its_length_for_libsndfile_and_ffmpeg() -> None:
    """A streamed FLAC states no length, which libsndfile cannot read: the encoder holds the
    file until flush and FFmpeg writes the true length (and MD5) back into STREAMINFO."""
    import av

    from streamtts.audio.encoders import ContainerEncoder

    x = tone(24000 * 3 + 123)
    enc = ContainerEncoder("flac")
    parts = [enc.encode(x[i : i + 1920]) for i in range(0, x.size, 1920)]
    assert parts == [b""] * len(parts)  # nothing before the end
    data = enc.flush()
    assert enc.flush() == b""
    want = float_to_s16(x)
    assert sf.info(io.BytesIO(data)).frames == x.size
    y, sr = sf.read(io.BytesIO(data), dtype="int16")
    assert sr == 24000 and np.array_equal(y, want)
    with av.open(io.BytesIO(data)) as c:
        z = np.concatenate([f.to_ndarray().reshape(-1) for f in c.decode(audio=0)])
    assert np.array_equal(z, want)
