"""The hand-off of stream output from the engine's threads to event loops (engine/sink.py).

An :class:`Outbox` gathers what one codec call produced for many streams and hands it
to each event loop in one ``call_soon_threadsafe``: each such call writes to the loop's
self-pipe and wakes it, and with 128 streams a call's chunks were 16 wake-ups where one
does (each stream's items keep their order).
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from .stream import AudioChunk, StreamStats

__all__ = ["ChunkSink", "Outbox"]

_Item = AudioChunk | BaseException | None  # None = end of stream


class Outbox:
    """Items for the queues of several sinks, handed over by :meth:`flush`, in order."""

    def __init__(self) -> None:
        self._items: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[_Item], _Item]]] = {}

    def add(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[_Item], item: _Item) -> None:
        self._items.setdefault(loop, []).append((queue, item))

    def flush(self) -> None:
        """One ``call_soon_threadsafe`` per event loop for everything added since the last."""
        items, self._items = self._items, {}
        for loop, batch in items.items():
            loop.call_soon_threadsafe(_put_all, batch)


def _put_all(batch: list[tuple[asyncio.Queue[_Item], _Item]]) -> None:
    for queue, item in batch:
        queue.put_nowait(item)


class ChunkSink(Protocol):
    """Where the engine and decode threads put one stream's output (engine/sink.py's
    StreamSink): chunks, then an end or an error; the consumer's progress read back."""

    stats: StreamStats
    cancelled: bool  # the consumer went away: the engine frees the slot
    consumed_samples: int  # samples the consumer took (the scheduler's slack)

    def put_chunk(self, chunk: AudioChunk, outbox: Outbox | None = None) -> None: ...

    def fail(self, exc: BaseException) -> None: ...

    def finish(self, outbox: Outbox | None = None) -> None: ...
