"""The engine's warm-up at start (`warmup: true`): the first request pays no one-off costs,
and nothing it leaves behind changes what a request gets."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streamtts import Engine
from streamtts.engine.decoding import StreamingCodec, WindowedCodec

TEXT = "The first request after the engine started."


async def _first_request(cfg: Path, warmup: bool, **overrides: Any) -> dict[str, Any]:
    async with Engine.from_config(cfg, n_threads=1, warmup=warmup, **overrides) as e:
        after_start = {"cache": e.prefix_cache_info(), "ticks": e._core.profile.ticks}
        syn = await e.generate(TEXT, seed=5, max_new_tokens=60)
        codec = e._decoder.codec
        return {
            **after_start,
            "syn": syn,
            "warmup_s": e.warmup_s,
            "codec": codec,
            "room": codec.room(),
            "calls": e._decoder.calls,
        }


@pytest.mark.parametrize("codec", ["streaming", "off"])
def test_warm_up_caches_the_default_prefix_and_changes_no_sample(real_codec_model_dir: Path, codec: str) -> None:
    cfg = real_codec_model_dir / "config.yaml"
    warm = asyncio.run(_first_request(cfg, True, codec_streaming="" if codec == "streaming" else "off"))
    cold = asyncio.run(_first_request(cfg, False, codec_streaming="" if codec == "streaming" else "off"))
    kind = StreamingCodec if codec == "streaming" else WindowedCodec
    assert isinstance(warm["codec"], kind) and isinstance(cold["codec"], kind)

    # warmed: the default voice's prefix is cached, the profile starts empty
    assert warm["cache"]["entries"] == 1 and warm["cache"]["misses"] == 1 and warm["cache"]["hits"] == 0
    assert warm["ticks"] == 0
    assert warm["warmup_s"] is not None and warm["warmup_s"] > 0
    st = warm["syn"].stats
    assert st.prefix_cached_rows >= 16 and st.prefill_ticks == 1  # only its own rows computed
    # cold: nothing cached, the first request computes its prefix too
    assert cold["cache"]["entries"] == 0 and cold["warmup_s"] is None
    assert cold["syn"].stats.prefix_cached_rows == 0 and cold["syn"].stats.prefill_ticks == 2

    # the warm-up's codec call and request leave no state: the same codes and samples
    np.testing.assert_array_equal(warm["syn"].codes, cold["syn"].codes)
    assert warm["syn"].codes.shape[0] > 0
    np.testing.assert_array_equal(warm["syn"].pcm, cold["syn"].pcm)
    if codec == "streaming":
        assert warm["room"] == cold["room"] == warm["codec"].decoder.n_slots  # its slot given back
    # the warm-up's codec call is not one of the decode thread's counted calls
    assert warm["calls"] == cold["calls"]
