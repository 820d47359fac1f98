"""A sound card stand-in clocked in real time, for headless tests of the real Player.

Only the device is fake: the Player, its ring buffer and its audio callback run exactly as they do
with a sound card (``Player(stream_factory=ClockedOutputStream)``). ``--output-device null``
plays through one that keeps nothing (:func:`null_output_stream`): a machine without a sound
card still runs ``speak`` at the pace of a listener.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np

from ..closing import Closing
from .devices import AudioCallback, Float32Array

log = logging.getLogger(__name__)

__all__ = ["ClockedOutputStream", "null_output_stream"]


class _TimeInfo:
    """What PortAudio passes as ``time`` to the callback (seconds on the stream's clock)."""

    __slots__ = ("currentTime", "inputBufferAdcTime", "outputBufferDacTime")

    def __init__(self, now: float, dac: float) -> None:
        self.currentTime = now
        self.outputBufferDacTime = dac
        self.inputBufferAdcTime = 0.0


class _Status:
    """Stand-in for ``sounddevice.CallbackFlags`` (only the output flags)."""

    __slots__ = ("output_overflow", "output_underflow", "priming_output")

    def __init__(self, output_underflow: bool = False) -> None:
        self.output_underflow = output_underflow
        self.output_overflow = False
        self.priming_output = False

    def __bool__(self) -> bool:
        return self.output_underflow


class ClockedOutputStream(Closing):
    """A sound card stand-in for headless tests: only the device is fake.

    Mimics ``sounddevice.OutputStream``: ``callback(outdata, frames, time, status)`` is called from
    its own thread every ``blocksize`` frames, paced by the wall clock so that samples are consumed
    at ``samplerate`` per second, exactly like a real device pulls them. Every block the callback
    produced is recorded (:meth:`recording`). ``outdata`` is pre-filled with NaN so a callback that
    leaves samples unwritten shows up in the recording.

    ``device_rate`` makes it behave like a device that refuses the requested rate and runs at its
    own (e.g. 48000). If the pacing thread falls more than a block behind (an overloaded machine),
    it re-syncs instead of bursting and flags ``output_underflow`` as PortAudio would.
    """

    def __init__(
        self,
        *,
        samplerate: int,
        blocksize: int = 0,
        device: int | str | None = None,
        callback: AudioCallback,
        channels: int = 1,
        dtype: str = "float32",
        device_rate: int | None = None,
        block_ms: float = 20.0,
        latency: float = 0.0,
        record: bool = True,
    ) -> None:
        if channels != 1 or dtype != "float32":
            raise ValueError("ClockedOutputStream plays mono float32 only")
        rate = device_rate if device_rate is not None else samplerate
        self._samplerate = float(rate)
        self.blocksize = blocksize if blocksize > 0 else max(1, round(rate * block_ms / 1000.0))
        self.device = device
        self._latency = latency
        self._callback = callback
        self._record = record
        self._blocks: list[Float32Array] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.closed = False
        self.callbacks = 0
        self.late_blocks = 0
        self.error: BaseException | None = None

    @property
    def samplerate(self) -> float:
        return self._samplerate

    @property
    def latency(self) -> float:
        return self._latency

    @property
    def active(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.closed:
            raise RuntimeError("stream is closed")
        if self.active:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="clocked-output", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def abort(self) -> None:
        self.stop()

    def close(self) -> None:
        self.stop()
        self.closed = True

    def __enter__(self) -> ClockedOutputStream:
        self.start()  # as sounddevice's streams; the exit is Closing's (close stops first)
        return self

    def recording(self) -> Float32Array:
        """Everything the callback produced, in order (1-D)."""
        blocks = list(self._blocks)  # the pacing thread may still append
        if not blocks:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate(blocks)[:, 0]

    def _run(self) -> None:
        period = self.blocksize / self._samplerate
        next_t = time.monotonic()
        underflow = False
        while not self._stop.is_set():
            out = np.full((self.blocksize, 1), np.nan, dtype=np.float32)
            now = time.monotonic()
            try:
                self._callback(
                    out, self.blocksize, _TimeInfo(now, now + self._latency), _Status(underflow)
                )
            except BaseException as exc:  # PortAudio aborts the stream when the callback raises
                self.error = exc
                log.error("output callback raised; stream aborted", exc_info=exc)
                return
            if self._record:
                self._blocks.append(out)
            self.callbacks += 1
            underflow = False
            next_t += period
            delay = next_t - time.monotonic()
            if delay < -period:  # fell behind: a device would have played silence; re-sync
                self.late_blocks += 1
                underflow = True
                next_t = time.monotonic()
            elif delay > 0:
                self._stop.wait(delay)


def null_output_stream(
    *, samplerate: int, blocksize: int, device: int | str | None, callback: AudioCallback
) -> ClockedOutputStream:
    """``--output-device null``: pulls audio at the pace of a sound card and discards it."""
    return ClockedOutputStream(
        samplerate=samplerate, blocksize=blocksize, device=device, callback=callback, record=False
    )
