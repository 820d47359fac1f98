"""Admission by measured capacity in the engine: a real engine on the demo model.

``realtime_margin`` 1000 leaves a tick 80 us of a frame: no tick fits, so the measured
capacity is one stream on any machine (a machine too slow for one still serves one).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from streamtts import Engine
from streamtts.errors import OverloadedError, QueueTimeoutError
from streamtts.request import StreamOptions


def capacity_engine(demo_model_dir: Path, deadline_s: float, warmup: bool = True) -> Engine:
    return Engine.from_config(
        demo_model_dir / "config.yaml", n_threads=1, max_streams=4, admission="capacity",
        realtime_margin=1000.0, first_audio_deadline_s=deadline_s, warmup=warmup,
    )  # fmt: skip


@contextlib.asynccontextmanager
async def measured_engine(demo_model_dir: Path, max_streams: int, margin: float = 0.0) -> AsyncIterator[Engine]:
    """Admission by capacity (margin 0: the demo model steps a few streams in a few ms of a
    frame's 80; 1000: one stream), after three streams that end (the finish rate measured)."""
    async with Engine.from_config(
        demo_model_dir / "config.yaml", n_threads=1, max_streams=max_streams, admission="capacity",
        realtime_margin=margin, first_audio_deadline_s=0.01,
    ) as e:  # fmt: skip
        for i in range(3):
            await e.generate("Short one.", options=StreamOptions(seed=i, fixed_frames=4))
        yield e


async def wait_until(cond: object) -> None:
    async with asyncio.timeout(120):  # a guard against a hang, not a margin: it fails the test
        while not cond():  # type: ignore[operator]
            await asyncio.sleep(0.01)


def test_at_capacity_a_new_stream_is_refused_at_once_and_a_continuation_waits(demo_model_dir: Path) -> None:
    async def main() -> None:
        async with capacity_engine(demo_model_dir, deadline_s=0.01) as e:
            for i in range(3):  # streams that end: the finish rate is measured
                await e.generate("Short one.", options=StreamOptions(seed=i, fixed_frames=4))
            info = e.admission_info()
            assert info["capacity_streams"] == 1 and info["finish_rate_per_s"] > 0
            # a long stream nobody reads: it holds the one stream of capacity (paused, not ended)
            held = e.stream("Held.", options=StreamOptions(seed=7, fixed_frames=100_000))
            it = aiter(held)
            await anext(it)
            await wait_until(lambda: e.active_streams == 1)
            refused0 = e.admission_info()["refused"]
            late = e.stream("Refused.", options=StreamOptions(seed=8))
            with pytest.raises(OverloadedError) as exc:
                await anext(aiter(late))
            assert not isinstance(exc.value, QueueTimeoutError)  # refused, not timed out
            assert exc.value.retry_after_s is not None and exc.value.retry_after_s >= 1
            assert "capacity" in str(exc.value)
            assert e.admission_info()["refused"] == refused0 + 1
            # a session's next segment is never refused for capacity: it waits for the slot
            nxt = e.stream("Next segment.", options=StreamOptions(seed=9, fixed_frames=6))
            nxt.priority = True
            got = asyncio.create_task(_drain(nxt))
            await wait_until(lambda: e.queued_streams == 1)
            await held.aclose()  # the slot frees: the continuation starts
            assert await got == 6
            assert e.active_streams == 0

    asyncio.run(main())


async def _drain(s: object) -> int:
    frames = 0
    async with s:  # type: ignore[attr-defined]
        async for chunk in s:  # type: ignore[attr-defined]
            frames += len(chunk.frames)
    return frames


def test_a_queued_new_stream_expires_at_its_deadline(demo_model_dir: Path) -> None:
    async def main() -> None:
        # one stream has ended (no warm-up): the wait is unknown, so a new stream queues
        async with capacity_engine(demo_model_dir, deadline_s=0.2, warmup=False) as e:
            await e.generate("Warm.", options=StreamOptions(seed=1, fixed_frames=4))  # ticks timed
            held = e.stream("Held.", options=StreamOptions(seed=7, fixed_frames=100_000))
            it = aiter(held)
            await anext(it)
            queued0 = e.admission_info()["queued"]
            with pytest.raises(QueueTimeoutError) as exc:
                await e.generate("Waits.", options=StreamOptions(seed=8))
            assert "0.2 s" in str(exc.value)
            assert e.admission_info()["queued"] == queued0 + 1
            await held.aclose()

    asyncio.run(main())


def test_a_queued_new_stream_is_refused_once_its_expected_wait_passes_the_deadline(demo_model_dir: Path) -> None:
    async def main() -> None:
        async with capacity_engine(demo_model_dir, deadline_s=5.0) as e:  # capacity 1
            for i in range(3):  # streams end quickly: a slot is expected well within 5 s
                await e.generate("Short one.", options=StreamOptions(seed=i, fixed_frames=4))
            held = e.stream("Held.", options=StreamOptions(seed=7, fixed_frames=100_000))
            it = aiter(held)
            await anext(it)
            before = e.admission_info()
            # it queues; as no stream ends, the measured rate falls (the rate since the first
            # of those ends) and the expected wait, counted from when it came, passes 5 s
            # while the wait itself has not: refused then, not timed out at the deadline
            with pytest.raises(OverloadedError) as exc:
                await e.generate("Waits.", options=StreamOptions(seed=8))
            assert type(exc.value) is OverloadedError  # not QueueTimeoutError
            assert "capacity" in str(exc.value) and "5 s" in str(exc.value)
            after = e.admission_info()
            assert after["queued"] == before["queued"] + 1 and after["refused"] == before["refused"] + 1
            assert e.active_streams == 1  # the held stream runs on
            await held.aclose()

    asyncio.run(main())


def test_slots_admission_ignores_capacity(demo_model_dir: Path) -> None:
    async def main() -> list[int]:
        e = Engine.from_config(demo_model_dir / "config.yaml", n_threads=1, max_streams=3, realtime_margin=1000.0)
        async with e:
            assert e.config.admission == "slots"
            outs = await asyncio.gather(*(
                _drain(e.stream("Three at once.", options=StreamOptions(seed=i, fixed_frames=5))) for i in range(3)
            ))  # fmt: skip
            return list(outs)

    assert asyncio.run(main()) == [5, 5, 5]


def test_a_sessions_next_segment_starts_before_a_new_stream(demo_model_dir: Path) -> None:
    async def main() -> tuple[float, float]:
        # streams that end: the finish rate is known, and a wait far inside 30 s is expected
        async with capacity_engine(demo_model_dir, deadline_s=30.0, warmup=False) as e:
            for i in range(3):
                await e.generate("Warm.", options=StreamOptions(seed=1 + i, fixed_frames=4))
            held = e.stream("Held.", options=StreamOptions(seed=7, fixed_frames=100_000))
            it = aiter(held)
            await anext(it)
            new = e.stream("A new session.", options=StreamOptions(seed=8, fixed_frames=6))
            first = asyncio.create_task(_drain(new))
            await wait_until(lambda: e.queued_streams == 1)
            nxt = e.stream("Next segment.", options=StreamOptions(seed=9, fixed_frames=6))
            nxt.priority = True  # queued after the new stream, starts before it
            second = asyncio.create_task(_drain(nxt))
            await wait_until(lambda: e.queued_streams == 2)
            await held.aclose()
            assert await first == 6 and await second == 6
            return nxt.stats.t_admitted, new.stats.t_admitted

    nxt_at, new_at = asyncio.run(main())
    assert nxt_at < new_at


def test_a_new_session_needs_room_for_the_segments_it_runs_ahead(demo_model_dir: Path) -> None:
    async def main() -> None:
        async with measured_engine(demo_model_dir, max_streams=2) as e:  # capacity 2: the hard cap
            assert e.admission_info()["capacity_streams"] == 2
            # a session of several segments: its first runs, its next will run beside it
            first = e.stream("Held.", options=StreamOptions(seed=7, fixed_frames=100_000))
            first.session, first.reserve = 41, 1
            await anext(aiter(first))
            assert e.active_streams == 1
            # one stream running of 2: a lone stream would fit, but the room is the session's
            lone = e.stream("Refused.", options=StreamOptions(seed=8))
            with pytest.raises(OverloadedError):
                await anext(aiter(lone))
            # the session's next segment takes the room held for it
            nxt = e.stream("Next segment.", options=StreamOptions(seed=9, fixed_frames=6))
            nxt.priority, nxt.session, nxt.reserve = True, 41, 0
            assert await _drain(nxt) == 6
            # its last segment said no more are coming: the room is free again
            fits = e.stream("Fits now.", options=StreamOptions(seed=10, fixed_frames=4))
            assert await _drain(fits) == 4
            await first.aclose()

    asyncio.run(main())


def test_an_idle_engine_starts_a_session_it_has_no_room_to_run_ahead_for(demo_model_dir: Path) -> None:
    async def main() -> int:
        async with measured_engine(demo_model_dir, max_streams=4, margin=1000.0) as e:  # capacity 1
            assert e.admission_info()["capacity_streams"] == 1
            s = e.stream("A session of several segments.", options=StreamOptions(seed=5, fixed_frames=5))
            s.session, s.reserve = 42, 1
            return await _drain(s)

    assert asyncio.run(main()) == 5


def test_a_sessions_next_segment_takes_the_room_its_session_holds_though_capacity_fell(demo_model_dir: Path) -> None:
    async def main() -> tuple[int, int]:
        async with measured_engine(demo_model_dir, max_streams=4, margin=1000.0) as e:  # capacity 1
            assert e.admission_info()["capacity_streams"] == 1
            # an idle engine starts a session of two segments: its room for the next is held
            # though the capacity is under it (as when the capacity falls after admission)
            first = e.stream("Held.", options=StreamOptions(seed=7, fixed_frames=100_000))
            first.session, first.reserve = 43, 1
            await anext(aiter(first))
            nxt = e.stream("Next segment.", options=StreamOptions(seed=9, fixed_frames=6))
            nxt.priority, nxt.session, nxt.reserve = True, 43, 0
            # it starts beside the first (waiting for the capacity, it would wait for the first
            # to end, while a listener plays the first's last audio)
            async with asyncio.timeout(120):  # a guard against a hang, not a margin
                frames = await _drain(nxt)
            running = e.active_streams
            # the room it took is gone: a new stream is refused
            with pytest.raises(OverloadedError):
                await anext(aiter(e.stream("Refused.", options=StreamOptions(seed=10))))
            await first.aclose()
            return frames, running

    assert asyncio.run(main()) == (6, 1)


@pytest.mark.parametrize("next_queued", [True, False])
def test_a_session_between_two_segments_keeps_its_room_until_it_ends(demo_model_dir: Path, next_queued: bool) -> None:
    """Between two segments of a text known in full, a session runs no stream (its next starts
    as its listener plays into the one before): its room stays its own, until
    ``end_session``. A session of streamed text (next segment not queued) holds none."""

    async def main() -> None:
        async with measured_engine(demo_model_dir, max_streams=2) as e:
            assert e.admission_info()["capacity_streams"] == 2
            first = e.stream("First segment.", options=StreamOptions(seed=7, fixed_frames=4))
            first.session, first.reserve, first.next_queued = 44, 1, next_queued
            assert await _drain(first) == 4
            await wait_until(lambda: e.active_streams == 0)
            lone = e.stream("A new stream.", options=StreamOptions(seed=8, fixed_frames=4))
            if not next_queued:
                assert await _drain(lone) == 4  # no room held: it starts
                return
            with pytest.raises(OverloadedError):  # the session's 2 of 2 are held
                await anext(aiter(lone))
            assert e._core is not None and e._core.waiting.demand == 2
            e.end_session(44)  # a command to the engine thread: applied when it comes
            await wait_until(lambda: e._core is not None and e._core.waiting.demand == 0)
            fits = e.stream("Fits now.", options=StreamOptions(seed=9, fixed_frames=4))
            assert await _drain(fits) == 4

    asyncio.run(main())


def test_the_room_sessions_hold_counts_towards_raising_the_limit(demo_model_dir: Path) -> None:
    """A session between two segments holds room and runs nothing: windows in time beside it
    are evidence for the streams admission counts (its room included), or the limit, which
    must near it to rise, stayed where the held room kept the streams running below it."""

    async def main() -> None:
        async with measured_engine(demo_model_dir, max_streams=16) as e:
            assert e._core is not None
            cap = e._core.admission
            cap.limit, cap.slow_start = 5.0, True  # a slow start that got to 5
            # two sessions between segments: each holds room for 2 (its next and the one after)
            for sid in (45, 46):
                s = e.stream("A segment.", options=StreamOptions(seed=sid, fixed_frames=4))
                s.session, s.reserve, s.next_queued = sid, 1, True
                assert await _drain(s) == 4
            # one stream read as fast as it comes: windows of ticks stepping 1 beside 4 held
            long = e.stream("Long.", options=StreamOptions(seed=9, fixed_frames=100_000))
            it = aiter(long)
            async with asyncio.timeout(120):  # a guard against a hang, not a margin
                while cap.limit < 8:
                    await anext(it)
            await long.aclose()
            e.end_session(45)
            e.end_session(46)

    asyncio.run(main())


def test_the_share_of_steps_that_complete_a_frame_is_counted_per_stream(demo_model_dir: Path) -> None:
    """Short streams spend most of their steps before their first frame (the delay pattern):
    the capacity's budget per tick shrinks by the share of steps that made a frame."""

    async def main() -> None:
        async with Engine.from_config(
            demo_model_dir / "config.yaml", n_threads=1, max_streams=2, admission="capacity",
        ) as e:  # fmt: skip
            assert e.admission_info()["frames_per_step"] == 1.0  # nothing ended yet: a frame a step
            frames = steps = 0
            for i in range(3):
                out = await e.generate("Short one.", options=StreamOptions(seed=i, fixed_frames=4))
                frames, steps = frames + out.stats.frames, steps + out.stats.steps
            assert frames == 12 and steps >= 12 + 3 * 31
            # 64 made-up steps that each made a frame start the count (decayed a little since)
            assert e.admission_info()["frames_per_step"] == pytest.approx((64 + frames) / (64 + steps), abs=0.02)

    asyncio.run(main())
