"""Speak a sequence of text segments back to back, in one voice, without seams.

Each segment is its own generation (``engine.stream``). This module chains
them for the server (streamed text, long inputs) and for any caller with text
longer than one generation fits in the context:

* **One voice.** With a reference voice every segment uses it. Without one,
  the first segment's own codes (its first ``continuity_frames`` frames)
  become the reference of every later segment, so the speaker never changes
  mid-way. Until that voice exists, segments run one at a time. The default
  of 16 frames (1.28 s) is a trade-off: a longer reference clones more
  surely, but segment 1 cannot start before segment 0 has produced it, and
  segment 1's first audio (32 steps after its start) must arrive before
  segment 0's audio has finished playing. Segment 1 starts at segment 0's
  step 16 + 31, so it is ready in time whenever segment 0 has at least
  about 49 frames, and otherwise needs a client buffer of (49 - frames of
  segment 0) steps: at a real-time factor of 0.75 (60 ms steps), a 3 s
  first segment (37 frames) needs 0.72 s, and a client holds about 0.84 s
  then (0.74 s generated ahead plus a 0.1 s pre-roll). With 25 frames the
  same case would need 1.26 s: a gap.
* **Dialogue.** With ``speakers`` (``S1`` -> Voice) every segment's prompt carries
  every speaker's voice (and the segmenter starts a segment cut inside a turn with that
  turn's tag): each generation knows who speaks its first words and every voice of the
  conversation. The voices are fixed from the start.
* **Continuation.** ``prefix`` (and its transcript ``prefix_text``) go to the first
  segment only: it continues that audio; later segments continue the conversation in the
  same voices, not the waveform.
* **Pipelining.** Once the voice is fixed, segment n+1 starts generating
  while segment n is still generating (``lookahead`` segments ahead; its
  chunks wait in memory), so it is ready before segment n finishes playing.
* **Clean joins.** Separate generations do not continue each other's
  waveform, so a join could step from one level to another (a click). Each
  segment's stream already ends faded out to 0 (the engine's decode thread
  fades every finished stream's last 5 ms, ``decoding.END_FADE_SAMPLES``: the
  one owner of the end fade); here each segment gets a ``fade_ms``
  raised-cosine fade-in at its start (5 ms by default: inaudible as a fade,
  enough to remove the step). The audio is otherwise untouched, and no chunk
  is held back.
* **Seeds.** With a seed S, segment i uses seed S + i: reproducible, yet
  segments do not repeat each other's sampling noise.

Cancelling (``aclose()`` of :meth:`SegmentedSpeech.events`, or cancelling the
task that iterates it) aborts every generation of the pipeline at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec
import numpy as np
import numpy.typing as npt

from ..constants import FRAME_S, SAMPLE_RATE
from ..request import (
    AudioChunk,
    ReferenceLike,
    SpeakersLike,
    StreamOptions,
    StreamStats,
    Voice,
    WordTime,
)
from ..request.voices import SegmentSpeakers

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_CONTINUITY_FRAMES",
    "DEFAULT_FADE_MS",
    "SegmentAudio",
    "SegmentDone",
    "SegmentFailed",
    "SegmentJoiner",
    "SegmentedSpeech",
    "SpeechEngine",
    "speak_segments",
]

DEFAULT_FADE_MS = 5.0
DEFAULT_CONTINUITY_FRAMES = 16  # the first 1.28 s of the first segment become the voice of the rest
_SEED_MASK = (1 << 63) - 1
_SESSIONS = itertools.count(1)

Float32Array = npt.NDArray[np.float32]


class SegmentStream(Protocol):
    """One generation as :class:`SegmentedSpeech` reads it (``Engine.stream``'s AudioStream)."""

    stats: StreamStats
    priority: bool  # set before it starts: a session's next segment (admitted first)
    session: int  # ... the pipeline it belongs to, and the streams that runs beside it
    reserve: int
    next_queued: bool  # ... and whether its next segment is queued already

    def __aiter__(self) -> AsyncIterator[AudioChunk]: ...

    async def __aenter__(self) -> object: ...

    async def __aexit__(self, *exc: object) -> None: ...


class SpeechEngine(Protocol):
    """What segmented speech needs of the engine: :meth:`streamtts.engine.frontend.Engine.stream`.

    Each stream's last chunk must end faded out (the engine's decode thread does it).
    """

    def stream(
        self,
        text: str,
        *,
        reference: ReferenceLike = ...,
        options: StreamOptions | None = ...,
        speakers: SpeakersLike | None = ...,
        prefix: ReferenceLike = ...,
        prefix_text: str | None = ...,
    ) -> SegmentStream: ...

    def end_session(self, session: int) -> None:
        """Session ``session`` (a :class:`SegmentedSpeech`'s) starts no more streams."""


class SegmentJoiner:
    """Fade-in over a segment's first samples (its end arrives faded out from the engine)."""

    def __init__(self, fade_samples: int) -> None:
        self.fade = max(0, int(fade_samples))
        n = self.fade
        # Raised cosine from ~0 to ~1 over n samples (never exactly 0 or 1 inside the ramp).
        self._ramp = (
            (0.5 - 0.5 * np.cos(np.pi * (np.arange(n) + 0.5) / n)).astype(np.float32) if n else None
        )
        self._pos = 0  # samples of this segment received so far

    def push(self, pcm: npt.ArrayLike) -> Float32Array:
        """The chunk's samples, faded in where they fall in the segment's first ``fade``."""
        new = np.asarray(pcm, dtype=np.float32).reshape(-1)
        n = self.fade
        if self._ramp is not None and self._pos < n and new.shape[0]:  # fade-in by segment position
            new = new.copy()  # the caller's chunk stays intact
            k = min(n - self._pos, new.shape[0])
            new[:k] *= self._ramp[self._pos : self._pos + k]
        self._pos += new.shape[0]
        return new


@dataclass(slots=True)
class SegmentAudio:
    """New audio of segment ``index`` (float32 24 kHz, joins already faded)."""

    index: int
    pcm: Float32Array
    frames: int  # audio frames this event completes
    codes: npt.NDArray[np.int64]  # those frames' codes
    # with StreamOptions.timestamps: words whose audio starts in this event or before, in
    # seconds of the whole pipeline's audio (estimated); None: not asked for
    words: list[WordTime] | None = None


@dataclass(slots=True)
class SegmentDone:
    index: int
    text: str
    start_frame: int  # in the whole pipeline's audio
    frames: int
    stats: StreamStats


@dataclass(slots=True)
class SegmentFailed:
    index: int
    text: str
    error: BaseException


SegmentEvent = SegmentAudio | SegmentDone | SegmentFailed


@dataclass(slots=True)
class _Gen:
    index: int
    text: str
    items: deque[AudioChunk | BaseException | None] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None
    stats: StreamStats | None = None
    codes: list[npt.NDArray[np.int64]] = field(default_factory=list)
    frames: int = 0  # frames collected towards the session voice
    joiner: SegmentJoiner | None = None  # set when its audio starts going out
    start: int = 0  # its first frame in the pipeline's audio


class SegmentedSpeech:
    """Segments in (``add``, ``end``), ordered audio events out (``events()``).

    ``engine`` is a started :class:`streamtts.engine.frontend.Engine` (any
    :class:`SpeechEngine`).
    """

    def __init__(
        self,
        engine: SpeechEngine,
        *,
        reference: Voice | None = None,
        options: StreamOptions | None = None,
        speakers: dict[str, Voice] | None = None,
        prefix: Voice | None = None,
        prefix_text: str | None = None,
        speaker_texts: Mapping[str, str] | None = None,
        lookahead: int = 1,
        continuity_frames: int = DEFAULT_CONTINUITY_FRAMES,
        fade_ms: float = DEFAULT_FADE_MS,
    ) -> None:
        self.engine = engine
        self.reference = reference
        self.options = options or StreamOptions()
        self.speakers = SegmentSpeakers(speakers) if speakers else None
        self.prefix = prefix
        self.prefix_text = prefix_text
        # the first segment continues the speakers' own clips (Engine.stream's speaker_texts)
        self.speaker_texts = dict(speaker_texts) if speaker_texts else None
        self.lookahead = max(0, lookahead)
        self.session = next(_SESSIONS)  # admission counts a session's streams together
        self.continuity_frames = max(1, continuity_frames)
        self.fade_samples = int(round(fade_ms * SAMPLE_RATE / 1000.0))
        self._pending: deque[tuple[int, str]] = deque()
        self._active: deque[_Gen] = deque()
        self._n_added = 0
        self._ended = False
        self._wake = asyncio.Event()
        self.frames = 0  # audio frames handed out so far
        self.t_first_text: float | None = None
        self.t_first_audio: float | None = None
        self.timing_rate: float | None = None  # the voice's speaking rate, once a segment ended

    # -- input -------------------------------------------------------------------------------
    def add(self, text: str) -> int:
        """Queue one segment; returns its index."""
        if self._ended:
            raise RuntimeError("add() after end()")
        i = self._n_added
        self._n_added += 1
        self._pending.append((i, text))
        if self.t_first_text is None:
            self.t_first_text = time.monotonic()
        self._wake.set()
        return i

    def end(self) -> None:
        """No more segments: ``events()`` finishes after the last one."""
        self._ended = True
        self._wake.set()

    @property
    def busy(self) -> bool:
        """Segments queued or generating."""
        return bool(self._pending or self._active)

    # -- output -----------------------------------------------------------------------------
    async def events(self) -> AsyncGenerator[SegmentEvent, None]:
        try:
            while True:
                self._wake.clear()
                self._start_ready()
                progressed = False
                if self._active:
                    async for ev in self._drain(self._active[0]):
                        progressed = True
                        yield ev
                if self._ended and not self._pending and not self._active:
                    return
                if not progressed:
                    await self._wake.wait()
        finally:
            await self._cancel_all()
            self.engine.end_session(self.session)  # the room it held for its next segments

    def _voice_ready(self) -> bool:
        return self.reference is not None or self.speakers is not None

    def _start_ready(self) -> None:
        while self._pending:
            if self._active and not (self._voice_ready() and len(self._active) <= self.lookahead):
                return  # one at a time until the voice is fixed; then `lookahead` ahead
            i, text = self._pending.popleft()
            g = _Gen(i, text)
            g.task = asyncio.create_task(self._run(g), name=f"segment-{i}")
            self._active.append(g)

    def _segment_options(self, index: int) -> StreamOptions:
        opts = self.options
        if self.timing_rate is not None and opts.timestamps not in (None, "none"):
            opts = msgspec.structs.replace(opts, timing_rate=self.timing_rate)
        seed = opts.seed
        if seed is None:
            return opts
        return msgspec.structs.replace(opts, seed=(seed + index) & _SEED_MASK)

    async def _run(self, g: _Gen) -> None:
        try:
            s = self.engine.stream(g.text, **self._voices(g.index), options=self._segment_options(g.index))
            s.priority = g.index > 0  # the session is under way: its next segment goes first
            # admission holds room for the segments this one runs beside (engine/waiting.py)
            s.session = self.session
            s.reserve = self.lookahead if self._pending or not self._ended else 0
            s.next_queued = bool(self._pending)
            g.stats = s.stats
            async with s:
                async for chunk in s:
                    g.items.append(chunk)
                    self._collect_voice(g, chunk)
                    self._wake.set()
            rate = getattr(s, "timing_rate", None)
            if rate is not None:
                self.timing_rate = rate
            g.items.append(None)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # reported in order as SegmentFailed
            g.items.append(exc)
        finally:
            self._finish_voice(g)
            self._wake.set()

    def _voices(self, index: int) -> dict[str, Any]:
        """The voice arguments of segment ``index``'s stream (only those set: an engine
        stand-in need not take the dialogue ones)."""
        kw: dict[str, Any] = {"reference": self.reference}
        if self.speakers is not None:
            kw = {"speakers": self.speakers}
        if index == 0 and self.prefix is not None:
            kw.update(prefix=self.prefix, prefix_text=self.prefix_text)
        if index == 0 and self.speaker_texts:
            kw["speaker_texts"] = self.speaker_texts
        return kw

    def _collect_voice(self, g: _Gen, chunk: AudioChunk) -> None:
        if self.reference is not None or self.speakers is not None or chunk.codes.shape[0] == 0:
            return
        g.codes.append(chunk.codes)
        g.frames += chunk.codes.shape[0]
        if g.frames >= self.continuity_frames:
            self._set_voice(g)

    def _finish_voice(self, g: _Gen) -> None:
        if self.reference is None and self.speakers is None and g.frames > 0:
            self._set_voice(g)

    def _set_voice(self, g: _Gen) -> None:
        codes = np.concatenate(g.codes)[: self.continuity_frames]
        self.reference = Voice(
            codes=np.ascontiguousarray(codes, dtype=np.int64), name=f"segment-{g.index}", session=self.session
        )
        g.codes = []
        log.debug("voice fixed from segment %d (%d frames)", g.index, codes.shape[0])
        self._wake.set()

    async def _drain(self, g: _Gen) -> AsyncIterator[SegmentEvent]:
        """Forward what segment ``g`` has produced so far; pop it when it is complete."""
        if g.joiner is None:
            g.joiner = SegmentJoiner(self.fade_samples)
            g.start = self.frames
        joiner = g.joiner
        while g.items:
            item = g.items.popleft()
            if isinstance(item, AudioChunk):
                n = len(item.frames)
                pcm = joiner.push(item.pcm)
                self.frames += n
                if self.t_first_audio is None and pcm.shape[0]:
                    self.t_first_audio = time.monotonic()
                words = None
                if item.words is not None:
                    words = [w.shifted(g.start * FRAME_S) for w in item.words]
                yield SegmentAudio(g.index, pcm, n, item.codes, words)
                continue
            self._active.popleft()
            if item is None:
                assert g.stats is not None
                yield SegmentDone(g.index, g.text, g.start, self.frames - g.start, g.stats)
            else:
                yield SegmentFailed(g.index, g.text, item)
            return

    async def _cancel_all(self) -> None:
        tasks = [g.task for g in self._active if g.task is not None and not g.task.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._active.clear()
        self._pending.clear()


async def speak_segments(
    engine: SpeechEngine,
    segments: Iterable[str],
    *,
    raise_errors: bool = True,
    **kwargs: Any,
) -> AsyncGenerator[SegmentEvent, None]:
    """All ``segments`` in one voice (``kwargs`` as :class:`SegmentedSpeech`).

    With ``raise_errors`` a failed segment raises its error (and aborts the
    rest); otherwise it is reported as :class:`SegmentFailed` and the next
    segment follows.
    """
    sp = SegmentedSpeech(engine, **kwargs)
    for text in segments:
        sp.add(text)
    sp.end()
    async with contextlib.aclosing(sp.events()) as events:
        async for ev in events:
            if raise_errors and isinstance(ev, SegmentFailed):
                raise ev.error
            yield ev
