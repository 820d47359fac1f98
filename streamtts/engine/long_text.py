"""``engine.stream()`` for text longer than one generation fits in the context.

The preparer cuts the normalised text at sentence/clause boundaries (the server's
segmenter) and the segments are spoken back to back in one voice
(:mod:`streamtts.engine.segmented`), pipelined so the next segment generates while the
current one plays. To the caller it is one stream of :class:`AudioChunk` with
continuous frame numbers. A dialogue stays one conversation: every segment carries every
speaker's voice, and a segment cut inside a turn starts with that turn's tag (the
segmenter); a continuation's prefix is continued by the first segment only.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator

import msgspec

from ..request import AudioChunk, StreamOptions, StreamStats, Voice
from .segmented import SegmentAudio, SegmentDone, SegmentEvent, SpeechEngine, speak_segments


class LongTextStream:
    """The chunks of ``segments`` spoken in one voice, numbered as one stream.

    :class:`streamtts.engine.AudioStream` delegates to it when the preparer found the
    text too long for one generation; ``stats`` accumulates every segment's numbers.
    ``segments`` are the text as it is to be spoken (normalised already, when
    normalisation is on): each segment's request does not normalise it again.
    """

    def __init__(
        self, engine: SpeechEngine, segments: list[str], voice: Voice | None, options: StreamOptions,
        stats: StreamStats,
        *,
        speakers: dict[str, Voice] | None = None,
        prefix: Voice | None = None,
    ) -> None:
        self.segments = segments
        self.stats = stats
        self._engine = engine
        self._voice = voice
        self._speakers = speakers
        self._prefix = prefix
        self._options = msgspec.structs.replace(options, normalize=False)
        self._events: AsyncGenerator[SegmentEvent, None] | None = None
        self._frames = 0
        self.done = 0  # segments spoken to their end (progress: `synth` shows it)

    def __aiter__(self) -> LongTextStream:
        return self

    async def __anext__(self) -> AudioChunk:
        st = self.stats
        if self._events is None:
            self._events = speak_segments(
                self._engine, self.segments, reference=self._voice, options=self._options,
                speakers=self._speakers, prefix=self._prefix,
            )  # fmt: skip
        while True:
            try:
                ev = await self._events.__anext__()
            except StopAsyncIteration:
                st.t_done = time.monotonic()
                raise
            if isinstance(ev, SegmentDone):
                self._merge(ev.stats)
                self.done += 1
                continue
            assert isinstance(ev, SegmentAudio)  # speak_segments raises a failed segment's error
            if ev.pcm.shape[0] == 0 and ev.frames == 0 and not ev.words:
                continue  # nothing to hand out (a segment's last event may carry only words)
            if not st.t_first_audio:
                st.t_first_audio = time.monotonic()
            first = self._frames
            self._frames += ev.frames
            return AudioChunk(pcm=ev.pcm, frames=range(first, self._frames), codes=ev.codes, step=-1, words=ev.words)

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
