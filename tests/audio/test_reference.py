"""Reference voice clips: formats, rates, channels, loudness, padding, errors, encoding."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from streamtts.audio.reference import (
    MAX_CHANNELS,
    MAX_REFERENCE_S,
    MAX_SAMPLE_RATE,
    MIN_REFERENCE_S,
    MIN_SAMPLE_RATE,
    encode_reference,
    load_reference,
    loudness_normalize,
)
from streamtts.codec import load_encoder
from streamtts.config import load_config
from streamtts.errors import InputError, ReferenceAudioError

SR = 24000
F = 1920


def _sine(
    sr: int, seconds: float, hz: float = 440.0, amp: float = 0.1, channels: int = 1
) -> np.ndarray:
    t = np.arange(int(round(sr * seconds))) / sr
    x = (amp * np.sin(2 * np.pi * hz * t)).astype(np.float32)
    if channels == 1:
        return x
    return np.stack([x] * channels, axis=1)


def _dbfs(x: np.ndarray) -> float:
    return float(20 * np.log10(np.sqrt(np.mean(np.square(x, dtype=np.float64)))))


def _peak_hz(x: np.ndarray) -> float:
    spec = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.fft.rfftfreq(len(x), 1 / SR)[int(np.argmax(spec))])


def _check(wav: np.ndarray, seconds: float) -> None:
    assert wav.dtype == np.float32 and wav.ndim == 1 and wav.flags.c_contiguous
    assert len(wav) % F == 0
    n = int(round(seconds * SR))
    assert n <= len(wav) < n + F + 8  # padded to the next frame (resampler may add a few samples)
    assert not wav[n + 8 :].any()  # the padding is zeros


@pytest.mark.parametrize(
    ("fmt", "subtype", "ext", "sr", "channels"),
    [
        ("WAV", "PCM_16", "wav", 16000, 1),
        ("WAV", "FLOAT", "wav", 24000, 2),
        ("FLAC", "PCM_16", "flac", 44100, 2),
        ("OGG", "VORBIS", "ogg", 48000, 1),
    ],
)
def test_formats_rates_and_channels(
    tmp_path: Path, fmt: str, subtype: str, ext: str, sr: int, channels: int
) -> None:
    path = tmp_path / f"ref.{ext}"
    sf.write(
        path, _sine(sr, 1.3, hz=440, amp=0.1, channels=channels), sr, format=fmt, subtype=subtype
    )
    wav = load_reference(path)
    _check(wav, 1.3)
    body = wav[: int(1.3 * SR)]
    assert abs(_peak_hz(body) - 440.0) < 3.0  # resampled, not re-pitched
    assert abs(_dbfs(body) - (-20.0)) < 0.3  # 0.1-amplitude sine is -23 dBFS: +3 dB reaches -20
    assert load_reference(str(path)).shape == wav.shape  # str paths too
    assert np.array_equal(load_reference(path.read_bytes()), wav)  # and the file's bytes


def test_stereo_is_mixed_down(tmp_path: Path) -> None:
    left = _sine(SR, 1.0, 300.0, 0.2)
    stereo = np.stack([left, np.zeros_like(left)], axis=1)
    path = tmp_path / "s.wav"
    sf.write(path, stereo, SR, subtype="FLOAT")
    mono = load_reference(path, sample_rate=SR)
    # the mix (left / 2) then normalised: 0.1 amplitude -> -23 dBFS -> +3 dB
    assert abs(_dbfs(mono[:SR]) - (-20.0)) < 0.1
    assert abs(_peak_hz(mono[:SR]) - 300.0) < 3.0


@pytest.mark.parametrize("layout", ["1d", "frames_channels", "channels_frames"])
def test_arrays_need_a_rate_and_may_be_multichannel(layout: str) -> None:
    x = _sine(16000, 0.8, 500.0, 0.1)
    arr = {"1d": x, "frames_channels": np.stack([x, x], 1), "channels_frames": np.stack([x, x], 0)}[
        layout
    ]
    wav = load_reference(arr, sample_rate=16000)
    _check(wav, 0.8)
    assert abs(_peak_hz(wav[: int(0.8 * SR)]) - 500.0) < 3.0


def test_int16_arrays_are_scaled() -> None:
    x = (_sine(SR, 1.0, 440.0, 0.1) * 32767).astype(np.int16)
    wav = load_reference(x, sample_rate=SR)
    assert abs(_dbfs(wav[:SR]) - (-20.0)) < 0.1


@pytest.mark.parametrize(
    ("amp_dbfs", "expected_dbfs"),
    [(-30.0, -27.0), (-10.0, -13.0), (-21.0, -20.0), (-18.5, -20.0), (-20.0, -20.0)],
)
def test_loudness_gain_is_clamped_to_3_db(amp_dbfs: float, expected_dbfs: float) -> None:
    amp = 10 ** (amp_dbfs / 20) * np.sqrt(2)  # sine RMS = amp / sqrt(2)
    x = _sine(SR, 1.0, 440.0, amp)
    assert abs(_dbfs(x) - amp_dbfs) < 0.01
    y = loudness_normalize(x)
    assert y.dtype == np.float32 and y.shape == x.shape
    assert abs(_dbfs(y) - expected_dbfs) < 0.01
    assert abs(_dbfs(load_reference(x, sample_rate=SR)[:SR]) - expected_dbfs) < 0.01
    assert (
        abs(_dbfs(loudness_normalize(x, target_dbfs=-16, max_gain_db=6)) - min(-16, amp_dbfs + 6))
        < 0.01
    )


def test_loudness_normalize_edge_cases() -> None:
    assert loudness_normalize(np.zeros(0, np.float32)).shape == (0,)
    assert not loudness_normalize(np.zeros(100, np.float32)).any()
    x = np.ones(10, np.float64)
    assert loudness_normalize(x).dtype == np.float32
    assert x[0] == 1.0  # input untouched


def test_padding_to_whole_frames() -> None:
    x = _sine(SR, 0.75, 440.0, 0.1)  # 18000 samples
    wav = load_reference(x, sample_rate=SR)
    assert len(wav) == 19200
    assert not wav[18000:].any()
    exact = load_reference(_sine(SR, 0.8, 440.0, 0.1), sample_rate=SR)  # 19200: no padding
    assert len(exact) == 19200 and exact[-1] != 0.0


# -- errors ----------------------------------------------------------------------------


def _err(source: object, sample_rate: int | None = None) -> str:
    with pytest.raises(ReferenceAudioError) as ei:
        load_reference(source, sample_rate)  # type: ignore[arg-type]
    assert isinstance(ei.value, InputError)  # a user error (HTTP 4xx), not an engine failure
    return str(ei.value)


def test_error_file_not_found(tmp_path: Path) -> None:
    msg = _err(tmp_path / "missing.wav")
    assert "missing.wav" in msg and "not found" in msg


def test_error_directory(tmp_path: Path) -> None:
    assert "not a file" in _err(tmp_path)


def test_error_corrupt_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.wav"
    path.write_bytes(b"RIFF\x00\x00\x00\x00WAVEgarbage" * 20)
    msg = _err(path)
    assert "bad.wav" in msg and "cannot read" in msg and "(" in msg  # soundfile's reason included
    assert "cannot read" in _err(b"definitely not audio" * 50)


def test_error_empty(tmp_path: Path) -> None:
    assert "empty" in _err(b"")
    path = tmp_path / "empty.wav"
    sf.write(path, np.zeros(0, np.float32), SR)
    msg = _err(path)
    assert "empty.wav" in msg and "empty" in msg
    assert "empty" in _err(np.zeros(0, np.float32), SR)


def test_error_too_short_and_too_long(tmp_path: Path) -> None:
    msg = _err(_sine(SR, MIN_REFERENCE_S * 0.6, amp=0.1), SR)
    assert "too short" in msg and f"{MIN_REFERENCE_S}" in msg
    path = tmp_path / "long.flac"
    sf.write(path, _sine(16000, MAX_REFERENCE_S + 1.0, amp=0.1), 16000)
    msg = _err(path)
    assert "long.flac" in msg and "too long" in msg and "31.0 s" in msg


def test_error_non_finite(tmp_path: Path) -> None:
    x = _sine(SR, 1.0, amp=0.1)
    x[100] = np.nan
    assert "non-finite" in _err(x, SR)
    path = tmp_path / "nan.wav"
    sf.write(path, x, SR, subtype="FLOAT")
    msg = _err(path)
    assert "nan.wav" in msg and "non-finite" in msg
    x[100] = np.inf
    assert "non-finite" in _err(x, SR)


def test_error_array_without_rate() -> None:
    assert "sample_rate" in _err(_sine(SR, 1.0, amp=0.1))


def test_error_bad_array_shapes_and_types() -> None:
    assert "shape" in _err(np.zeros((2, 3, 24000), np.float32), SR)
    assert "shape" in _err(np.zeros((100, 100), np.float32), SR)  # no axis looks like channels
    assert "unsupported sample type" in _err(np.zeros(24000, np.uint8), SR)
    assert "path, file bytes or a numpy array" in _err(12345)


def test_error_silent_clip() -> None:
    assert "silent" in _err(np.zeros(SR, np.float32), SR)


def test_error_rate_mismatch_for_file(tmp_path: Path) -> None:
    path = tmp_path / "r.wav"
    sf.write(path, _sine(16000, 1.0, amp=0.1), 16000)
    msg = _err(path, 24000)
    assert "16000 Hz" in msg and "24000" in msg
    assert load_reference(path, 16000).shape == (13 * F,)  # 1 s at 24 kHz -> 12.5 frames -> 13


# -- encoding --------------------------------------------------------------------------


def test_encode_reference_with_the_demo_encoder(demo_model_dir: Path) -> None:
    enc = load_encoder(load_config(demo_model_dir / "config.yaml"))
    wav = load_reference(_sine(44100, 2.0, 330.0, 0.1), sample_rate=44100)
    codes = encode_reference(enc, wav)
    assert codes.shape == (len(wav) // F, 32) and codes.dtype == np.int64
    assert codes.min() >= 0 and codes.max() < 1024
    with pytest.raises(ReferenceAudioError, match="multiple of 1920"):
        encode_reference(enc, wav[:-5])
    with pytest.raises(ReferenceAudioError, match="1-D"):
        encode_reference(enc, wav.reshape(1, -1))


# -- untrusted files: the header is checked first, decoding is bounded ----------------------------


def _bomb(known_length: bool) -> bytes:
    from benchmarks._common import flac_bomb

    return bytes(flac_bomb(2 << 20, known_length))  # 2 MiB of FLAC: ~3 hours of 48 kHz stereo


def _peak_bytes(source: bytes) -> tuple[int, str]:
    """Peak traced allocation (numpy's buffers included) while loading ``source`` is refused,
    and the error's message."""
    import tracemalloc

    tracemalloc.start()
    try:
        msg = _err(source)
        return tracemalloc.get_traced_memory()[1], msg
    finally:
        tracemalloc.stop()


def test_a_long_file_is_refused_from_its_header_before_decoding() -> None:
    data = _bomb(known_length=True)
    peak, msg = _peak_bytes(data)
    assert "too long" in msg and "by its FLAC/PCM_16 header" in msg
    assert peak < 2 << 20, f"{peak} bytes allocated: it was decoded"  # decoded: ~4 GB


def test_decoding_stops_past_the_limit_when_the_header_gives_no_length() -> None:
    data = _bomb(known_length=False)
    assert sf.info(io.BytesIO(data)).frames == (1 << 63) - 1  # libsndfile: length unknown
    peak, msg = _peak_bytes(data)
    assert "too long" in msg and "header did not say" in msg
    bound = int(MAX_REFERENCE_S * 48000) * 4  # one 30 s mono float32 buffer
    assert peak < bound + (2 << 20), f"{peak} bytes allocated for a {bound}-byte bound"


def test_rate_and_channel_limits_from_the_header(tmp_path: Path) -> None:
    path = tmp_path / "nine.wav"
    sf.write(path, np.zeros((SR, 9), np.float32) + 0.1, SR)
    msg = _err(path)
    assert "9 channels" in msg and f"at most {MAX_CHANNELS}" in msg
    path = tmp_path / "low.wav"
    sf.write(path, _sine(4000, 1.0, 300.0), 4000)
    msg = _err(path)
    assert "4000 Hz" in msg and f"{MIN_SAMPLE_RATE} to {MAX_SAMPLE_RATE}" in msg
    assert "sample rate" in _err(_sine(SR, 1.0), MAX_SAMPLE_RATE * 2)  # arrays too
