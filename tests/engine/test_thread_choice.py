"""The engine's thread count per decode (engine/thread_tuner.py) on the real bridge."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from streamtts import Engine
from streamtts.engine import assemble
from streamtts.engine.thread_tuner import FIRST_PROBE, PROBE_ROUNDS
from streamtts.request import StreamOptions

FRAMES = 3 * (FIRST_PROBE + 2 * PROBE_ROUNDS)  # one-row decodes enough for a probe


async def codes_of(e: Engine) -> np.ndarray:
    chunks = [c async for c in e.stream("Threads chosen as it goes.", options=StreamOptions(seed=5, fixed_frames=FRAMES))]
    return np.concatenate([c.codes for c in chunks])


def test_automatic_threads_are_chosen_per_decode_and_the_audio_is_the_same(
    demo_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(assemble, "_auto_threads", lambda: 2)  # whatever this machine's cores

    async def main() -> tuple[np.ndarray, np.ndarray, dict[int, int]]:
        async with Engine.from_config(demo_model_dir / "config.yaml", n_threads=1, max_streams=2) as fixed:
            assert fixed._core is not None and fixed._core.calls.tuner is None  # a count given: kept
            assert fixed.threads_chosen() == {}
            want = await codes_of(fixed)
        async with Engine.from_config(demo_model_dir / "config.yaml", n_threads=0, max_streams=2) as auto:
            assert auto._core is not None
            tuner = auto._core.calls.tuner
            assert tuner is not None and tuner.candidates == (1, 2)
            got = await codes_of(auto)
            assert auto.threads_chosen() == tuner.chosen()
            return want, got, tuner.chosen()

    want, got, chosen = asyncio.run(main())
    assert chosen.get(1) in (1, 2)  # one-row decodes probed both counts and chose one
    np.testing.assert_array_equal(got, want)  # the bits do not depend on the count


@pytest.mark.skipif(sys.platform != "linux" or len(os.sched_getaffinity(0)) < 2, reason="Linux, 2+ CPUs allowed")
@pytest.mark.parametrize("pin", [True, False])
def test_the_engine_thread_keeps_one_cpu_when_threads_are_pinned(
    demo_model_dir: Path, monkeypatch: pytest.MonkeyPatch, pin: bool
) -> None:
    """``pin_threads`` (the default): decoding on two threads, the engine thread keeps the
    CPU llama.cpp's pool left for it, and the caller's CPUs are its own still; off, the
    kernel places it."""
    monkeypatch.setattr(assemble, "_auto_threads", lambda: 2)
    mine = os.sched_getaffinity(0)

    async def main() -> set[int]:
        async with Engine.from_config(demo_model_dir / "config.yaml", n_threads=0, max_streams=2, pin_threads=pin) as e:
            assert e._core is not None and e._core.calls.tuner is not None
            monkeypatch.setattr(e._core.calls.tuner, "threads", lambda rows: 2)
            await codes_of(e)
            return os.sched_getaffinity(e._core._thread.native_id or 0)

    engine_cpus = asyncio.run(main())
    assert engine_cpus == ({sorted(mine)[1]} if pin else mine)
    assert os.sched_getaffinity(0) == mine


@pytest.mark.skipif(sys.platform != "linux" or len(os.sched_getaffinity(0)) < 2, reason="Linux, 2+ CPUs allowed")
def test_the_engine_thread_is_free_to_move_while_decodes_use_one_thread(
    demo_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On one thread no worker can take the engine thread's core, and a busy neighbour may
    hold the CPU it was pinned to: it gets its CPUs back while the tuner chooses one
    thread, and its CPU again with two."""
    monkeypatch.setattr(assemble, "_auto_threads", lambda: 2)
    mine = os.sched_getaffinity(0)

    async def main() -> list[set[int]]:
        async with Engine.from_config(demo_model_dir / "config.yaml", n_threads=0, max_streams=2) as e:
            assert e._core is not None
            tuner = e._core.calls.tuner
            assert tuner is not None
            seen = []
            for k in (1, 2):
                monkeypatch.setattr(tuner, "threads", lambda rows, k=k: k)
                await codes_of(e)
                seen.append(os.sched_getaffinity(e._core._thread.native_id or 0))
            return seen

    assert asyncio.run(main()) == [mine, {sorted(mine)[1]}]
