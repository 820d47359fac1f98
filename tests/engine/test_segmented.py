"""streamtts.engine.segmented: segments spoken back to back in one voice, with clean joins.

Most tests use a scripted stand-in for the engine (exact control of timing and
codes); the last ones run the real engine on the demo model.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streamtts.config import SamplingParams
from streamtts.constants import FRAME_S
from streamtts.engine.decoding import _END_RAMP, END_FADE_SAMPLES, fade_out_end
from streamtts.engine.segmented import (
    SegmentAudio,
    SegmentDone,
    SegmentedSpeech,
    SegmentFailed,
    SegmentJoiner,
    speak_segments,
)
from streamtts.errors import InputError
from streamtts.request import AudioChunk, StreamOptions, StreamStats, Voice

FS = 1920  # samples per frame


class FakeStream:
    """Constant 0.5 audio, its end faded out as the engine's decode thread fades it."""

    def __init__(self, eng: FakeEngine, text: str, reference: Any, options: StreamOptions) -> None:
        self.eng, self.text, self.reference, self.options = eng, text, reference, options
        self.stats = StreamStats(t_submit=time.monotonic())
        self.finished = False
        self.aborted = False
        self.base = len(eng.streams) * 100  # codes of stream i are 100 i + frame

    async def __aenter__(self) -> FakeStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self.finished:
            self.aborted = True
        self.eng.running -= 1

    def __aiter__(self) -> AsyncIterator[AudioChunk]:
        return self._gen()

    async def _gen(self) -> AsyncIterator[AudioChunk]:
        self.eng.running += 1
        self.eng.max_running = max(self.eng.max_running, self.eng.running)
        self.t_start = time.monotonic()
        if self.text.startswith("FAIL"):
            raise InputError(f"cannot say {self.text!r}")
        n = int(self.text.split()[0]) if self.text.split()[0].isdigit() else 3
        for f in range(n):
            await asyncio.sleep(self.eng.step_s)
            pcm = np.full(FS, 0.5, np.float32)
            if f == n - 1:
                fade_out_end(pcm)
            codes = np.full((1, 32), self.base + f, np.int64)
            if not self.stats.t_first_audio:
                self.stats.t_first_audio = time.monotonic()
            yield AudioChunk(pcm=pcm, frames=range(f, f + 1), codes=codes, step=f + 31, is_last=f == n - 1)
        self.finished = True
        self.stats.finish_reason = "audio_end"
        self.t_end = time.monotonic()


class FakeEngine:
    def __init__(self, step_s: float = 0.002) -> None:
        self.step_s = step_s
        self.streams: list[FakeStream] = []
        self.running = 0
        self.max_running = 0
        self.ended_sessions: list[int] = []

    def stream(self, text: str, *, reference: Any = None, options: StreamOptions | None = None) -> FakeStream:
        s = FakeStream(self, text, reference, options or StreamOptions())
        self.streams.append(s)
        return s

    def end_session(self, session: int) -> None:
        self.ended_sessions.append(session)


async def collect(sp: SegmentedSpeech) -> list[Any]:
    return [ev async for ev in sp.events()]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_without_a_reference_the_first_segment_becomes_the_voice() -> None:
    eng = FakeEngine()

    async def main() -> list[Any]:
        sp = SegmentedSpeech(eng, continuity_frames=2, fade_ms=0)
        for t in ("3 one", "2 two", "4 three"):
            sp.add(t)
        sp.end()
        return await collect(sp)

    events = run(main())
    s0, s1, s2 = eng.streams
    assert s0.reference is None
    assert isinstance(s1.reference, Voice) and s1.reference is s2.reference
    assert s1.reference.codes[:, 0].tolist() == [0, 1]  # the first 2 frames of segment 0
    done = [e for e in events if isinstance(e, SegmentDone)]
    assert [(d.index, d.start_frame, d.frames) for d in done] == [(0, 0, 3), (1, 3, 2), (2, 5, 4)]


def test_until_the_voice_is_fixed_segments_run_one_at_a_time() -> None:
    eng = FakeEngine()

    async def main() -> None:
        sp = SegmentedSpeech(eng, continuity_frames=100, lookahead=1, fade_ms=0)
        sp.add("5 a")
        sp.add("5 b")
        sp.end()
        await collect(sp)

    run(main())
    s0, s1 = eng.streams
    assert s1.t_start >= s0.t_end  # segment 0 had to finish (fewer than 100 frames)
    assert isinstance(s1.reference, Voice) and s1.reference.codes.shape[0] == 5


def test_with_a_voice_the_next_segment_generates_while_the_previous_does() -> None:
    eng = FakeEngine(step_s=0.01)
    voice = Voice(codes=np.ones((4, 32), np.int64))

    async def main() -> list[Any]:
        sp = SegmentedSpeech(eng, reference=voice, lookahead=1, fade_ms=0, options=StreamOptions(seed=10))
        for t in ("6 a", "6 b", "6 c"):
            sp.add(t)
        sp.end()
        return await collect(sp)

    events = run(main())
    assert all(s.reference is voice for s in eng.streams)
    assert eng.max_running == 2  # lookahead 1: the current segment and the next
    s0, s1, _ = eng.streams
    assert s1.t_start < s0.t_end
    assert [s.options.seed for s in eng.streams] == [10, 11, 12]
    # audio still comes out strictly in segment order
    order = [e.index for e in events if isinstance(e, SegmentAudio)]
    assert order == sorted(order)
    assert sum(e.frames for e in events if isinstance(e, SegmentAudio)) == 18


def test_lookahead_zero_is_sequential() -> None:
    eng = FakeEngine()

    async def main() -> None:
        sp = SegmentedSpeech(eng, reference=Voice(codes=np.ones((4, 32), np.int64)), lookahead=0)
        for t in ("3 a", "3 b", "3 c"):
            sp.add(t)
        sp.end()
        await collect(sp)

    run(main())
    assert eng.max_running == 1


def test_a_failed_segment_is_reported_in_order_and_the_rest_continue() -> None:
    eng = FakeEngine()

    async def main() -> list[Any]:
        sp = SegmentedSpeech(eng, continuity_frames=2)
        for t in ("2 a", "FAIL b", "2 c"):
            sp.add(t)
        sp.end()
        return await collect(sp)

    events = run(main())
    kinds = [(type(e).__name__, e.index) for e in events if not isinstance(e, SegmentAudio)]
    assert kinds == [("SegmentDone", 0), ("SegmentFailed", 1), ("SegmentDone", 2)]
    failed = next(e for e in events if isinstance(e, SegmentFailed))
    assert isinstance(failed.error, InputError)

    async def strict() -> None:
        async for _ in speak_segments(FakeEngine(), ["2 a", "FAIL b"]):
            pass

    with pytest.raises(InputError):
        run(strict())


def test_closing_the_events_aborts_every_generation() -> None:
    eng = FakeEngine(step_s=0.02)

    async def main() -> None:
        sp = SegmentedSpeech(eng, reference=Voice(codes=np.ones((4, 32), np.int64)), lookahead=1)
        for t in ("50 a", "50 b", "50 c"):
            sp.add(t)
        sp.end()
        events = sp.events()
        async for ev in events:
            if isinstance(ev, SegmentAudio) and ev.frames:
                break
        await events.aclose()

    run(main())
    assert len(eng.streams) == 2  # the third never started
    assert all(s.aborted for s in eng.streams)
    assert eng.running == 0


def test_cancelling_the_consumer_task_aborts_too() -> None:
    eng = FakeEngine(step_s=0.02)

    async def main() -> None:
        sp = SegmentedSpeech(eng)
        sp.add("100 long")
        seen = asyncio.Event()

        async def consume() -> None:
            async with contextlib.aclosing(sp.events()) as events:
                async for _ in events:
                    seen.set()

        task = asyncio.create_task(consume())
        await seen.wait()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    run(main())
    assert eng.streams[0].aborted and eng.running == 0


def test_segments_added_later_are_spoken_later() -> None:
    eng = FakeEngine()

    async def main() -> list[Any]:
        sp = SegmentedSpeech(eng, continuity_frames=1)

        async def feed() -> None:
            sp.add("2 a")
            await asyncio.sleep(0.05)
            sp.add("2 b")
            await asyncio.sleep(0.05)
            sp.end()

        feeder = asyncio.create_task(feed())
        out = await collect(sp)
        await feeder
        return out

    events = run(main())
    assert [e.index for e in events if isinstance(e, SegmentDone)] == [0, 1]


@pytest.mark.parametrize("sizes", [[1920, 1920, 1920], [7, 300, 5000, 0], [50, 50, 50, 0], [3000], [0, 100, 0]])
def test_joiner_fades_in_the_segment_and_leaves_the_rest(sizes: list[int]) -> None:
    rng = np.random.default_rng(0)
    chunks = [rng.uniform(-1, 1, n).astype(np.float32) for n in sizes]
    kept = [c.copy() for c in chunks]
    j = SegmentJoiner(120)
    out = [j.push(c) for c in chunks]
    assert [o.size for o in out] == sizes  # nothing held back
    got = np.concatenate(out)
    whole = np.concatenate(chunks)
    ramp = 0.5 - 0.5 * np.cos(np.pi * (np.arange(120) + 0.5) / 120)
    want = whole.copy()
    k = min(120, want.size)
    want[:k] *= ramp[:k].astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-7)
    assert all(np.array_equal(a, b) for a, b in zip(chunks, kept, strict=True))  # inputs intact


def test_joins_have_no_step() -> None:
    eng = FakeEngine()

    async def main() -> np.ndarray:
        sp = SegmentedSpeech(eng, continuity_frames=1, fade_ms=5.0)
        for t in ("3 a", "3 b"):
            sp.add(t)
        sp.end()
        return np.concatenate([e.pcm for e in await collect(sp) if isinstance(e, SegmentAudio)])

    pcm = run(main())
    assert pcm.size == 6 * FS
    join = 3 * FS
    assert abs(float(pcm[join] - pcm[join - 1])) < 0.01  # 0.5 -> 0.5 through a fade: no click
    assert np.max(np.abs(np.diff(pcm))) < 0.5 * np.pi / 120 + 1e-6  # the steepest slope is the ramp's
    assert pcm[FS] == 0.5  # inside a segment: untouched
    # the end fade is the engine's, applied once (not faded again here)
    n = END_FADE_SAMPLES
    np.testing.assert_array_equal(pcm[join - n : join], np.float32(0.5) * _END_RAMP)


# -- the real engine (demo model) ---------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(demo_model_dir: Path) -> Any:
    from streamtts.engine.frontend import Engine

    eng = Engine.from_config(demo_model_dir / "config.yaml", max_streams=4, n_threads=2)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(eng.start())
    yield eng, loop
    loop.run_until_complete(eng.aclose())
    loop.close()


def test_real_engine_segments_share_a_voice_and_join_cleanly(engine: Any) -> None:
    eng, loop = engine
    texts = ["Hello there, this is the first part.", "And here the second part follows."]

    async def main() -> list[Any]:
        return [ev async for ev in speak_segments(eng, texts, options=StreamOptions(seed=3), continuity_frames=20)]

    events = loop.run_until_complete(main())
    done = [e for e in events if isinstance(e, SegmentDone)]
    assert [d.text for d in done] == texts
    pcm = np.concatenate([e.pcm for e in events if isinstance(e, SegmentAudio)])
    assert pcm.size == sum(d.frames for d in done) * FS
    # segment 1 was prompted with segment 0's first 20 frames as its reference voice
    assert done[1].stats.prompt_rows - done[0].stats.prompt_rows >= 20 + 31
    j = done[1].start_frame * FS
    assert abs(float(pcm[j] - pcm[j - 1])) < 0.01
    assert abs(float(pcm[0])) < 0.01 and abs(float(pcm[-1])) < 0.01
    assert float(np.sqrt(np.mean(pcm**2))) > 1e-3  # not silence
    assert eng.active_streams == 0


def test_real_engine_counts_a_sessions_audio_in_hand_and_forgets_it_at_the_end(engine: Any) -> None:
    """The engine keeps when a session's listener runs dry (its next segment's urgency,
    chunk_policy.py) while the session runs, and drops it when the session ends."""
    eng, loop = engine
    policy = eng._core.policy
    forgot: list[tuple[int, float]] = []
    end = policy.end_session

    def end_session(session: int) -> None:
        if session in policy._session_due:
            forgot.append((session, policy._session_due[session][0]))
        end(session)

    policy.end_session = end_session
    try:
        async def main() -> list[Any]:
            events = [ev async for ev in speak_segments(eng, ["First part of it here.", "Then the second part."], continuity_frames=20)]
            async for _ in eng.stream("After it."):  # queued behind the session's end
                pass
            return events

        t0 = time.monotonic()
        events = loop.run_until_complete(main())
    finally:
        del policy.end_session
    longest = max(e.frames for e in events if isinstance(e, SegmentDone))
    assert len(forgot) == 1 and policy._session_due == {}
    assert forgot[0][1] >= t0 + longest * FRAME_S  # its listener had at least its longest segment


def test_real_engine_is_reproducible(engine: Any) -> None:
    eng, loop = engine
    texts = ["One short sentence to say here.", "Then another one to follow it."]

    # greedy: the two segments overlap, and llama.cpp's last bits depend on the batch, which
    # can flip a sampled code (see GREEDY in server/test_server.py)
    opts = StreamOptions(seed=11, sampling=SamplingParams.greedy())

    async def once() -> np.ndarray:
        parts = [
            ev.pcm
            async for ev in speak_segments(eng, texts, options=opts)
            if isinstance(ev, SegmentAudio)
        ]
        return np.concatenate(parts)

    a = loop.run_until_complete(once())
    b = loop.run_until_complete(once())
    assert np.array_equal(a, b)


def test_each_segment_tells_admission_its_session_and_what_runs_beside_it() -> None:
    eng = FakeEngine()
    voice = Voice(codes=np.ones((4, 32), np.int64))

    async def main() -> tuple[int, int]:
        a = SegmentedSpeech(eng, reference=voice, lookahead=1, fade_ms=0)
        for t in ("3 a", "3 b", "3 c"):
            a.add(t)
        a.end()
        await collect(a)
        b = SegmentedSpeech(eng, reference=voice, lookahead=1, fade_ms=0)
        b.add("3 alone")
        b.end()
        await collect(b)
        return a.session, b.session

    sa, sb = run(main())
    assert sa != sb and sa > 0 and sb > 0
    got = [(s.text, s.session, s.reserve, s.priority, s.next_queued) for s in eng.streams]
    # the next segments are room held by the first; the last one says no more are coming
    assert got == [
        ("3 a", sa, 1, False, True), ("3 b", sa, 1, True, True), ("3 c", sa, 0, True, False),
        ("3 alone", sb, 0, False, False),
    ]  # fmt: skip
    assert eng.ended_sessions == [sa, sb]  # each pipeline, when its events end, frees its room
