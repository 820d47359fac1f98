"""Tests for streamtts.audio.playback.

The playback tests run the real Player, ring buffer and audio callback against
ClockedOutputStream, a sound-card stand-in clocked in real time, so they take
real time (a few seconds in all). Device handling is tested against fake
``sounddevice`` modules, so no sound card or PortAudio is needed.
"""

from __future__ import annotations

import asyncio
import importlib.abc
import importlib.machinery
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import soundfile as sf
import soxr
from hypothesis import given, settings
from hypothesis import strategies as st

import streamtts.audio.playback as player_mod
from streamtts.audio.clocked import ClockedOutputStream
from streamtts.audio.devices import (
    NO_DEVICE_MESSAGE,
    list_devices,
    resolve_output_device,
    sounddevice_stream,
)
from streamtts.audio.playback import (
    PlaybackReport,
    Player,
    RingBuffer,
    _Playback,
    play,
)
from streamtts.errors import PlaybackError, StreamTTSError

RATE = 24_000
FRAME = 1920  # samples per codec frame (80 ms)


# -- helpers ------------------------------------------------------------------------


class Factory:
    """A stream_factory that builds ClockedOutputStreams and keeps them for inspection."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.streams: list[ClockedOutputStream] = []

    def __call__(self, *, samplerate: int, blocksize: int, device: Any, callback: Any) -> Any:
        stream = ClockedOutputStream(
            samplerate=samplerate,
            blocksize=blocksize,
            device=device,
            callback=callback,
            **self.kwargs,
        )
        self.streams.append(stream)
        return stream

    @property
    def stream(self) -> ClockedOutputStream:
        assert len(self.streams) == 1
        return self.streams[0]


def noise_chunks(frames: Sequence[int], seed: int = 0) -> list[np.ndarray]:
    """Chunks of non-zero samples, so inserted silence can't hide among them."""
    rng = np.random.default_rng(seed)
    out = []
    for n in frames:
        x = rng.uniform(0.05, 0.5, n * FRAME) * rng.choice([-1.0, 1.0], n * FRAME)
        out.append(x.astype(np.float32))
    return out


async def paced(chunks: Sequence[np.ndarray], delays: Sequence[float]) -> AsyncIterator[np.ndarray]:
    """Yield chunks[i] after sleeping delays[i] (delays[len(chunks)], if given, before the end)."""
    for i, chunk in enumerate(chunks):
        await asyncio.sleep(delays[i])
        yield chunk
    if len(delays) > len(chunks):
        await asyncio.sleep(delays[len(chunks)])


def content_start(rec: np.ndarray) -> int:
    nz = np.flatnonzero(rec)
    assert nz.size, "nothing was played"
    return int(nz[0])


def engine_like_delays(frames: Sequence[int], first: float, step_s: float) -> list[float]:
    """First chunk after `first` s, then each chunk after its frame count * step_s."""
    return [first] + [n * step_s for n in frames[1:]]


# -- ring buffer --------------------------------------------------------------------


def test_ring_write_read_and_partial_read() -> None:
    ring = RingBuffer(8)
    assert (ring.capacity, ring.available, ring.space) == (8, 0, 8)
    assert ring.write(np.arange(5, dtype=np.float32)) == 5
    assert (ring.available, ring.space) == (5, 3)
    out = np.full(3, -1.0, dtype=np.float32)
    assert ring.read_into(out) == 3
    np.testing.assert_array_equal(out, [0, 1, 2])
    big = np.full(6, -1.0, dtype=np.float32)
    assert ring.read_into(big) == 2  # fills only what it has, leaves the rest alone
    np.testing.assert_array_equal(big, [3, 4, -1, -1, -1, -1])
    assert ring.read_into(big) == 0


def test_ring_full_write_is_partial_and_never_blocks() -> None:
    ring = RingBuffer(4)
    assert ring.write(np.arange(10, dtype=np.float32)) == 4
    assert ring.space == 0
    assert ring.write(np.ones(3, dtype=np.float32)) == 0
    out = np.empty(4, dtype=np.float32)
    assert ring.read_into(out) == 4
    np.testing.assert_array_equal(out, [0, 1, 2, 3])


def test_ring_wraparound() -> None:
    ring = RingBuffer(8)
    ring.write(np.arange(6, dtype=np.float32))
    ring.read_into(np.empty(4, dtype=np.float32))
    assert ring.write(np.arange(6, 12, dtype=np.float32)) == 6  # wraps past the end
    out = np.empty(8, dtype=np.float32)
    assert ring.read_into(out) == 8
    np.testing.assert_array_equal(out, np.arange(4, 12))


def test_ring_close_and_drained() -> None:
    ring = RingBuffer(4)
    ring.write([1.0, 2.0])
    ring.close()
    assert ring.finished and not ring.drained
    with pytest.raises(ValueError):
        ring.write([3.0])
    ring.read_into(np.empty(4, dtype=np.float32))
    assert ring.drained
    with pytest.raises(ValueError):
        RingBuffer(0)


@settings(max_examples=200, deadline=None)
@given(
    capacity=st.integers(1, 64),
    ops=st.lists(st.tuples(st.booleans(), st.integers(0, 100)), max_size=60),
)
def test_ring_matches_a_fifo_model(capacity: int, ops: list[tuple[bool, int]]) -> None:
    ring = RingBuffer(capacity)
    model: deque[float] = deque()
    counter = 0
    for is_write, n in ops:
        if is_write:
            data = np.arange(counter, counter + n, dtype=np.float32)
            written = ring.write(data)
            assert written == min(n, capacity - len(model))
            model.extend(data[:written].tolist())
            counter += written
        else:
            out = np.full(n, np.nan, dtype=np.float32)
            got = ring.read_into(out)
            want = [model.popleft() for _ in range(min(n, len(model)))]
            assert got == len(want)
            assert out[:got].tolist() == want
            assert np.isnan(out[got:]).all()
        assert ring.available == len(model)
        assert ring.space == capacity - len(model)


# -- the callback's accounting (no clock) ------------------------------------------


def test_callback_counts_underruns_only_when_audio_resumes() -> None:
    pb = _Playback(preroll_ms=0.0, buffer_s=1.0)
    pb.setup(1000, save=False)
    block = np.full((10, 1), np.nan, dtype=np.float32)

    def pull() -> np.ndarray:
        pb.callback(block, 10, None, None)
        return block[:, 0].copy()

    assert not pull().any() and not pb.started  # nothing yet: silence, not an underrun
    pb.ring.write(np.ones(15, dtype=np.float32))
    assert pull().all() and pb.started
    tail = pull()
    assert tail[:5].all() and not tail[5:].any()
    pull()  # starved: 5 + 10 samples of silence so far...
    assert pb.underruns == 0  # ...not counted yet: this might be the end
    pb.ring.write(np.ones(4, dtype=np.float32))
    pull()
    assert (pb.underruns, pb.underrun_samples) == (1, 15)
    pb.ring.close()
    pull()
    pull()
    assert pb.drained and (pb.underruns, pb.underrun_samples) == (1, 15)  # the end is no underrun
    assert pb.samples == 19


def test_callback_waits_for_preroll_unless_the_stream_ends() -> None:
    pb = _Playback(preroll_ms=30.0, buffer_s=1.0)
    pb.setup(1000, save=False)  # pre-roll = 30 samples
    block = np.empty((10, 1), dtype=np.float32)
    pb.ring.write(np.ones(20, dtype=np.float32))
    pb.callback(block, 10, None, None)
    assert not pb.started and not block.any()
    pb.ring.close()  # a stream shorter than the pre-roll still plays
    pb.callback(block, 10, None, None)
    assert pb.started and block.all()


# -- real-time playback through the fake device ------------------------------------


def test_chunks_on_time_play_back_to_back() -> None:
    frames = [1, 2, 4, 8, 8]  # the engine's pattern: first chunk, then growing chunks
    chunks = noise_chunks(frames)
    factory = Factory()
    # Engine at ~8x real time: first chunk after 0.1 s, then 10 ms per frame.
    delays = engine_like_delays(frames, first=0.1, step_s=0.01)
    t0 = time.monotonic()
    report = asyncio.run(play(paced(chunks, delays), preroll_ms=0.0, stream_factory=factory))
    wall = time.monotonic() - t0

    want = np.concatenate(chunks)
    rec = factory.stream.recording()
    assert not np.isnan(rec).any(), "the callback left samples unwritten"
    start = content_start(rec)
    np.testing.assert_array_equal(rec[start : start + want.size], want)
    assert not rec[:start].any() and not rec[start + want.size :].any()
    assert (report.underruns, report.underrun_ms) == (0, 0.0)
    assert report.samples_played == want.size and report.samplerate == RATE
    assert report.duration_s == pytest.approx(want.size / RATE)
    assert report.started_after_s is not None and 0.09 < report.started_after_s < 0.4
    assert wall >= 0.1 + want.size / RATE - 0.05  # waited for the tail to play
    assert factory.stream.closed and not factory.stream.active


def test_late_chunk_is_an_underrun_and_audio_after_it_is_intact(tmp_path: Path) -> None:
    a, b = noise_chunks([4, 4], seed=1)  # 320 ms each
    factory = Factory()
    save = tmp_path / "played.wav"
    # b arrives 0.6 s after a, but a only covers 0.32 s: expect ~0.27 s of inserted silence.
    report = asyncio.run(
        play(paced([a, b], [0.05, 0.6]), preroll_ms=0.0, save=save, stream_factory=factory)
    )

    assert report.underruns == 1
    assert 180.0 < report.underrun_ms < 380.0
    gap = round(report.underrun_ms * RATE / 1000.0)
    rec = factory.stream.recording()
    start = content_start(rec)
    np.testing.assert_array_equal(rec[start : start + a.size], a)
    assert not rec[start + a.size : start + a.size + gap].any()
    np.testing.assert_array_equal(rec[start + a.size + gap : start + a.size + gap + b.size], b)
    assert not rec[start + a.size + gap + b.size :].any()
    assert report.samples_played == a.size + b.size

    saved, rate = sf.read(save, dtype="float32")
    assert rate == RATE
    np.testing.assert_array_equal(saved, rec[start : start + a.size + gap + b.size])


def test_end_of_stream_is_not_an_underrun(tmp_path: Path) -> None:
    chunks = noise_chunks([2, 2], seed=2)
    factory = Factory()
    save = tmp_path / "out.wav"
    # The iterator ends 0.5 s after the last chunk: the device starves, but that is the end.
    report = asyncio.run(
        play(paced(chunks, [0.02, 0.01, 0.5]), preroll_ms=0.0, save=save, stream_factory=factory)
    )
    assert report.underruns == 0 and report.underrun_ms == 0.0
    want = np.concatenate(chunks)
    saved, _ = sf.read(save, dtype="float32")
    np.testing.assert_array_equal(saved, want)  # no trailing silence in the file either


def test_save_ends_with_the_audio_even_when_it_ends_in_zeros(tmp_path: Path) -> None:
    (chunk,) = noise_chunks([2], seed=3)
    chunk[-500:] = 0.0  # genuine trailing silence in the audio is kept
    factory = Factory()
    save = tmp_path / "z.wav"
    report = asyncio.run(play(paced([chunk], [0.01]), save=save, stream_factory=factory))
    saved, _ = sf.read(save, dtype="float32")
    np.testing.assert_array_equal(saved, chunk)
    assert report.samples_played == chunk.size


def test_empty_stream() -> None:
    factory = Factory()
    report = asyncio.run(play(paced([], [0.0]), stream_factory=factory))
    assert report.samples_played == 0 and report.started_after_s is None
    assert report.underruns == 0 and report.wall_s < 1.0
    assert factory.stream.closed


def test_backpressure_makes_the_feeder_wait() -> None:
    chunks = noise_chunks([1] * 12, seed=4)  # 0.96 s in all, offered as fast as possible
    pulled: list[float] = []

    async def eager() -> AsyncIterator[np.ndarray]:
        for c in chunks:
            pulled.append(time.monotonic())
            yield c

    factory = Factory()
    player = Player(buffer_s=0.2, preroll_ms=0.0, stream_factory=factory)
    t0 = time.monotonic()
    report = asyncio.run(player.play(eager()))
    # With 0.2 s of buffer the last chunk can't be taken before ~0.96 - 0.2 - 0.08 s of playback.
    assert pulled[-1] - t0 > 0.5
    rec = factory.stream.recording()
    start = content_start(rec)
    want = np.concatenate(chunks)
    np.testing.assert_array_equal(rec[start : start + want.size], want)
    assert report.underruns == 0


def test_cancel_stops_promptly_and_closes_the_device() -> None:
    closed = asyncio.Event()

    async def endless() -> AsyncIterator[np.ndarray]:
        try:
            while True:
                await asyncio.sleep(0.02)
                yield np.full(FRAME, 0.25, dtype=np.float32)
        finally:
            closed.set()

    factory = Factory()

    async def main() -> float:
        task = asyncio.create_task(Player(stream_factory=factory).play(endless()))
        await asyncio.sleep(0.4)
        t = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert closed.is_set()  # the producer was closed, so an engine can free its slot
        return time.monotonic() - t

    assert asyncio.run(main()) < 0.2
    assert factory.stream.closed and not factory.stream.active


def test_producer_error_stops_playback_and_propagates() -> None:
    async def broken() -> AsyncIterator[np.ndarray]:
        yield np.full(FRAME, 0.25, dtype=np.float32)
        raise RuntimeError("engine failed")

    factory = Factory()
    with pytest.raises(RuntimeError, match="engine failed"):
        asyncio.run(play(broken(), stream_factory=factory))
    assert factory.stream.closed and not factory.stream.active


class _DeadStream:
    """A device that opens and starts but never asks for audio."""

    samplerate = float(RATE)
    latency = 0.0
    active = True

    def __init__(self, **kwargs: Any) -> None:
        self.closed = False

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def test_dead_device_raises_instead_of_hanging(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(player_mod, "_STALL_S", 0.3)
    streams: list[_DeadStream] = []

    def factory(**kwargs: Any) -> _DeadStream:
        streams.append(_DeadStream(**kwargs))
        return streams[-1]

    chunks = noise_chunks([1])
    with pytest.raises(PlaybackError, match="stopped requesting audio"):
        asyncio.run(play(paced(chunks, [0.0]), stream_factory=factory))
    assert streams[0].closed


def test_device_at_48k_resamples_without_seams(tmp_path: Path) -> None:
    # 400 Hz: a whole number of periods in the clip, so it starts and ends at zero and the whole
    # recording (silence, tone, silence) should be smooth. A seam at a chunk edge would jump.
    frames = [1, 2, 4, 8]
    n = sum(frames) * FRAME
    tone = (0.5 * np.sin(2 * np.pi * 400 * np.arange(n) / RATE)).astype(np.float32)
    edges = np.cumsum([0] + [f * FRAME for f in frames])
    chunks = [tone[edges[i] : edges[i + 1]] for i in range(len(frames))]
    factory = Factory(device_rate=48_000)
    save = tmp_path / "48k.wav"
    report = asyncio.run(
        play(
            paced(chunks, engine_like_delays(frames, 0.05, 0.01)),
            save=save,
            stream_factory=factory,
        )
    )
    assert report.resampled and report.samplerate == 48_000
    assert report.samples_played == 2 * n and report.underruns == 0

    saved, rate = sf.read(save, dtype="float32")
    assert rate == 48_000 and saved.size == 2 * n
    np.testing.assert_allclose(saved, soxr.resample(tone, RATE, 48_000), atol=1e-5)
    rec = factory.stream.recording()
    max_step = 2 * np.pi * 400 / 48_000 * 0.5  # steepest slope of the tone, per sample
    assert np.abs(np.diff(rec)).max() < 1.2 * max_step
    assert np.sum(rec.astype(np.float64) ** 2) == pytest.approx(
        np.sum(saved.astype(np.float64) ** 2)
    )


def test_report_summary() -> None:
    r = PlaybackReport(
        samplerate=RATE,
        samples_played=RATE,
        underruns=2,
        underrun_ms=120.0,
        started_after_s=0.25,
        duration_s=1.12,
        wall_s=1.5,
    )
    assert r.summary() == (
        "played 1.12 s, first sound after 250 ms, 2 underrun(s) (120 ms of silence inserted)"
    )


# -- device handling (fake sounddevice modules) ------------------------------------


class _PortAudioMissing(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes `import sounddevice` fail the way it does without libportaudio."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name == "sounddevice":
            return importlib.machinery.ModuleSpec(name, self)
        return None

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        raise OSError("PortAudio library not found")


async def _untouched(flag: list[bool]) -> AsyncIterator[np.ndarray]:
    flag.append(True)
    yield np.zeros(1, dtype=np.float32)


def test_portaudio_missing_is_a_clear_playback_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "sounddevice", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_PortAudioMissing(), *sys.meta_path])
    touched: list[bool] = []
    with pytest.raises(PlaybackError) as info:
        asyncio.run(play(_untouched(touched)))
    msg = str(info.value)
    assert "PortAudio" in msg and "--save FILE" in msg
    assert isinstance(info.value, StreamTTSError)
    assert not touched  # raised before the first chunk was asked for
    with pytest.raises(PlaybackError, match="PortAudio"):
        list_devices()


def test_sounddevice_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sounddevice", None)
    with pytest.raises(PlaybackError, match="pip install"):
        resolve_output_device(None)


class _FakePortAudioError(Exception):
    pass


def fake_sounddevice(devices: list[dict[str, Any]], default_out: int = -1, **attrs: Any) -> Any:
    def query_devices() -> list[dict[str, Any]]:
        return devices

    def query_hostapis() -> tuple[dict[str, Any], ...]:
        return ({"name": "ALSA"},)

    def check_output_settings(**kwargs: Any) -> None:
        pass

    return SimpleNamespace(
        query_devices=query_devices,
        query_hostapis=query_hostapis,
        check_output_settings=check_output_settings,
        default=SimpleNamespace(device=[-1, default_out]),
        PortAudioError=_FakePortAudioError,
        **attrs,
    )


def dev(
    index: int, name: str, outs: int = 2, ins: int = 0, rate: float = 48000.0
) -> dict[str, Any]:
    return {
        "index": index,
        "name": name,
        "hostapi": 0,
        "max_input_channels": ins,
        "max_output_channels": outs,
        "default_samplerate": rate,
    }


DEVICES = [
    dev(0, "USB Mic", outs=0, ins=1),
    dev(1, "HDA Intel PCH: ALC892 Analog (hw:0,0)"),
    dev(2, "HDMI 0"),
    dev(3, "HDMI 1", rate=44100.0),
]


def test_no_output_device_is_a_clear_playback_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sounddevice", fake_sounddevice([DEVICES[0]]))
    touched: list[bool] = []
    with pytest.raises(PlaybackError) as info:
        asyncio.run(play(_untouched(touched)))
    assert str(info.value) == NO_DEVICE_MESSAGE
    assert "no audio output device found" in str(info.value)
    assert not touched
    assert "no audio output devices" in list_devices()


def test_device_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sounddevice", fake_sounddevice(DEVICES, default_out=1))
    assert resolve_output_device(None) == 1
    assert resolve_output_device(2) == 2
    assert resolve_output_device(" 3 ") == 3
    assert resolve_output_device("alc892") == 1
    assert resolve_output_device("hdmi 1") == 3
    with pytest.raises(PlaybackError, match="several"):
        resolve_output_device("HDMI")
    with pytest.raises(PlaybackError, match="no audio output device matches 'nope'"):
        resolve_output_device("nope")
    with pytest.raises(PlaybackError, match="no output channels"):
        resolve_output_device(0)
    with pytest.raises(PlaybackError, match="no audio device with index 9"):
        resolve_output_device(9)


def test_no_default_device_falls_back_to_the_first_output(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sounddevice", fake_sounddevice(DEVICES, default_out=-1))
    assert resolve_output_device(None) == 1


def test_list_devices_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sounddevice", fake_sounddevice(DEVICES, default_out=2))
    table = list_devices()
    lines = table.splitlines()
    assert "USB Mic" not in table  # input-only
    assert any(line.startswith("*") and "HDMI 0" in line for line in lines)
    assert "ALC892" in table and "44100" in table and "ALSA" in table


def test_sounddevice_factory_falls_back_to_the_device_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[dict[str, Any]] = []

    def check_output_settings(**kwargs: Any) -> None:
        if kwargs["samplerate"] != 44100:
            raise _FakePortAudioError("Invalid sample rate")

    def output_stream(**kwargs: Any) -> Any:
        opened.append(kwargs)
        return SimpleNamespace(samplerate=float(kwargs["samplerate"]), latency=0.05)

    sd = fake_sounddevice(DEVICES, default_out=3, OutputStream=output_stream)
    sd.check_output_settings = check_output_settings
    monkeypatch.setitem(sys.modules, "sounddevice", sd)
    stream = sounddevice_stream(samplerate=RATE, blocksize=0, device=None, callback=print)
    assert stream.samplerate == 44100.0
    assert opened[0]["samplerate"] == 44100 and opened[0]["device"] == 3
    assert opened[0]["channels"] == 1 and opened[0]["dtype"] == "float32"


def test_sounddevice_factory_open_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    def output_stream(**kwargs: Any) -> Any:
        raise _FakePortAudioError("Device unavailable [PaErrorCode -9985]")

    sd = fake_sounddevice(DEVICES, default_out=1, OutputStream=output_stream)
    monkeypatch.setitem(sys.modules, "sounddevice", sd)
    with pytest.raises(PlaybackError, match="cannot open audio output device 1 .*--save FILE"):
        asyncio.run(play(_untouched([])))


def test_this_machine_gives_a_table_or_a_clear_error() -> None:
    # Whatever this machine has (no PortAudio, PortAudio without devices, a sound card),
    # listing devices never escapes as anything but PlaybackError.
    try:
        assert isinstance(list_devices(), str)
    except PlaybackError as exc:
        assert "--save FILE" in str(exc)
