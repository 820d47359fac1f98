"""The shared voice store: its interface, the stored value's format, and opening one by URL.

Backends (``ServerSettings.voice_store``):

* ``memory``: no shared store; voices live in each process's LRU (``voices.LocalVoices``).
* ``redis://[:password@]host:port/db`` (or ``rediss://``, ``unix://``): Redis through
  redis-py's asyncio client (``voice_redis.RedisVoices``); ``voices.open_shared_voices``
  opens one from the URL.

A stored value is one msgpack map (:class:`StoredVoice`): the codes as little-endian
uint16 (a code is 0..1024), their shape, the voice's name and when it was stored.
Every backend method raises :class:`~streamtts.errors.VoiceStoreUnavailableError`
when the store cannot be reached.
"""

from __future__ import annotations

import time
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

import msgspec
import numpy as np

from ..errors import ConfigError, VoiceStoreUnavailableError
from ..request import Voice

__all__ = [
    "SharedVoices",
    "StoredVoice",
    "VoiceStoreSettings",
    "decode_voice",
    "encode_voice",
    "redact_url",
    "stored_size",
]


class VoiceStoreSettings(msgspec.Struct, frozen=True, kw_only=True):
    url: str = "memory"  # memory | redis://host:6379/0 | rediss://... | unix:///path?db=0
    ttl_s: float = 7 * 24 * 3600.0  # a stored voice's lifetime, refreshed whenever it is used
    max_stored_bytes: int = 64 << 10  # cap on one stored value (a 30 s voice is ~24 KB)
    recheck_s: float = 60.0  # a local copy older than this is confirmed with the store
    key_prefix: str = "streamtts:"
    connect_timeout_s: float = 1.0
    timeout_s: float = 2.0

    def validate(self) -> VoiceStoreSettings:
        if self.url != "memory" and urlsplit(self.url).scheme not in ("redis", "rediss", "unix"):
            raise ConfigError(
                f"voice_store must be 'memory' or a redis:// URL, got {redact_url(self.url)!r}"
            )
        if self.ttl_s <= 0 or self.recheck_s <= 0:
            raise ConfigError("voice store ttl_s and recheck_s must be > 0")
        if self.recheck_s >= self.ttl_s:
            raise ConfigError("voice store recheck_s must be shorter than ttl_s")
        if self.max_stored_bytes < 1024:
            raise ConfigError(f"max_stored_bytes must be >= 1024, got {self.max_stored_bytes}")
        return self


class SharedVoices(Protocol):
    """A store every replica reaches. ``up``: whether it answered last time."""

    kind: str
    up: bool

    async def load(self, voice_id: str) -> Voice | None:
        """The voice (refreshing its TTL), or None when the store does not hold it."""

    async def touch(self, voice_id: str) -> bool:
        """Refresh the voice's TTL; False when the store does not hold it."""

    async def save(self, voice_id: str, voice: Voice, clip: str) -> None:
        """Store the voice and the uploaded clip's digest as an alias of its id."""

    async def find_clip(self, clip: str) -> str | None:
        """The id of the voice encoded from the clip with this digest, if stored."""

    async def name(self, name: str, voice_id: str) -> None:
        """Let ``name`` stand for the voice (an upload with a name; the latest one keeps it)."""

    async def find_name(self, name: str) -> str | None:
        """The id ``name`` stands for, if stored."""

    async def delete(self, voice_id: str) -> bool: ...

    async def ids(self, limit: int) -> list[str]: ...

    async def ping(self) -> bool: ...

    async def aclose(self) -> None: ...


class StoredVoice(msgspec.Struct, kw_only=True):
    codes: bytes  # little-endian uint16, frames x n_vq, row-major
    frames: int
    n_vq: int
    name: str = ""
    stored_at: float = 0.0  # unix time
    version: int = 1
    description: str = ""  # a designed voice's description (empty: an uploaded clip)


_ENC = msgspec.msgpack.Encoder()
_DEC = msgspec.msgpack.Decoder(StoredVoice)


def encode_voice(voice: Voice) -> bytes:
    c = np.asarray(voice.codes)
    if c.ndim != 2 or c.size == 0 or c.min() < 0 or c.max() > 0xFFFF:
        raise ValueError(f"voice codes of shape {c.shape} cannot be stored")
    return _ENC.encode(
        StoredVoice(
            codes=c.astype("<u2").tobytes(),
            frames=int(c.shape[0]),
            n_vq=int(c.shape[1]),
            name=voice.name,
            stored_at=time.time(),
            description=voice.description,
        )
    )


def decode_voice(data: bytes) -> Voice:
    """A stored value back into a :class:`Voice` (int64 codes, as the encoder gives them)."""
    try:
        v = _DEC.decode(data)
    except msgspec.DecodeError as exc:
        raise VoiceStoreUnavailableError(f"the voice store returned an unreadable value: {exc}") from exc
    if v.frames < 1 or v.n_vq < 1 or len(v.codes) != 2 * v.frames * v.n_vq:
        raise VoiceStoreUnavailableError(
            f"the voice store returned a value of {len(v.codes)} code bytes for "
            f"{v.frames} x {v.n_vq} codes"
        )
    codes = np.frombuffer(v.codes, dtype="<u2").reshape(v.frames, v.n_vq).astype(np.int64)
    return Voice(codes=codes, name=v.name, description=v.description)


def stored_size(voice: Voice) -> int:
    """Bytes of the value :func:`encode_voice` writes, without writing it."""
    return int(np.asarray(voice.codes).size) * 2 + 64 + len(voice.name.encode()) + len(voice.description.encode())


def redact_url(url: str) -> str:
    """The URL without its password (for logs and errors)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host += f":{parts.port}"
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit((parts.scheme, user + host, parts.path, parts.query, parts.fragment))
