"""Uploaded reference voices: encoded once, cached in a bounded LRU.

A client uploads a clip's bytes (never a server path: a path would let a
client read any file the server can). The id is derived from the bytes'
SHA-256, so uploading the same clip twice returns the same id without encoding
it again, and ids cannot be guessed from anything but the audio itself.
Concurrent uploads of the same clip share one encoding.

Memory: a voice is at most 375 frames x 32 codes (30 s, ~96 KB), so the
default 256 entries stay under 25 MB. An evicted id is unknown again: the
client uploads the clip again (the protocol's ``unknown_voice`` error says so).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ..request import Voice

log = logging.getLogger(__name__)

__all__ = ["VoiceInfo", "VoiceStore", "voice_id_for"]

Encode = Callable[[bytes], Awaitable[Voice]]


def voice_id_for(data: bytes) -> str:
    return "v_" + hashlib.sha256(data).hexdigest()[:24]


@dataclass(frozen=True, slots=True)
class VoiceInfo:
    voice_id: str
    frames: int
    seconds: float
    name: str
    cached: bool  # True when the clip was already known (not encoded again)


class VoiceStore:
    """id -> :class:`Voice`, least recently used evicted beyond ``capacity``.

    Lives on one event loop (no locks): ``get`` is synchronous, ``add`` awaits the encoder.
    """

    def __init__(self, encode: Encode, capacity: int = 256) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._encode = encode
        self.capacity = capacity
        self._voices: OrderedDict[str, Voice] = OrderedDict()
        self._inflight: dict[str, asyncio.Future[Voice]] = {}
        self.hits = 0
        self.encoded = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._voices)

    def __contains__(self, voice_id: object) -> bool:
        return voice_id in self._voices

    def get(self, voice_id: str) -> Voice | None:
        v = self._voices.get(voice_id)
        if v is not None:
            self._voices.move_to_end(voice_id)
        return v

    def delete(self, voice_id: str) -> bool:
        return self._voices.pop(voice_id, None) is not None

    def ids(self) -> list[str]:
        return list(self._voices)

    def infos(self) -> list[VoiceInfo]:
        """Every cached voice, least recently used first."""
        return [_info(vid, v, cached=True) for vid, v in self._voices.items()]

    async def add(self, data: bytes, name: str = "") -> VoiceInfo:
        """Encode ``data`` (any audio file soundfile reads) unless known; return its id."""
        vid = voice_id_for(data)
        known = self.get(vid)
        if known is not None:
            self.hits += 1
            return _info(vid, known, cached=True)
        fut = self._inflight.get(vid)
        if fut is not None:  # someone is encoding the same clip right now
            self.hits += 1
            return _info(vid, await asyncio.shield(fut), cached=True)
        fut = asyncio.get_running_loop().create_future()
        self._inflight[vid] = fut
        try:
            voice = await self._encode(data)
        except BaseException as exc:
            self._inflight.pop(vid, None)
            if isinstance(exc, asyncio.CancelledError):
                fut.cancel()
            else:
                fut.set_exception(exc)
                fut.exception()  # mark retrieved: nobody else may be waiting
            # The traceback holds this frame: without this, exception -> frame -> future ->
            # exception is a cycle that keeps the upload's bytes (16 MiB) alive until the GC.
            del fut
            raise
        self._inflight.pop(vid, None)
        voice = Voice(codes=voice.codes, name=name or voice.name)
        fut.set_result(voice)
        self.encoded += 1
        self._voices[vid] = voice
        while len(self._voices) > self.capacity:
            old, _ = self._voices.popitem(last=False)
            self.evicted += 1
            log.info("voice cache full (%d): evicted %s", self.capacity, old)
        return _info(vid, voice, cached=False)


def _info(vid: str, v: Voice, cached: bool) -> VoiceInfo:
    return VoiceInfo(
        voice_id=vid,
        frames=int(v.codes.shape[0]),
        seconds=round(v.seconds, 3),
        name=v.name,
        cached=cached,
    )
