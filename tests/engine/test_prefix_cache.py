"""The prefix cache: bookkeeping alone, then through a real engine."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streamtts import Engine
from streamtts.config import SamplingParams
from streamtts.engine.prefix_cache import PrefixCache, prefix_key
from streamtts.errors import ConfigError
from streamtts.request import StreamOptions


def snap(n: int) -> np.ndarray:
    return np.zeros(n, dtype=np.uint8)


# -- bookkeeping ----------------------------------------------------------------------------


def test_claim_wait_store_hit() -> None:
    c = PrefixCache(1000)
    assert c.lookup(b"k", slot=0, rows=20) == "compute"
    assert c.lookup(b"k", slot=1, rows=20) == "wait"  # slot 0 is computing it
    assert c.lookup(b"k", slot=0, rows=20) == "compute"  # the owner keeps its claim
    assert c.store(b"k", 0, snap(100))
    got = c.lookup(b"k", slot=1, rows=20)
    assert isinstance(got, np.ndarray) and got.nbytes == 100
    assert c.info() == {"entries": 1, "bytes": 100, "capacity_bytes": 1000, "hits": 1, "misses": 1}


def test_release_lets_a_waiter_take_over() -> None:
    c = PrefixCache(1000)
    c.lookup(b"k", 0, 20)
    c.release(0)  # owner cancelled before storing
    assert c.lookup(b"k", 1, 20) == "compute"
    assert not c.store(b"k", 0, snap(10))  # the old owner's late store is ignored
    assert c.store(b"k", 1, snap(10))


def test_lru_eviction_by_bytes_and_oversized_entries() -> None:
    c = PrefixCache(250)
    for i, k in enumerate((b"a", b"b")):
        c.lookup(k, i, 20)
        c.store(k, i, snap(100))
    assert isinstance(c.lookup(b"a", 5, 20), np.ndarray)  # a is now most recent
    c.lookup(b"c", 2, 20)
    c.store(b"c", 2, snap(100))  # evicts b, the least recently used
    assert c.bytes == 200 and len(c) == 2
    assert c.lookup(b"b", 3, 20) == "compute"
    assert not c.store(b"b", 3, snap(251))  # larger than the whole cache: not kept
    assert c.lookup(b"b", 4, 20) == "compute"
    assert PrefixCache(0).enabled is False


def test_a_sessions_own_voice_is_dropped_with_it() -> None:
    c = PrefixCache(1000)
    for key, slot, session in ((b"template", 0, 0), (b"own-7", 1, 7), (b"own-8", 2, 8)):
        c.lookup(key, slot, 20)
        assert c.store(key, slot, snap(100), session=session)
    c.lookup(b"claim-7", 3, 20)  # a claim under way is its owner's (released with its slot)
    c.drop_session(7)
    assert c.info()["entries"] == 2 and c.bytes == 200
    assert isinstance(c.lookup(b"template", 0, 20), np.ndarray)
    assert isinstance(c.lookup(b"own-8", 0, 20), np.ndarray)
    assert c.lookup(b"own-7", 0, 20) == "compute"  # gone
    assert c.lookup(b"claim-7", 0, 20) == "wait"


def test_a_segmented_sessions_own_voice_leaves_the_cache_when_it_ends(demo_model_dir: Path, voice_wav: Path) -> None:
    """Without a reference voice a session's first segment becomes the voice of the rest:
    its later segments share that prefix (a hit), and the entry goes when the session ends;
    a stored voice's entry stays for the next request."""
    from streamtts.engine.segmented import SegmentDone, speak_segments

    texts = ["The first sentence is spoken here.", "A second one follows it.", "And a third."]

    async def main() -> tuple[dict[str, int], dict[str, int], list[Any], dict[str, int]]:
        async with Engine.from_config(demo_model_dir / "config.yaml", n_threads=1, max_streams=4, warmup=False) as e:
            await gen(e, "The template's prefix.", 1, None)
            before = e.prefix_cache_info()
            done = [ev async for ev in speak_segments(e, texts, continuity_frames=4, lookahead=1,
                                                      options=StreamOptions(seed=3)) if isinstance(ev, SegmentDone)]  # fmt: skip
            after = e.prefix_cache_info()
            voice = await e.encode_voice(str(voice_wav))
            await gen(e, "A stored voice speaks.", 2, voice)
            return before, after, done, e.prefix_cache_info()

    before, after, done, stored = asyncio.run(main())
    assert [d.stats.prefix_cached_rows > 0 for d in done] == [True, False, True]  # 3rd: the 2nd's voice
    assert after["hits"] == before["hits"] + 2 and after["misses"] == before["misses"] + 1
    assert after["entries"] == before["entries"] and after["bytes"] == before["bytes"]
    assert stored["entries"] == before["entries"] + 1  # not a session's own: kept


def test_key_covers_every_channel_and_the_length() -> None:
    p = np.zeros((30, 33), np.int64)
    q = p.copy()
    q[5, 17] = 3  # an audio channel
    assert prefix_key(p, 20) != prefix_key(q, 20)
    assert prefix_key(p, 20) != prefix_key(p, 21)
    assert prefix_key(p, 5) == prefix_key(q, 5)


def test_negative_size_is_a_config_error(demo_model_dir: Path) -> None:
    with pytest.raises(ConfigError, match="prefix_cache_mib"):
        Engine.from_config(demo_model_dir / "config.yaml", prefix_cache_mib=-1)


# -- through the engine ---------------------------------------------------------------------

GREEDY = SamplingParams.greedy()


# The engines below start with `warmup=False`: the warm-up's entry (the default voice's
# prefix) would add to the counts these tests check; tests/engine/test_warmup.py checks it.


async def gen(e: Engine, text: str, seed: int, ref: Any = None, greedy: bool = True) -> Any:
    opts = StreamOptions(seed=seed, sampling=GREEDY if greedy else None, max_new_tokens=80)
    return await e.generate(text, reference=ref, options=opts)


@pytest.mark.determinism
@pytest.mark.parametrize("greedy", [True, False])
def test_hit_equals_miss(demo_model_dir: Path, voice_wav: Path, greedy: bool) -> None:
    async def run(mib: int) -> list[Any]:
        async with Engine.from_config(demo_model_dir / "config.yaml", n_threads=1, prefix_cache_mib=mib, warmup=False) as e:
            voice = await e.encode_voice(str(voice_wav))
            out = [await gen(e, "First words.", 1, voice, greedy), await gen(e, "Second, other words.", 2, voice, greedy)]
            out.append(await gen(e, "First words.", 1, voice, greedy))
            out.append(e._core.prefix_cache.info())
            return out

    first, second, again, info = asyncio.run(run(64))
    assert first.stats.prefix_cached_rows == 0  # miss: computed, then stored
    assert second.stats.prefix_cached_rows > 100  # hit: voice block + template loaded
    assert again.stats.prefix_cached_rows == second.stats.prefix_cached_rows
    assert info["hits"] == 2 and info["misses"] == 1 and info["entries"] == 1
    np.testing.assert_array_equal(first.codes, again.codes)  # miss == hit
    *_, off_info = uncached = asyncio.run(run(0))
    assert off_info["entries"] == 0 and uncached[1].stats.prefix_cached_rows == 0
    assert uncached[0].codes.shape[0] > 0
    # (without the cache the prompt is one piece, the official partition; with it two, whose
    # flash-attention rounding differs in the last bits: codes are not compared across them)


def test_streams_joining_together_compute_a_shared_prefix_once(demo_model_dir: Path, voice_wav: Path) -> None:
    async def main() -> tuple[list[Any], dict[str, int]]:
        async with Engine.from_config(demo_model_dir / "config.yaml", n_threads=1, max_streams=4, warmup=False) as e:
            voice = await e.encode_voice(str(voice_wav))
            res = await asyncio.gather(*(gen(e, f"Stream number {i} talks.", i, voice) for i in range(4)))
            return list(res), e._core.prefix_cache.info()

    res, info = asyncio.run(main())
    assert info["misses"] == 1 and info["hits"] == 3  # the others waited for the first
    assert sorted(r.stats.prefix_cached_rows > 0 for r in res) == [False, True, True, True]
    assert all(r.codes.shape[0] > 0 for r in res)


def test_cancelled_owner_hands_the_prefix_to_a_waiter(demo_model_dir: Path, voice_wav: Path) -> None:
    """The stream computing a prefix is cancelled part-way through it (the engine thread is
    held inside its first prefill piece meanwhile); the stream with the same prefix behind
    it computes the prefix itself, completes, and stores it; no claim is left behind."""
    import threading

    from streamtts.model.backbone import Backbone

    inside, release = threading.Event(), threading.Event()

    class Gated:
        def __init__(self, params: Any) -> None:
            self.b = Backbone(params)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.b, name)

        def decode_bound(self, n: int, want_hidden: bool = True, out_offset: int = 0, lend: bool = False) -> int:
            if n > 1 and not inside.is_set():  # the first prefill piece: hold the engine here
                inside.set()
                release.wait(30)
            return self.b.decode_bound(n, want_hidden, out_offset, lend)

    async def main() -> tuple[Any, dict[str, int], int, int]:
        e = Engine.from_config(demo_model_dir / "config.yaml", n_threads=1, max_streams=2, prefill_chunk=8, warmup=False)
        e.backbone_factory = Gated
        async with e:
            voice = await e.encode_voice(str(voice_wav))
            owner = e.stream("I will be cancelled.", reference=voice, options=StreamOptions(seed=1))
            owner_task = asyncio.create_task(owner.__anext__())
            while not inside.is_set():
                await asyncio.sleep(0.001)
            waiter = e.stream("I wait, then speak.", reference=voice, options=StreamOptions(seed=2, sampling=GREEDY))
            first = asyncio.create_task(waiter.__anext__())
            while waiter._sink is None:  # submitted (queued behind the held tick)
                await asyncio.sleep(0.001)
            owner_task.cancel()  # abort: the owner leaves with its prefix half computed
            await asyncio.sleep(0.05)
            release.set()
            chunks = [await first]
            async for c in waiter:
                chunks.append(c)
            return waiter.stats, e._core.prefix_cache.info(), e.active_streams, len(chunks)

    stats, info, active, n_chunks = asyncio.run(main())
    assert n_chunks > 0 and stats.frames > 0 and stats.finish_reason == "audio_end"
    assert stats.prefix_cached_rows == 0  # it computed the prefix itself ...
    assert info["entries"] == 1 and info["misses"] == 2 and info["hits"] == 0  # ... and stored it
    assert active == 0
