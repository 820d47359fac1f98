"""The engine's thread count per decode (engine/thread_tuner.py) on the real bridge."""

from __future__ import annotations

import asyncio
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
