"""``engine.stream()`` for text longer than one generation fits in the context.

The text is cut at sentence/clause boundaries (the server's segmenter) and the
segments are spoken back to back in one voice (:mod:`streamtts.engine.segmented`),
pipelined so the next segment generates while the current one plays. To the
caller it is one stream of :class:`AudioChunk` with continuous frame numbers.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator
from typing import Any

import numpy as np

from ..request import AudioChunk, ReferenceLike, StreamOptions, StreamStats, Voice
from .segmented import SegmentAudio, SegmentDone, speak_segments


class LongTextStream:
    """The chunks of ``segments`` spoken in one voice, numbered as one stream.

    :class:`streamtts.engine.AudioStream` delegates to it when the preparer found the
    text too long for one generation; ``stats`` accumulates every segment's numbers.
    """

    def __init__(
        self, engine: Any, segments: list[str], reference: ReferenceLike, options: StreamOptions,
        stats: StreamStats | None = None,
    ) -> None:
        self.segments = segments
        self.stats = stats if stats is not None else StreamStats(t_submit=time.monotonic())
        self._engine = engine
        self._n_vq = engine.ids.n_vq
        self._reference = reference
        self._options = options
        self._events: AsyncGenerator[Any, None] | None = None
        self._frames = 0

    async def _start(self) -> AsyncGenerator[Any, None]:
        ref = self._reference
        if ref is not None and not isinstance(ref, Voice):  # a clip: encode it once for all segments
            ref = await self._engine.encode_voice(ref)
        return speak_segments(self._engine, self.segments, reference=ref, options=self._options)

    def __aiter__(self) -> LongTextStream:
        return self

    async def __anext__(self) -> AudioChunk:
        st = self.stats
        if self._events is None:
            self._events = await self._start()
        while True:
            try:
                ev = await self._events.__anext__()
            except StopAsyncIteration:
                st.t_done = time.monotonic()
                raise
            if isinstance(ev, SegmentDone):
                self._merge(ev.stats)
                continue
            assert isinstance(ev, SegmentAudio)
            if ev.pcm.shape[0] == 0 and ev.frames == 0 and not ev.words:
                continue
            if not st.t_first_audio:
                st.t_first_audio = time.monotonic()
            codes = ev.codes if ev.codes is not None else np.zeros((0, self._n_vq), np.int64)
            first = self._frames
            self._frames += ev.frames
            return AudioChunk(
                pcm=ev.pcm, frames=range(first, self._frames), codes=codes, step=-1, words=ev.words
            )

    def _merge(self, s: StreamStats) -> None:
        st = self.stats
        st.prompt_rows += s.prompt_rows
        st.steps += s.steps
        st.frames += s.frames
        st.prepare_s += s.prepare_s
        st.step_s += s.step_s
        st.decode_s += s.decode_s
        st.decode_windows += s.decode_windows
        st.finish_reason = s.finish_reason
        if not st.t_admitted:
            st.t_admitted, st.t_prefilled = s.t_admitted, s.t_prefilled

    async def __aenter__(self) -> LongTextStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._events is not None:
            with contextlib.suppress(RuntimeError):  # already running/closed
                await self._events.aclose()
