"""Estimated word times on a stream's chunks (``StreamOptions.timestamps``).

The estimator (:class:`streamtts.timing.StreamAligner`) sees each chunk as the consumer
takes it and runs on a worker thread, so neither the engine thread nor the event loop
waits for it; the words whose start lies in the audio so far ride on that chunk.
"""

from __future__ import annotations

import asyncio

import numpy as np

from ..constants import SAMPLE_RATE
from ..request import AudioChunk, StreamOptions, WordTime
from ..timing import StreamAligner
from ..timing.modes import check_timestamps

__all__ = ["ChunkTimer", "wants_timestamps"]


def wants_timestamps(options: StreamOptions) -> bool:
    return check_timestamps(options.timestamps) != "none"


class ChunkTimer:
    """One generation's word times, chunk by chunk."""

    def __init__(self, text: str, options: StreamOptions) -> None:
        self.aligner = StreamAligner(text, SAMPLE_RATE, options.timing_rate)

    async def on_chunk(self, chunk: AudioChunk) -> AudioChunk:
        chunk.words = await asyncio.to_thread(self.aligner.push, chunk.pcm, chunk.is_last)
        return chunk

    async def rest(self, n_vq: int, next_frame: int) -> AudioChunk | None:
        """At the stream's end (no chunk said ``is_last``): a chunk without samples holding
        the words not sent yet; None when none are left."""
        if self.aligner.finished:
            return None
        words: list[WordTime] = await asyncio.to_thread(self.aligner.push, np.zeros(0, np.float32), True)
        if not words:
            return None
        return AudioChunk(
            pcm=np.zeros(0, np.float32),
            frames=range(next_frame, next_frame),
            codes=np.zeros((0, n_vq), np.int64),
            step=-1,
            is_last=True,
            words=words,
        )

    @property
    def measured_rate(self) -> float | None:
        return self.aligner.measured_rate
