"""Voices in Redis, through redis-py's asyncio client: shared by every replica.

Keys (``key_prefix`` default ``streamtts:``)::

    streamtts:voice:<voice id>    the StoredVoice (msgpack), EX ttl_s, refreshed on use
    streamtts:clip:<sha256>       the voice id encoded from that uploaded clip, EX ttl_s
    streamtts:name:<name>         the voice id the name stands for (an upload's ?name=), EX ttl_s
    streamtts:lexicon:<id>        a stored pronunciation lexicon (JSON: name, entries), EX ttl_s
    streamtts:lexname:<name>      the lexicon id the name stands for, EX ttl_s

Every command has a short connect and read timeout and one immediate retry (the
first command on a pooled connection that Redis closed when it restarted fails;
the retry opens a new one), so an unreachable Redis answers in about a second
instead of redis-py's default exponential back-off, and the replica recovers by
itself when Redis returns: the next command connects again. State changes
(reachable / unreachable) are logged once each, not per request.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from ..errors import VoiceStoreUnavailableError
from ..request import Voice
from .voice_store import VoiceStoreSettings, decode_voice, encode_voice, redact_url

log = logging.getLogger(__name__)

__all__ = ["RedisVoices"]

T = TypeVar("T")


class RedisVoices:
    kind = "redis"

    def __init__(self, settings: VoiceStoreSettings) -> None:
        self.settings = settings
        self.url = redact_url(settings.url)
        self.ttl = max(1, int(round(settings.ttl_s)))
        self._prefix = settings.key_prefix
        self.up = True  # optimistic until a command fails
        self.errors = 0
        self._r: Redis = Redis.from_url(
            settings.url,
            socket_connect_timeout=settings.connect_timeout_s,
            socket_timeout=settings.timeout_s,
            retry=Retry(NoBackoff(), 1),
            decode_responses=False,
        )

    def _vkey(self, voice_id: str) -> str:
        return f"{self._prefix}voice:{voice_id}"

    def _ckey(self, clip: str) -> str:
        return f"{self._prefix}clip:{clip}"

    async def _call(self, what: str, op: Callable[[], Awaitable[T]]) -> T:
        try:
            result = await op()
        except (RedisError, OSError) as exc:
            self.errors += 1
            self._set_up(False, exc)
            raise VoiceStoreUnavailableError(
                f"the voice store ({self.url}) is unreachable: {what} failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        self._set_up(True)
        return result

    def _set_up(self, up: bool, exc: BaseException | None = None) -> None:
        if up == self.up:
            return
        self.up = up
        if up:
            log.warning("voice store %s is reachable again", self.url)
        else:
            log.warning("voice store %s is unreachable: %s", self.url, exc)

    async def load(self, voice_id: str) -> Voice | None:
        data = await self._call("load", lambda: self._r.getex(self._vkey(voice_id), ex=self.ttl))
        return None if data is None else decode_voice(_bytes(data))

    async def touch(self, voice_id: str) -> bool:
        return bool(await self._call("touch", lambda: self._r.expire(self._vkey(voice_id), self.ttl)))

    async def save(self, voice_id: str, voice: Voice, clip: str) -> None:
        value = encode_voice(voice)

        async def op() -> None:
            async with self._r.pipeline(transaction=True) as p:
                p.set(self._vkey(voice_id), value, ex=self.ttl)
                p.set(self._ckey(clip), voice_id.encode(), ex=self.ttl)
                await p.execute()

        await self._call("save", op)

    async def find_clip(self, clip: str) -> str | None:
        data = await self._call("find", lambda: self._r.getex(self._ckey(clip), ex=self.ttl))
        return None if data is None else _bytes(data).decode("ascii", "replace")

    def _nkey(self, name: str) -> str:
        return f"{self._prefix}name:{name}"

    async def name(self, name: str, voice_id: str) -> None:
        await self._call("name", lambda: self._r.set(self._nkey(name), voice_id.encode(), ex=self.ttl))

    async def find_name(self, name: str) -> str | None:
        data = await self._call("find", lambda: self._r.getex(self._nkey(name), ex=self.ttl))
        return None if data is None else _bytes(data).decode("ascii", "replace")

    async def delete(self, voice_id: str) -> bool:
        return bool(await self._call("delete", lambda: self._r.delete(self._vkey(voice_id))))

    async def ids(self, limit: int) -> list[str]:
        start = len(self._prefix) + len("voice:")

        async def op() -> list[str]:
            out: list[str] = []
            async for key in self._r.scan_iter(match=f"{self._prefix}voice:*", count=500):
                out.append(_bytes(key)[start:].decode("ascii", "replace"))
                if len(out) >= limit:
                    break
            return out

        return await self._call("list", op)

    # -- pronunciation lexicons (server/lexicons.py): the same store, their own keys ----------
    def _lkey(self, lexicon_id: str) -> str:
        return f"{self._prefix}lexicon:{lexicon_id}"

    def _lnkey(self, name: str) -> str:
        return f"{self._prefix}lexname:{name}"

    async def save_lexicon(self, lexicon_id: str, value: bytes, name: str) -> None:
        async def op() -> None:
            async with self._r.pipeline(transaction=True) as p:
                p.set(self._lkey(lexicon_id), value, ex=self.ttl)
                if name:
                    p.set(self._lnkey(name), lexicon_id.encode(), ex=self.ttl)
                await p.execute()

        await self._call("save lexicon", op)

    async def load_lexicon(self, lexicon_id: str) -> bytes | None:
        data = await self._call("load lexicon", lambda: self._r.getex(self._lkey(lexicon_id), ex=self.ttl))
        return None if data is None else _bytes(data)

    async def touch_lexicon(self, lexicon_id: str) -> bool:
        return bool(await self._call("touch lexicon", lambda: self._r.expire(self._lkey(lexicon_id), self.ttl)))

    async def find_lexicon_name(self, name: str) -> str | None:
        data = await self._call("find lexicon", lambda: self._r.getex(self._lnkey(name), ex=self.ttl))
        return None if data is None else _bytes(data).decode("ascii", "replace")

    async def delete_lexicon(self, lexicon_id: str, names: list[str]) -> bool:
        keys = [self._lkey(lexicon_id), *(self._lnkey(n) for n in names)]
        return bool(await self._call("delete lexicon", lambda: self._r.delete(*keys)))

    async def lexicon_ids(self, limit: int) -> list[str]:
        start = len(self._prefix) + len("lexicon:")

        async def op() -> list[str]:
            out: list[str] = []
            async for key in self._r.scan_iter(match=f"{self._prefix}lexicon:*", count=500):
                out.append(_bytes(key)[start:].decode("ascii", "replace"))
                if len(out) >= limit:
                    break
            return out

        return await self._call("list lexicons", op)

    async def ping(self) -> bool:
        try:
            await self._call("ping", lambda: self._r.ping())
        except VoiceStoreUnavailableError:
            return False
        return True

    async def aclose(self) -> None:
        try:
            await self._r.aclose()
        except (RedisError, OSError) as exc:  # closing a broken pool: nothing left to do
            log.debug("closing the voice store: %s", exc)


def _bytes(value: bytes | str) -> bytes:
    # decode_responses=False: redis-py returns bytes (its stubs also allow str)
    return value.encode() if isinstance(value, str) else bytes(value)
