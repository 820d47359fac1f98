"""Uploaded reference voices: encoded once, content-addressed, kept in a voice store.

A client uploads a clip's bytes (never a server path: a path would let a
client read any file the server can). The id is derived from the *encoded*
voice (:func:`voice_id_for`: a hash of its codes), so the same voice has the
same id on every replica, and an id names exactly the codes stored under it.
The clip's own SHA-256 is remembered as an alias of that id: uploading the same
bytes twice returns the id without encoding again. Concurrent uploads of the
same clip share one encoding.

Where voices live (``ServerSettings.voice_store``):

* ``memory`` (the default, one replica): this process's LRU (:class:`LocalVoices`).
  An evicted id is unknown again: the client uploads the clip again (the
  protocol's ``unknown_voice`` error says so).
* ``redis://host:port/db``: every voice in Redis (``voice_redis.py``), shared by
  all replicas behind a balancer, with a TTL refreshed on use; each replica keeps
  the voices it uses in its local LRU too (a hit costs no round trip). A local
  copy older than ``recheck_s`` is confirmed with the store before use (which also
  refreshes its TTL there, and drops a voice deleted through another replica);
  while the store is unreachable, local copies keep being used, and uploads and
  lookups of voices not held locally raise :class:`VoiceStoreUnavailableError`.

Memory: a voice is at most 375 frames x 32 codes (30 s, ~96 KB as int64), so the
default 256 entries stay under 25 MB.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError, ReferenceAudioError, VoiceStoreUnavailableError
from ..request import Voice
from .voice_store import SharedVoices, VoiceStoreSettings, redact_url, stored_size

log = logging.getLogger(__name__)

__all__ = [
    "LocalVoices",
    "VoiceInfo",
    "VoiceStore",
    "clip_digest",
    "open_shared_voices",
    "valid_voice_name",
    "voice_id_for",
]

Encode = Callable[[bytes], Awaitable[Voice]]

_ID = re.compile(r"^v_[0-9a-f]{24}$")


def voice_id_for(codes: np.ndarray) -> str:
    """The content address of an encoded voice: its codes (as little-endian uint16) and shape."""
    c = np.ascontiguousarray(codes)
    h = hashlib.sha256(f"moss-voice:{c.shape[0]}x{c.shape[1]}:".encode())
    h.update(c.astype("<u2").tobytes())
    return "v_" + h.hexdigest()[:24]


def clip_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def is_voice_id(value: str) -> bool:
    return bool(_ID.match(value))


MAX_NAME_CHARS = 64


def valid_voice_name(name: str) -> bool:
    """A name an upload may give its voice: 1-64 characters, not blank, not an id's form."""
    return 0 < len(name) <= MAX_NAME_CHARS and bool(name.strip()) and not is_voice_id(name)


@dataclass(frozen=True, slots=True)
class VoiceInfo:
    voice_id: str
    frames: int
    seconds: float
    name: str
    cached: bool  # True when the clip was already known (not encoded again)
    n_vq: int = 0  # codebooks per frame of its codes
    description: str = ""  # a designed voice's description (empty: an uploaded clip)


class LocalVoices:
    """This process's voices: id -> :class:`Voice`, least recently used evicted beyond
    ``capacity``; and clip digest -> id (an upload's alias), dropped with its voice.

    Lives on one event loop (no locks).
    """

    def __init__(self, capacity: int = 256, clock: Callable[[], float] = time.monotonic) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._clock = clock
        self._voices: OrderedDict[str, tuple[Voice, float]] = OrderedDict()
        self._clips: dict[str, str] = {}
        self._clips_of: dict[str, set[str]] = {}
        self._names: dict[str, str] = {}  # an upload's name -> its voice id
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._voices)

    def __contains__(self, voice_id: object) -> bool:
        return voice_id in self._voices

    def get(self, voice_id: str) -> Voice | None:
        item = self._voices.get(voice_id)
        if item is None:
            return None
        self._voices.move_to_end(voice_id)
        return item[0]

    def age(self, voice_id: str) -> float:
        """Seconds since the voice was stored or last confirmed (inf when unknown)."""
        item = self._voices.get(voice_id)
        return float("inf") if item is None else self._clock() - item[1]

    def confirm(self, voice_id: str) -> None:
        item = self._voices.get(voice_id)
        if item is not None:
            self._voices[voice_id] = (item[0], self._clock())

    def put(self, voice_id: str, voice: Voice, clip: str | None = None) -> None:
        self._voices[voice_id] = (voice, self._clock())
        self._voices.move_to_end(voice_id)
        if clip is not None:
            self._clips[clip] = voice_id
            self._clips_of.setdefault(voice_id, set()).add(clip)
        while len(self._voices) > self.capacity:
            old, _ = self._voices.popitem(last=False)
            self._forget_clips(old)
            self.evicted += 1
            log.info("voice cache full (%d): evicted %s", self.capacity, old)

    def pop(self, voice_id: str) -> bool:
        self._forget_clips(voice_id)
        return self._voices.pop(voice_id, None) is not None

    def clip(self, digest: str) -> str | None:
        return self._clips.get(digest)

    def name(self, name: str, voice_id: str) -> None:
        self._names[name] = voice_id

    def named(self, name: str) -> str | None:
        return self._names.get(name)

    def ids(self) -> list[str]:
        return list(self._voices)

    def names(self) -> list[str]:
        """The uploads' names this process knows."""
        return sorted(self._names)

    def _forget_clips(self, voice_id: str) -> None:
        for c in self._clips_of.pop(voice_id, ()):
            self._clips.pop(c, None)
        for n in [n for n, v in self._names.items() if v == voice_id]:
            del self._names[n]


class VoiceStore:
    """Voices by id: the local LRU, backed by a shared store when one is configured.

    ``get`` is synchronous and local (what a session already fetched); ``fetch``,
    ``add``, ``delete`` and ``ids`` may talk to the shared store and raise
    :class:`~streamtts.errors.VoiceStoreUnavailableError` when it cannot be reached.
    """

    def __init__(
        self,
        encode: Encode,
        capacity: int = 256,
        shared: SharedVoices | None = None,
        *,
        recheck_s: float = 60.0,
        max_stored_bytes: int = 64 << 10,
    ) -> None:
        self._encode = encode
        self.local = LocalVoices(capacity)
        self.shared = shared
        self.recheck_s = recheck_s
        self.max_stored_bytes = max_stored_bytes
        self._inflight: dict[str, asyncio.Future[tuple[str, Voice]]] = {}
        self.hits = 0
        self.encoded = 0

    @property
    def capacity(self) -> int:
        return self.local.capacity

    @property
    def backend(self) -> str:
        return "memory" if self.shared is None else self.shared.kind

    @property
    def available(self) -> bool:
        """Whether the shared store answered last time (always True without one)."""
        return self.shared is None or self.shared.up

    def __len__(self) -> int:
        return len(self.local)

    def __contains__(self, voice_id: object) -> bool:
        return isinstance(voice_id, str) and self.resolve(voice_id) in self.local

    def resolve(self, value: str) -> str:
        """The voice id ``value`` is, or stands for as an upload's name here (else itself)."""
        return value if is_voice_id(value) else self.local.named(value) or value

    def get(self, voice_id: str) -> Voice | None:
        """The voice (by id, or an upload's name) if this process holds it (no I/O)."""
        return self.local.get(self.resolve(voice_id))

    async def fetch(self, voice_id: str) -> Voice | None:
        """The voice (by id, or an upload's name), from the local cache or the shared store;
        None when unknown."""
        if not is_voice_id(voice_id):
            found = await self._find_name(voice_id)
            if found is None:
                return None
            voice_id = found
        local = self.local.get(voice_id)
        if self.shared is None:
            return local
        if local is not None:
            if self.local.age(voice_id) < self.recheck_s:
                return local
            try:
                # Also refreshes its TTL in the store: a voice in use never expires there.
                exists = await self.shared.touch(voice_id)
            except VoiceStoreUnavailableError:  # keep serving the copy we hold
                log.debug("voice %s: store unreachable; using the local copy", voice_id)
                return local
            if exists:
                self.local.confirm(voice_id)
                return local
            self.local.pop(voice_id)  # deleted (or expired) in the store
            return None
        voice = await self.shared.load(voice_id)
        if voice is not None:
            self.local.put(voice_id, voice)
        return voice

    async def _find_name(self, name: str) -> str | None:
        """The id an upload's name stands for: this process's, else the shared store's."""
        if not valid_voice_name(name):
            return None
        here = self.local.named(name)
        if self.shared is None:
            return here
        try:
            there = await self.shared.find_name(name)
        except VoiceStoreUnavailableError:
            if here is not None:  # keep serving what we know
                return here
            raise
        if there is not None:
            self.local.name(name, there)
        return there

    async def add(self, data: bytes, name: str = "", description: str = "") -> VoiceInfo:
        """Encode ``data`` (any audio file soundfile reads) unless known; return its id.
        ``name`` (checked by :func:`valid_voice_name`) then stands for it in requests;
        ``description``: what a designed voice was made from."""
        info = await self._add(data, name, description)
        if name:
            self.local.name(name, info.voice_id)
            if self.shared is not None:
                await self.shared.name(name, info.voice_id)
        return info

    async def _add(self, data: bytes, name: str, description: str = "") -> VoiceInfo:
        clip = clip_digest(data)
        known = await self._known_clip(clip)
        if known is not None:
            self.hits += 1
            return _info(*known, cached=True)
        fut = self._inflight.get(clip)
        if fut is not None:  # someone is encoding the same clip right now
            self.hits += 1
            return _info(*(await asyncio.shield(fut)), cached=True)
        fut = asyncio.get_running_loop().create_future()
        self._inflight[clip] = fut
        try:
            voice = await self._encode(data)
            voice = Voice(codes=voice.codes, name=name or voice.name, description=description)
            vid = voice_id_for(voice.codes)
            size = stored_size(voice)
            if size > self.max_stored_bytes:
                raise ReferenceAudioError(
                    f"the encoded voice is {size} bytes; the store's limit is "
                    f"{self.max_stored_bytes} (use a shorter clip)"
                )
            if self.shared is not None:
                await self.shared.save(vid, voice, clip)
        except BaseException as exc:
            self._inflight.pop(clip, None)
            if isinstance(exc, asyncio.CancelledError):
                fut.cancel()
            else:
                fut.set_exception(exc)
                fut.exception()  # mark retrieved: nobody else may be waiting
            # The traceback holds this frame: without this, exception -> frame -> future ->
            # exception is a cycle that keeps the upload's bytes (16 MiB) alive until the GC.
            del fut
            raise
        self._inflight.pop(clip, None)
        fut.set_result((vid, voice))
        self.encoded += 1
        self.local.put(vid, voice, clip)
        return _info(vid, voice, cached=False)

    async def _known_clip(self, clip: str) -> tuple[str, Voice] | None:
        vid = self.local.clip(clip)
        voice = self.local.get(vid) if vid is not None else None
        if self.shared is None:
            return None if vid is None or voice is None else (vid, voice)
        # With a shared store an upload answers only once the voice is there, so the id works
        # through every replica (and an unreachable store is a 503, not a local-only id).
        if vid is not None and voice is not None:
            if not await self.shared.touch(vid):
                await self.shared.save(vid, voice, clip)  # gone there (expired, store emptied)
            self.local.confirm(vid)
            return vid, voice
        vid = await self.shared.find_clip(clip)
        voice = await self.shared.load(vid) if vid is not None else None
        if vid is None or voice is None:
            return None
        self.local.put(vid, voice, clip)
        return vid, voice

    async def delete(self, voice_id: str) -> bool:
        """Forget the voice (by id, or an upload's name)."""
        if not is_voice_id(voice_id):
            voice_id = await self._find_name(voice_id) or voice_id
        here = self.local.pop(voice_id)
        if self.shared is None:
            return here
        there = await self.shared.delete(voice_id)
        return here or there

    async def ids(self) -> list[str]:
        if self.shared is None:
            return self.local.ids()
        return await self.shared.ids(limit=max(self.capacity, 1000))

    async def infos(self) -> list[VoiceInfo]:
        """Every voice (id, name, length): this process's, or the shared store's."""
        out = []
        for vid in await self.ids():
            v = self.local.get(vid) or await self.fetch(vid)
            if v is not None:
                out.append(_info(vid, v, cached=True))
        return out

    async def aclose(self) -> None:
        if self.shared is not None:
            await self.shared.aclose()


def _info(vid: str, v: Voice, cached: bool) -> VoiceInfo:
    return VoiceInfo(
        voice_id=vid,
        frames=int(v.codes.shape[0]),
        seconds=round(v.seconds, 3),
        name=v.name,
        cached=cached,
        n_vq=int(v.codes.shape[1]),
        description=v.description,
    )


def open_shared_voices(settings: VoiceStoreSettings) -> SharedVoices | None:
    """The shared store ``settings.url`` names; None for ``memory``. Connects lazily."""
    if settings.url == "memory":
        return None
    try:
        from .voice_redis import RedisVoices
    except ImportError as exc:
        raise ConfigError(
            f"voice_store {redact_url(settings.url)!r} needs redis-py: pip install 'streamtts[redis]'"
        ) from exc
    return RedisVoices(settings)
