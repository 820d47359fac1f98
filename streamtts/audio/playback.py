"""Live playback of streamed PCM (``streamtts speak`` / ``streamtts say``).

Data path::

    async chunks --(feeder, asyncio)--> [soxr stream resampler] --> RingBuffer
        --(audio callback, device thread)--> output stream --> speaker
                                                   \\--> tap RingBuffer --(monitor task)--> --save file

* The feeder is the only writer of the ring and the audio callback its only reader, so the ring
  needs no lock (see :class:`RingBuffer`). When the ring is full the feeder *awaits* (backpressure)
  instead of growing memory.
* The device is opened and started as soon as :meth:`Player.play` is called, before the first
  chunk exists, so the (sometimes 100 ms+) cost of opening a device overlaps with the model's
  time-to-first-chunk. Until playback starts the callback outputs silence.
* Playback starts once the ring holds ``preroll_ms`` of audio (default 40 ms) or the stream has
  ended. The engine's first chunk is one 80 ms frame, so with the default engine playback starts on
  the first chunk; the pre-roll only matters for producers that deliver small slivers (a network
  client), where starting on a few ms of audio would underrun at once.
* An *underrun* is silence the callback had to insert between two pieces of audio because the
  producer was late. The silence after the last sample is the end of the stream, not an underrun,
  so a starved stretch is only counted once audio resumes after it.
* ``save`` writes exactly what was played: the device-rate samples from the first sound to the
  last, including inserted underrun silence (float WAV, so bit-exact).
* Headless tests run the same Player / ring / callback through :class:`ClockedOutputStream`, a
  stand-in for the sound card clocked in real time (``stream_factory`` seam).

Opening the device (and importing ``sounddevice``, lazily) is :mod:`streamtts.audio.devices`'s.
"""


from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..constants import SAMPLE_RATE
from ..errors import PlaybackError
from .devices import NULL_DEVICE, SAVE_HINT, OutputStreamLike, StreamFactory, sounddevice_stream
from .formats import StreamResampler

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_PREROLL_MS",
    "PlaybackReport",
    "Player",
    "RingBuffer",
    "play",
    "save_subtype",
]

DEFAULT_PREROLL_MS = 40.0
DEFAULT_BUFFER_S = 10.0

# How long the save file's tap may go undrained before samples are lost (the monitor drains it
# every MONITOR_INTERVAL_S, so this is a large margin).
_TAP_S = 5.0
_MONITOR_INTERVAL_S = 0.05
# The device stopped asking for audio this long while we wait on it: treat it as dead.
_STALL_S = 3.0

Float32Array = npt.NDArray[np.float32]


# -- ring buffer ----------------------------------------------------------------------


class RingBuffer:
    """Fixed-size single-producer / single-consumer ring of float32 samples.

    Lock-free under the GIL: the producer only advances ``_written`` and the consumer only
    ``_read`` (monotonic sample counts; a plain int attribute store is atomic under the GIL). Each
    side copies its samples *before* publishing the new count, so the other side never sees a
    count whose samples are not in place. Neither call blocks or allocates sample storage, which
    is what the audio callback needs.
    """

    def __init__(self, capacity_samples: int) -> None:
        if capacity_samples <= 0:
            raise ValueError(f"capacity_samples must be > 0, got {capacity_samples}")
        self._buf: Float32Array = np.zeros(capacity_samples, dtype=np.float32)
        self._cap = capacity_samples
        self._written = 0  # total samples ever written (producer-owned)
        self._read = 0  # total samples ever read (consumer-owned)
        self._finished = False

    @property
    def capacity(self) -> int:
        return self._cap

    @property
    def available(self) -> int:
        """Samples ready to read."""
        return self._written - self._read

    @property
    def space(self) -> int:
        """Samples that can be written now."""
        return self._cap - (self._written - self._read)

    @property
    def finished(self) -> bool:
        """The producer called :meth:`close`: nothing more will be written."""
        return self._finished

    @property
    def drained(self) -> bool:
        """Finished and everything written has been read."""
        return self._finished and self._written == self._read

    def write(self, pcm: npt.ArrayLike) -> int:
        """Copy as much of ``pcm`` as fits; return how many samples were written (never blocks)."""
        if self._finished:
            raise ValueError("write() after close()")
        x = np.asarray(pcm, dtype=np.float32).reshape(-1)
        n = min(len(x), self.space)
        if n <= 0:
            return 0
        start = self._written % self._cap
        first = min(n, self._cap - start)
        self._buf[start : start + first] = x[:first]
        if n > first:  # wrap around to the front
            self._buf[: n - first] = x[first:n]
        self._written += n  # publish only after the samples are in place
        return n

    def read_into(self, out: Float32Array) -> int:
        """Fill the front of ``out`` with up to ``len(out)`` samples; return how many."""
        n = min(len(out), self._written - self._read)
        if n <= 0:
            return 0
        start = self._read % self._cap
        first = min(n, self._cap - start)
        out[:first] = self._buf[start : start + first]
        if n > first:
            out[first:n] = self._buf[: n - first]
        self._read += n  # release the space only after copying out
        return n

    def close(self) -> None:
        """Mark the end of the stream (the producer will write no more)."""
        self._finished = True


# -- playback -------------------------------------------------------------------------


@dataclass(frozen=True)
class PlaybackReport:
    """What a :meth:`Player.play` call did. Sample counts are at ``samplerate`` (the device's)."""

    samplerate: int
    samples_played: int  # audio samples played, not counting inserted silence
    underruns: int  # times the audio stopped mid-stream because chunks came late
    underrun_ms: float  # total silence inserted by those underruns
    started_after_s: float | None  # from the play() call to the first sound (None: no audio)
    duration_s: float  # audio played including inserted silence
    wall_s: float  # play() call to return
    device_underflows: int = 0  # blocks the device itself reported late (callback too slow)
    resampled: bool = False  # the device refused 24 kHz; audio was resampled
    save_dropped: int = 0  # samples missing from the save file (its writer fell far behind)

    @property
    def samples(self) -> int:
        """Alias of ``samples_played`` (at ``samplerate``, which is not 24 kHz when resampled)."""
        return self.samples_played

    def summary(self) -> str:
        started = "-" if self.started_after_s is None else f"{self.started_after_s * 1000:.0f} ms"
        text = (
            f"played {self.duration_s:.2f} s, first sound after {started}, "
            f"{self.underruns} underrun(s) ({self.underrun_ms:.0f} ms of silence inserted)"
        )
        if self.device_underflows:
            text += f", {self.device_underflows} device underflow(s)"
        return text


def save_subtype(path: str) -> str | None:
    """The sample type of a ``--save`` file, with a sound card or without: 32-bit float where
    the format has it (what was played, bit for bit), else the format's default."""
    import soundfile as sf

    fmt = Path(path).suffix.lstrip(".").upper()
    return "FLOAT" if fmt and sf.check_format(fmt, "FLOAT") else None


class _SaveWriter:
    """Writes the played samples to a file from the monitor task (never the audio callback).

    The tap carries every block the callback output after playback started, including the
    silence after the end of the stream. Runs of trailing zeros are therefore held back (as a
    count) until non-zero audio follows them; at the end only as many are written as the final
    length (audio + committed underrun silence) needs.
    """

    def __init__(self, path: str | Path, samplerate: int) -> None:
        import soundfile as sf

        self.path = str(path)
        try:
            self._file = sf.SoundFile(
                self.path, mode="w", samplerate=samplerate, channels=1, subtype=save_subtype(self.path)
            )
        except Exception as exc:  # soundfile raises LibsndfileError / TypeError / OSError
            raise PlaybackError(f"cannot write {self.path}: {exc}") from exc
        self.written = 0
        self._held_zeros = 0

    def add(self, block: Float32Array) -> None:
        nz = np.flatnonzero(block)
        if nz.size == 0:
            self._held_zeros += block.shape[0]
            return
        last = int(nz[-1]) + 1
        self._write_zeros(self._held_zeros)
        self._file.write(block[:last])
        self.written += last
        self._held_zeros = block.shape[0] - last

    def finish(self, total: int) -> None:
        self._write_zeros(min(self._held_zeros, max(0, total - self.written)))
        self._held_zeros = 0
        self._file.close()

    def _write_zeros(self, n: int) -> None:
        step = 1 << 16
        while n > 0:
            k = min(n, step)
            self._file.write(np.zeros(k, dtype=np.float32))
            self.written += k
            n -= k


class _Playback:
    """State of one play() call; :meth:`callback` runs on the device's thread.

    Counters are written only by the callback and read by the asyncio side (ints: atomic under
    the GIL). The callback allocates no sample storage: it copies from the ring into ``outdata``.
    """

    def __init__(self, preroll_ms: float, buffer_s: float) -> None:
        self.preroll_ms = preroll_ms
        self.buffer_s = buffer_s
        self.samplerate = 0
        self.ring = RingBuffer(1)  # replaced in setup() once the device rate is known
        self.tap: RingBuffer | None = None
        self.preroll = 0
        # callback-owned
        self.started = False
        # time.monotonic() at which the first sample reached the DAC
        self.first_sound: float | None = None
        self.callbacks = 0
        self.samples = 0
        self.underruns = 0
        self.underrun_samples = 0
        self.pending_gap = 0  # silence since the audio last stopped; an underrun if audio resumes
        self.drained = False
        self.device_underflows = 0
        self.tap_dropped = 0

    def setup(self, samplerate: int, save: bool) -> None:
        self.samplerate = samplerate
        self.ring = RingBuffer(max(1, round(self.buffer_s * samplerate)))
        self.preroll = min(self.ring.capacity, max(0, round(self.preroll_ms * samplerate / 1000.0)))
        self.tap = RingBuffer(round(_TAP_S * samplerate)) if save else None

    def callback(self, outdata: Float32Array, frames: int, time_info: Any, status: Any) -> None:
        self.callbacks += 1
        if status and getattr(status, "output_underflow", False):
            self.device_underflows += 1
        out = outdata[:, 0]
        ring = self.ring
        if not self.started:
            avail = ring.available
            if avail == 0 or (avail < self.preroll and not ring.finished):
                out.fill(0.0)
                if ring.drained:  # the stream ended without any audio
                    self.drained = True
                return
            self.started = True
            self.first_sound = time.monotonic() + _dac_delay(time_info)
        n = ring.read_into(out)
        if n > 0:
            self.samples += n
            if self.pending_gap:  # audio resumed after a starved stretch: that was an underrun
                self.underruns += 1
                self.underrun_samples += self.pending_gap
                self.pending_gap = 0
        if n < frames:
            out[n:].fill(0.0)
            self.pending_gap += frames - n
            if ring.drained:
                self.drained = True
        if self.tap is not None:
            self.tap_dropped += frames - self.tap.write(out)


def _dac_delay(time_info: Any) -> float:
    """Seconds until the block being filled reaches the DAC (0 when the host does not say)."""
    try:
        delay = float(time_info.outputBufferDacTime) - float(time_info.currentTime)
    except (AttributeError, TypeError, ValueError):
        return 0.0
    return delay if 0.0 < delay < 1.0 else 0.0


def _as_mono(pcm: npt.ArrayLike) -> Float32Array:
    x = np.asarray(pcm, dtype=np.float32)
    if x.ndim == 2 and x.shape[1] == 1:
        x = x[:, 0]
    if x.ndim != 1:
        raise PlaybackError(f"expected mono PCM of shape (n,), got shape {x.shape}")
    return x


class Player:
    """Plays streamed PCM chunks through a callback-driven output stream.

    ``device``: None (default), an index or a name substring (see :func:`resolve_output_device`).
    ``preroll_ms``: audio buffered before the first sound (default 40 ms, see module docs).
    ``buffer_s``: ring size; a producer further ahead than this waits (backpressure).
    ``samplerate``: rate of the incoming chunks (the model's 24 kHz).
    ``blocksize``: frames per callback; 0 lets the device choose.
    ``stream_factory``: opens the output stream; :func:`sounddevice_stream` unless given
    (tests pass :class:`ClockedOutputStream`).
    """

    def __init__(
        self,
        *,
        device: int | str | None = None,
        preroll_ms: float = DEFAULT_PREROLL_MS,
        buffer_s: float = DEFAULT_BUFFER_S,
        samplerate: int = SAMPLE_RATE,
        blocksize: int = 0,
        stream_factory: StreamFactory | None = None,
    ) -> None:
        if preroll_ms < 0:
            raise ValueError(f"preroll_ms must be >= 0, got {preroll_ms}")
        if buffer_s <= 0:
            raise ValueError(f"buffer_s must be > 0, got {buffer_s}")
        self.device = device
        self.preroll_ms = preroll_ms
        self.buffer_s = buffer_s
        self.samplerate = samplerate
        self.blocksize = blocksize
        if stream_factory is None and device == NULL_DEVICE:
            from .clocked import null_output_stream

            stream_factory = null_output_stream
        self._factory: StreamFactory = stream_factory or sounddevice_stream

    async def play(
        self, chunks: AsyncIterable[npt.ArrayLike], *, save: str | Path | None = None
    ) -> PlaybackReport:
        """Play ``chunks`` (mono float32 at ``samplerate``) until the last sample has been heard.

        Opens the device first; a :class:`PlaybackError` from that is raised before ``chunks`` is
        touched. Cancelling the task aborts the stream at once and closes the device; an error
        from ``chunks`` does the same and propagates. ``save`` gets what was played so far either
        way.
        """
        t0 = time.monotonic()
        pb = _Playback(self.preroll_ms, self.buffer_s)
        stream = self._factory(
            samplerate=self.samplerate,
            blocksize=self.blocksize,
            device=self.device,
            callback=pb.callback,
        )
        writer: _SaveWriter | None = None
        monitor: asyncio.Task[None] | None = None
        completed = False
        try:
            rate = int(round(stream.samplerate))
            pb.setup(rate, save is not None)
            if save is not None:
                writer = _SaveWriter(save, rate)
            resampler = self._resampler(rate)
            try:
                stream.start()
            except Exception as exc:  # PortAudioError (device busy, unplugged, ...)
                raise PlaybackError(f"cannot start audio output: {exc}", SAVE_HINT) from exc
            monitor = asyncio.create_task(_monitor(pb, writer))
            await self._feed(chunks, pb, stream, resampler)
            await _wait_drained(pb, stream)
            # The last block is in the device's buffer now; let it reach the speaker before stopping.
            await asyncio.sleep(max(0.0, float(stream.latency)))
            stream.stop()
            completed = True
        finally:
            if not completed:
                stream.abort()  # cancellation or error: drop queued audio, stop now
            stream.close()
            if not completed:
                await _close_iterator(chunks)
            if monitor is not None:
                monitor.cancel()
                await asyncio.gather(monitor, return_exceptions=True)
            if writer is not None:
                _drain_tap(pb, writer)
                writer.finish(pb.samples + pb.underrun_samples)
                if pb.tap_dropped:
                    log.warning(
                        "%s is missing %d samples (writer fell behind)", writer.path, pb.tap_dropped
                    )
        report = PlaybackReport(
            samplerate=rate,
            samples_played=pb.samples,
            underruns=pb.underruns,
            underrun_ms=1000.0 * pb.underrun_samples / rate,
            started_after_s=None if pb.first_sound is None else pb.first_sound - t0,
            duration_s=(pb.samples + pb.underrun_samples) / rate,
            wall_s=time.monotonic() - t0,
            device_underflows=pb.device_underflows,
            resampled=resampler is not None,
            save_dropped=pb.tap_dropped,
        )
        log.info("playback: %s", report.summary())
        return report

    def _resampler(self, device_rate: int) -> StreamResampler:
        if device_rate != self.samplerate:
            log.info("resampling %d Hz -> %d Hz for the output device", self.samplerate, device_rate)
        return StreamResampler(self.samplerate, device_rate)

    async def _feed(
        self,
        chunks: AsyncIterable[npt.ArrayLike],
        pb: _Playback,
        stream: OutputStreamLike,
        resampler: StreamResampler,
    ) -> None:
        async for chunk in chunks:
            await _write_all(resampler.push(_as_mono(chunk)), pb, stream)
        tail = resampler.flush()
        if tail.shape[0]:
            await _write_all(tail, pb, stream)
        pb.ring.close()


async def _close_iterator(chunks: object) -> None:
    # An async generator we stop reading early is otherwise only closed by the garbage collector;
    # closing it now lets the engine abort the request and free its slot right away.
    aclose = getattr(chunks, "aclose", None)
    if aclose is None:
        return
    try:
        await aclose()
    except Exception:  # already failing or cancelled: don't mask that with a close error
        log.debug("closing the chunk iterator failed", exc_info=True)


async def _write_all(pcm: Float32Array, pb: _Playback, stream: OutputStreamLike) -> None:
    """Put all of ``pcm`` in the ring, awaiting (not growing memory) while it is full."""
    ring = pb.ring
    off = ring.write(pcm)
    watch = _Watchdog(pb, stream)
    while off < pcm.shape[0]:
        # Sleep about as long as the device needs to free a useful amount of space.
        want = min(pcm.shape[0] - off, ring.capacity // 4) - ring.space
        await asyncio.sleep(min(0.1, max(0.005, want / pb.samplerate)))
        watch.check()
        off += ring.write(pcm[off:])


async def _wait_drained(pb: _Playback, stream: OutputStreamLike) -> None:
    watch = _Watchdog(pb, stream)
    while not pb.drained:
        await asyncio.sleep(0.01)
        watch.check()


class _Watchdog:
    """Raises PlaybackError when the device stops pulling audio while we wait on it."""

    def __init__(self, pb: _Playback, stream: OutputStreamLike) -> None:
        self._pb = pb
        self._stream = stream
        self._seen = pb.callbacks
        self._since = time.monotonic()

    def check(self) -> None:
        if not self._stream.active:
            raise PlaybackError("the audio output stream stopped unexpectedly")
        now = time.monotonic()
        if self._pb.callbacks != self._seen:
            self._seen, self._since = self._pb.callbacks, now
        elif now - self._since > _STALL_S:
            raise PlaybackError(f"the audio device stopped requesting audio for {_STALL_S:.0f} s")


def _drain_tap(pb: _Playback, writer: _SaveWriter) -> None:
    tap = pb.tap
    if tap is None:
        return
    scratch = np.empty(min(tap.capacity, 1 << 16), dtype=np.float32)
    while (n := tap.read_into(scratch)) > 0:
        writer.add(scratch[:n])


async def _monitor(pb: _Playback, writer: _SaveWriter | None) -> None:
    """Drains the save tap and logs underruns as they are detected."""
    seen = 0
    while True:
        await asyncio.sleep(_MONITOR_INTERVAL_S)
        if writer is not None:
            _drain_tap(pb, writer)
        if pb.underruns != seen:
            seen = pb.underruns
            log.warning(
                "playback underrun: audio arrived late (%d so far, %.0f ms of silence inserted)",
                seen,
                1000.0 * pb.underrun_samples / pb.samplerate,
            )


async def play(
    chunks: AsyncIterable[npt.ArrayLike],
    *,
    device: int | str | None = None,
    preroll_ms: float = DEFAULT_PREROLL_MS,
    save: str | Path | None = None,
    stream_factory: StreamFactory | None = None,
) -> PlaybackReport:
    """Play ``chunks`` (mono float32 24 kHz) on ``device``; see :class:`Player`."""
    player = Player(device=device, preroll_ms=preroll_ms, stream_factory=stream_factory)
    return await player.play(chunks, save=save)
