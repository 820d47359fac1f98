"""A stream whose logits turn non-finite (a backbone overflow) ends alone with an error naming
the cause; the streams stepped beside it go on, with the codes they have alone."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streamtts import Engine
from streamtts.config import SamplingParams
from streamtts.errors import GenerationError
from streamtts.request import StreamOptions

BAD_SEED = 666  # the stream whose logits the test poisons
POISON_AT = 60  # after this many of its steps (32 codebooks: it has sent audio by then)


def _poison_one_stream(core: Any) -> list[int]:
    """After each real execute, NaN into every logit of the BAD_SEED stream's row (what a
    float16 overflow in the backbone gives), once it has taken POISON_AT steps."""
    original = core.execute
    hits: list[int] = []

    def execute(plan: Any) -> Any:
        result = original(plan)
        b = result.slots.size
        for pos, slot in enumerate(result.slots.tolist()):
            s = core.slots.streams[slot]
            if s is not None and s.req.seed == BAD_SEED and core.slots.steps[slot] >= POISON_AT:
                core._step.pair_logits(b)[pos] = np.nan
                core._step.audio_logits(b)[pos] = np.nan
                hits.append(slot)
        return result

    core.execute = execute
    return hits


@pytest.mark.parametrize("sampler", ["native", "numpy"])
def test_a_stream_with_non_finite_logits_ends_alone(demo_model_dir: Path, sampler: str) -> None:
    greedy = SamplingParams.greedy()
    good = [StreamOptions(seed=10 + i, sampling=greedy, fixed_frames=120) for i in range(2)]  # longer than the bad one lives
    texts = ["The first stream goes on talking.", "So does the second one, a little longer."]

    async def main() -> tuple[list[np.ndarray], list[np.ndarray], BaseException | None, int, list[int]]:
        async with Engine.from_config(demo_model_dir / "config.yaml", n_threads=1, max_streams=4, sampler=sampler) as e:
            alone = [(await e.generate(t, options=o)).codes for t, o in zip(texts, good, strict=True)]
            hits = _poison_one_stream(e._core)
            got_audio = 0
            error: BaseException | None = None

            async def bad() -> None:
                nonlocal got_audio, error
                try:
                    async for chunk in e.stream("This one overflows.", options=StreamOptions(seed=BAD_SEED, sampling=greedy, fixed_frames=400)):
                        got_audio += chunk.pcm.shape[0]
                except GenerationError as exc:
                    error = exc

            results = await asyncio.gather(bad(), *(e.generate(t, options=o) for t, o in zip(texts, good, strict=True)))
            together = [r.codes for r in results[1:]]
            # the engine serves on: a new stream after the failure completes
            assert (await e.generate("Still here.", options=StreamOptions(seed=1, max_new_tokens=40))).codes.shape[0] > 0
            assert e.active_streams == 0
            return alone, together, error, got_audio, hits

    alone, together, error, got_audio, hits = asyncio.run(main())
    assert hits, "the poisoned stream was never stepped"
    assert isinstance(error, GenerationError) and "non-finite logits" in str(error), error
    assert got_audio > 0  # it had spoken before its logits went bad
    for a, t in zip(alone, together, strict=True):
        np.testing.assert_array_equal(a, t)
