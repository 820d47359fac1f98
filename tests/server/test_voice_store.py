"""Voices: content-addressed ids, the local LRU, and the shared store on a real redis-server.

Two :class:`VoiceStore` objects on one Redis stand for two replicas. The encoder is a
stand-in (codes derived from the clip's bytes) that counts its calls; the server tests
use the real one.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import numpy as np
import pytest
import redis

from streamtts.errors import ConfigError, ReferenceAudioError, VoiceStoreUnavailableError
from streamtts.request import Voice
from streamtts.server.voice_store import (
    VoiceStoreSettings,
    decode_voice,
    encode_voice,
    redact_url,
)
from streamtts.server.voices import LocalVoices, VoiceStore, open_shared_voices, voice_id_for

T = TypeVar("T")


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(_wrap(coro))


async def _wrap(coro: Awaitable[T]) -> T:
    return await coro


def codes_for(data: bytes, frames: int = 10) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(data).digest()[:8], "little")
    return np.random.default_rng(seed).integers(0, 1025, size=(frames, 32)).astype(np.int64)


class FakeEncoder:
    def __init__(self, frames: int = 10, delay: float = 0.0) -> None:
        self.calls = 0
        self.frames = frames
        self.delay = delay

    async def __call__(self, data: bytes) -> Voice:
        self.calls += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        if data.startswith(b"bad"):
            raise ReferenceAudioError("not audio")
        # the first byte picks the voice: clips that differ only after it encode alike
        return Voice(codes=codes_for(data[:1], self.frames))


def store_on(url: str, encode: Callable[[bytes], Awaitable[Voice]], **kw: Any) -> VoiceStore:
    settings = VoiceStoreSettings(url=url, ttl_s=kw.pop("ttl_s", 3600.0), recheck_s=kw.pop("recheck_s", 60.0)).validate()
    return VoiceStore(encode, 16, open_shared_voices(settings), recheck_s=settings.recheck_s, **kw)


# -- ids and the stored value ---------------------------------------------------------------


def test_voice_id_is_a_hash_of_the_codes_and_their_shape() -> None:
    c = codes_for(b"a")
    assert voice_id_for(c) == voice_id_for(c.astype(np.int32).copy())  # dtype does not matter
    assert voice_id_for(c) != voice_id_for(codes_for(b"b"))
    flat = np.ascontiguousarray(c).reshape(20, 16)  # same numbers, another shape
    assert voice_id_for(c) != voice_id_for(flat)
    assert voice_id_for(c).startswith("v_") and len(voice_id_for(c)) == 26


def test_stored_value_round_trips_and_refuses_garbage() -> None:
    v = Voice(codes=codes_for(b"x"), name="Ann")
    back = decode_voice(encode_voice(v))
    assert back.name == "Ann" and back.codes.dtype == np.int64
    np.testing.assert_array_equal(back.codes, v.codes)
    with pytest.raises(VoiceStoreUnavailableError, match="unreadable"):
        decode_voice(b"\x00not msgpack")
    with pytest.raises(ValueError):
        encode_voice(Voice(codes=np.full((2, 32), -1)))


def test_settings_are_checked_and_urls_redacted() -> None:
    with pytest.raises(ConfigError, match="memory"):
        VoiceStoreSettings(url="http://x").validate()
    with pytest.raises(ConfigError, match="recheck_s"):
        VoiceStoreSettings(url="memory", ttl_s=10, recheck_s=20).validate()
    assert redact_url("redis://:s3cret@host:6379/0") == "redis://:***@host:6379/0"
    assert redact_url("redis://u:s3cret@host/1") == "redis://u:***@host/1"
    assert redact_url("redis://host:6379/0") == "redis://host:6379/0"


# -- the local LRU (the memory backend) ---------------------------------------------------


def test_local_lru_evicts_least_recently_used_with_its_clip_aliases() -> None:
    lv = LocalVoices(capacity=2)
    a, b, c = (Voice(codes=codes_for(x)) for x in (b"a", b"b", b"c"))
    lv.put("A", a, clip="ca")
    lv.put("B", b, clip="cb")
    assert lv.get("A") is a  # A is now the most recent
    lv.put("C", c, clip="cc")
    assert lv.ids() == ["A", "C"] and lv.evicted == 1
    assert lv.clip("cb") is None and lv.clip("ca") == "A"
    assert lv.pop("A") and lv.clip("ca") is None and not lv.pop("A")


def test_memory_store_encodes_a_clip_once_and_content_addresses_it() -> None:
    enc = FakeEncoder()

    async def scenario() -> None:
        store = VoiceStore(enc, 8)
        first = await store.add(b"a-clip", name="one")
        again = await store.add(b"a-clip")
        assert (first.cached, again.cached) == (False, True) and enc.calls == 1
        assert first.voice_id == again.voice_id == voice_id_for(codes_for(b"a"))
        # another file of the same voice (same codes): same id, encoded once more
        other = await store.add(b"a-different-file")
        assert other.voice_id == first.voice_id and not other.cached and enc.calls == 2
        assert store.get(first.voice_id) is not None
        assert await store.fetch(first.voice_id) is not None
        assert await store.fetch("v_" + "0" * 24) is None and await store.fetch("../etc") is None
        assert await store.ids() == [first.voice_id]
        assert await store.delete(first.voice_id) and not await store.delete(first.voice_id)
        assert store.backend == "memory" and store.available

    run(scenario())


def test_concurrent_uploads_of_one_clip_share_one_encoding() -> None:
    enc = FakeEncoder(delay=0.2)

    async def scenario() -> None:
        store = VoiceStore(enc, 8)
        infos = await asyncio.gather(*(store.add(b"same") for _ in range(4)))
        assert enc.calls == 1 and len({i.voice_id for i in infos}) == 1
        assert sorted(i.cached for i in infos) == [False, True, True, True]
        with pytest.raises(ReferenceAudioError):
            await store.add(b"bad clip")

    run(scenario())


def test_a_voice_over_the_size_cap_is_refused() -> None:
    async def scenario() -> None:
        store = VoiceStore(FakeEncoder(frames=400), 8, max_stored_bytes=16 << 10)
        with pytest.raises(ReferenceAudioError, match="limit"):
            await store.add(b"long clip")
        assert len(store) == 0

    run(scenario())


# -- Redis ------------------------------------------------------------------------------------


def test_a_voice_uploaded_through_one_replica_is_found_by_another(redis_server: Any) -> None:
    enc_a, enc_b = FakeEncoder(), FakeEncoder()

    async def scenario() -> None:
        a = store_on(redis_server.url, enc_a, ttl_s=600.0)
        b = store_on(redis_server.url, enc_b, ttl_s=600.0)
        try:
            info = await a.add(b"k-clip", name="Kim")
            assert b.get(info.voice_id) is None  # not local to b yet
            v = await b.fetch(info.voice_id)
            assert v is not None and v.name == "Kim"
            np.testing.assert_array_equal(v.codes, codes_for(b"k"))
            assert b.get(info.voice_id) is not None  # now cached locally
            # the same clip uploaded through b: known, not encoded again anywhere
            again = await b.add(b"k-clip")
            assert again.cached and again.voice_id == info.voice_id and enc_b.calls == 0
            assert info.voice_id in await b.ids() and a.backend == "redis"
        finally:
            await a.aclose()
            await b.aclose()

    run(scenario())
    r = redis.Redis(port=redis_server.port)
    keys = sorted(k.decode() for k in r.keys("streamtts:*"))
    assert [k.split(":")[1] for k in keys] == ["clip", "name", "voice"]  # "Kim" stands for it
    assert all(0 < r.ttl(k) <= 600 for k in keys)  # a TTL on every key


def test_deleted_voice_leaves_other_replicas_at_their_next_recheck(redis_server: Any) -> None:
    async def scenario() -> None:
        a = store_on(redis_server.url, FakeEncoder(), ttl_s=600.0, recheck_s=0.2)
        b = store_on(redis_server.url, FakeEncoder(), ttl_s=600.0, recheck_s=0.2)
        try:
            vid = (await a.add(b"d-clip")).voice_id
            assert await b.fetch(vid) is not None
            assert await a.delete(vid)
            assert await b.fetch(vid) is not None  # b's copy is fresh: used without a round trip
            await asyncio.sleep(0.3)
            assert await b.fetch(vid) is None and b.get(vid) is None
        finally:
            await a.aclose()
            await b.aclose()

    run(scenario())


def test_redis_down_then_back_without_a_new_store(redis_server: Any) -> None:
    """Unreachable: uploads and unknown ids raise VoiceStoreUnavailableError (quickly), a voice
    held locally keeps working; Redis back: the same store works again."""
    enc = FakeEncoder()

    async def scenario() -> None:
        a = store_on(redis_server.url, enc, recheck_s=0.1)
        b = store_on(redis_server.url, FakeEncoder(), recheck_s=0.1)
        try:
            held = (await a.add(b"h-clip")).voice_id
            stranger = (await b.add(b"s-clip")).voice_id  # in Redis, not in a's cache
            redis_server.stop()
            await asyncio.sleep(0.15)  # a's copy of `held` is due for a recheck
            t0 = time.monotonic()
            with pytest.raises(VoiceStoreUnavailableError, match="unreachable"):
                await a.add(b"n-clip")
            with pytest.raises(VoiceStoreUnavailableError):
                await a.fetch(stranger)
            assert time.monotonic() - t0 < 10  # refused, not hung on back-offs
            assert await a.fetch(held) is not None  # the local copy still serves
            assert not a.available
            calls = enc.calls
            redis_server.start()
            info = await a.add(b"n-clip")
            assert not info.cached and enc.calls == calls + 1
            assert a.available and (await a.fetch(stranger)) is not None  # append-only file kept it
        finally:
            await a.aclose()
            await b.aclose()

    run(scenario())


def test_a_name_given_at_upload_stands_for_the_voice_on_every_replica(redis_server: Any) -> None:
    """An upload's name is a voice's name everywhere: this replica, another one, and after a
    new upload takes the name (the latest keeps it); a name that is no voice's is None."""

    async def scenario() -> None:
        a = store_on(redis_server.url, FakeEncoder(), ttl_s=600.0)
        b = store_on(redis_server.url, FakeEncoder(), ttl_s=600.0)
        try:
            first = await a.add(b"a-clip", name="alice")
            assert a.get("alice") is not None and a.resolve("alice") == first.voice_id
            v = await b.fetch("alice")  # the other replica asks the store
            assert v is not None and b.resolve("alice") == first.voice_id
            second = await b.add(b"z-clip", name="alice")  # another clip takes the name
            assert second.voice_id != first.voice_id
            assert (await a.fetch("alice")) is not None and a.resolve("alice") == second.voice_id
            assert await a.fetch("bob") is None and a.get("bob") is None
            assert await b.delete("alice") and await b.fetch(second.voice_id) is None
        finally:
            await a.aclose()
            await b.aclose()

    run(scenario())


def test_a_name_in_memory_and_its_voice_leave_together() -> None:
    async def scenario() -> None:
        store = VoiceStore(FakeEncoder(), 1)
        info = await store.add(b"a-clip", name="alice")
        assert store.get("alice") is not None and await store.fetch("alice") is not None
        await store.add(b"b-clip")  # capacity 1: alice's voice is evicted, and its name
        assert store.get("alice") is None and await store.fetch("alice") is None
        assert store.local.names() == [] and info.voice_id not in store

    run(scenario())
