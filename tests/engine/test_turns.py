"""The backbone and a CPU codec take turns on the cores (engine/turns.py, codec_turns)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streamtts import Engine
from streamtts.config import EngineConfig
from streamtts.engine.turns import CoreTurns
from streamtts.errors import ConfigError
from streamtts.request import StreamOptions


def _hammer(turns: CoreTurns, seconds: float = 0.3) -> tuple[int, int, int]:
    """Two threads enter their turns as fast as they can; how often both were inside at once."""
    inside = {"backbone": 0, "codec": 0}
    overlaps = 0
    counts = {"backbone": 0, "codec": 0}
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def run(name: str) -> None:
        nonlocal overlaps
        enter = turns.backbone if name == "backbone" else turns.codec
        while time.monotonic() < stop:
            with enter():
                with lock:
                    inside[name] += 1
                    if inside["backbone"] and inside["codec"]:
                        overlaps += 1
                time.sleep(0.0005)  # work, without the lock: the other thread may run
                with lock:
                    inside[name] -= 1
                counts[name] += 1

    threads = [threading.Thread(target=run, args=(n,)) for n in ("backbone", "codec")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return overlaps, counts["backbone"], counts["codec"]


def test_turns_never_overlap_and_both_progress() -> None:
    overlaps, n_backbone, n_codec = _hammer(CoreTurns(True))
    assert overlaps == 0
    assert n_backbone > 20 and n_codec > 20  # neither starves the other


def test_without_turns_they_do_overlap() -> None:
    """The check above can fail: with turns off the same threads run at once."""
    overlaps, _, _ = _hammer(CoreTurns(False))
    assert overlaps > 0


def test_a_waiting_codec_call_goes_before_the_next_backbone_turn() -> None:
    turns = CoreTurns(True)
    order: list[str] = []
    held = turns.backbone()
    held.__enter__()

    def codec() -> None:
        with turns.codec():
            order.append("codec")

    def backbone() -> None:
        with turns.backbone():
            order.append("backbone")

    tc = threading.Thread(target=codec)
    tc.start()
    while turns.codec_waits == 0:  # the codec call is waiting for the held turn
        time.sleep(0.001)
    tb = threading.Thread(target=backbone)
    tb.start()
    while turns.backbone_waits == 0:
        time.sleep(0.001)
    held.__exit__(None, None, None)
    tc.join()
    tb.join()
    assert order == ["codec", "backbone"]


def test_engine_takes_turns_on_the_cpu_only_when_asked(demo_model_dir: Path) -> None:
    async def run(turns: str) -> tuple[bool, Any]:
        async with Engine.from_config(demo_model_dir / "config.yaml", n_threads=1, codec_turns=turns) as e:
            syn = await e.generate("Hello there.", options=StreamOptions(seed=1, fixed_frames=20))
            return bool(e.info["codec_turns"]), syn

    auto_on, with_turns = asyncio.run(run("auto"))  # the demo's codec runs on ONNX Runtime's CPU
    never, without = asyncio.run(run("never"))
    assert (auto_on, never) == (True, False)
    assert with_turns.codes.shape[0] >= 20
    np.testing.assert_array_equal(with_turns.codes, without.codes)
    np.testing.assert_array_equal(with_turns.pcm, without.pcm)


def test_unknown_codec_turns_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="codec_turns must be 'auto', 'always' or 'never'"):
        EngineConfig(codec_turns="yes").validate()


def test_engine_profile_counts_the_backbone_waiting_for_a_codec_call(demo_model_dir: Path) -> None:
    """While a codec call holds the cores the backbone waits, and the profile says so
    (``codec_wait``); with turns off nothing waits."""

    async def run(turns: str) -> float:
        async with Engine.from_config(demo_model_dir / "config.yaml", n_threads=1, codec_turns=turns) as e:
            assert e._core is not None
            held = e._core.decoder.turns.codec()
            held.__enter__()  # a codec call in progress when the request arrives
            s = e.stream("Hello there.", options=StreamOptions(seed=1, fixed_frames=5))
            async with s:
                first = asyncio.ensure_future(s.__anext__())
                await asyncio.sleep(0.3)
                held.__exit__(None, None, None)
                await first
                async for _ in s:
                    pass
            return e._core.profile.codec_wait

    assert asyncio.run(run("always")) >= 0.25
    assert asyncio.run(run("never")) < 0.1
