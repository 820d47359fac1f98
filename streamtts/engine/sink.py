"""Thread-safe hand-off of one stream's output to its asyncio consumer.

The engine and decode threads call ``put_chunk``/``fail``/``finish``; the
consumer awaits ``get``. Backpressure is computed from two counters, each
written by one side only, so no lock is needed: samples produced (decode
thread) minus samples consumed (consumer).

An :class:`~streamtts.request.handoff.Outbox` (request/handoff.py) gathers what one codec
call produced for many streams and hands it to each event loop at once.
"""

from __future__ import annotations

import asyncio
import logging
import time

from ..constants import SAMPLE_RATE
from ..request import AudioChunk, StreamStats
from ..request.handoff import Outbox, _Item

__all__ = ["Outbox", "StreamSink"]

log = logging.getLogger(__name__)


class StreamSink:
    """One stream's output queue (the request's :class:`~streamtts.request.ChunkSink`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, stats: StreamStats) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self.stats = stats
        self.produced_samples = 0  # written by the decode thread
        self.consumed_samples = 0  # written by the consumer
        self.cancelled = False  # written by the consumer, read by the engine thread
        self.closed = False  # no more items will be put

    # -- producer side (engine / decode threads) --------------------------------------
    def put_chunk(self, chunk: AudioChunk, outbox: Outbox | None = None) -> None:
        if not self.stats.t_first_made:
            self.stats.t_first_made = time.monotonic()
            self.stats.first_audio_step = chunk.step
            if log.isEnabledFor(logging.DEBUG):
                _log_first(self.stats)
        self.produced_samples += chunk.pcm.shape[0]
        self._put(chunk, outbox)

    def fail(self, exc: BaseException) -> None:
        if not self.closed:
            self.closed = True
            self.stats.t_done = time.monotonic()
            self._put(exc, None)

    def finish(self, outbox: Outbox | None = None) -> None:
        if not self.closed:
            self.closed = True
            self.stats.t_done = time.monotonic()
            self._put(None, outbox)

    def _put(self, item: _Item, outbox: Outbox | None) -> None:
        if outbox is None:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        else:
            outbox.add(self._loop, self._queue, item)

    def buffered_s(self) -> float:
        """Audio produced but not yet taken by the consumer, in seconds."""
        return (self.produced_samples - self.consumed_samples) / SAMPLE_RATE

    # -- consumer side (event loop) ---------------------------------------------------
    async def get(self) -> _Item:
        item = await self._queue.get()
        if isinstance(item, AudioChunk):
            self.consumed_samples += item.pcm.shape[0]
            if not self.stats.t_first_audio:
                self.stats.t_first_audio = time.monotonic()
        return item


def _log_first(st: StreamStats) -> None:
    """Where a stream's time to its first chunk went (``-vv``)."""
    ms = 1000.0
    log.debug(
        "first chunk made %.0f ms after submit: %.0f ms to a slot, prefill %.0f ms (%.0f ms "
        "its own; %d rows, %d cached, %d pieces), %d steps in %.0f ms (%.1f ms a tick), %.0f ms "
        "to the codec's chunk",
        ms * (st.t_first_made - st.t_submit), ms * (st.t_admitted - st.t_submit),
        ms * (st.t_prefilled - st.t_admitted), ms * st.prefill_s, st.prompt_rows, st.prefix_cached_rows,
        st.prefill_ticks, st.steps, ms * st.step_s,
        ms * st.step_s / max(1, st.steps),
        ms * (st.t_first_made - st.t_prefilled - st.step_s))
