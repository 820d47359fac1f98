"""Pronunciation lexicons on the server: its own (``serve --lexicon FILE``), stored ones
(``POST /v1/lexicons``) and a request's (its ``lexicon`` field). The matching rules are
text/lexicon.py's.

A request's text is read with, in this order (earlier wins a tie, text/lexicon.py):

1. the request's own entries (``lexicon`` as a map), or the stored lexicon it names
   (``lexicon`` as an id ``lx_...`` or a name given at upload);
2. the server's lexicon (``serve --lexicon FILE``), for every request.

A stored lexicon's id is its content address (:func:`~streamtts.text.lexicon.lexicon_id`),
the same on every replica. Where they live follows the voice store
(``ServerSettings.voice_store``): ``memory``, this process's LRU (an evicted lexicon is
unknown again); ``redis://...``, the same Redis as the voices under their own keys
(voice_redis.py), shared by every replica, with the voices' TTL refreshed on use. Each
replica keeps the lexicons it used compiled (a hit costs no round trip); a copy older than
``recheck_s`` is confirmed with the store first (so a lexicon deleted through another
replica is unknown there within ``recheck_s``).
"""

from __future__ import annotations

import json
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import FieldError, VoiceStoreUnavailableError
from ..request import LexiconLayer
from ..text.lexicon import MAX_LEXICON_BYTES, Lexicon

__all__ = [
    "MAX_LEXICON_BODY",
    "MAX_NAME_CHARS",
    "LexiconInfo",
    "LexiconStore",
    "is_lexicon_id",
    "valid_lexicon_name",
]

_ID = re.compile(r"^lx_[0-9a-f]{24}$")
MAX_NAME_CHARS = 64
# a POST body: the lexicon's JSON (escapes make it longer than its text)
MAX_LEXICON_BODY = 4 * MAX_LEXICON_BYTES


def is_lexicon_id(value: str) -> bool:
    return bool(_ID.match(value))


def valid_lexicon_name(name: str) -> bool:
    return 0 < len(name) <= MAX_NAME_CHARS and bool(name.strip()) and not is_lexicon_id(name)


class SharedLexicons(Protocol):
    """The shared store's lexicon half (voice_redis.RedisVoices)."""

    kind: str
    up: bool

    async def save_lexicon(self, lexicon_id: str, value: bytes, name: str) -> None: ...

    async def load_lexicon(self, lexicon_id: str) -> bytes | None: ...

    async def touch_lexicon(self, lexicon_id: str) -> bool: ...

    async def find_lexicon_name(self, name: str) -> str | None: ...

    async def delete_lexicon(self, lexicon_id: str, names: list[str]) -> bool: ...

    async def lexicon_ids(self, limit: int) -> list[str]: ...


@dataclass(frozen=True, slots=True)
class LexiconInfo:
    lexicon_id: str
    name: str
    size: int  # entries

    def as_dict(self) -> dict[str, Any]:
        return {"lexicon_id": self.lexicon_id, "name": self.name, "size": self.size}


class LexiconStore:
    """The server's lexicon (``base``) and the stored ones by id or name: this process's LRU
    of compiled lexicons, backed by ``shared`` when configured. Lives on one event loop."""

    def __init__(
        self,
        base: Lexicon | None = None,
        shared: SharedLexicons | None = None,
        *,
        capacity: int = 64,
        recheck_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base = base if base is not None and len(base) else None
        self.shared = shared
        self.capacity = capacity
        self.recheck_s = recheck_s
        self._clock = clock
        self._local: OrderedDict[str, tuple[Lexicon, float]] = OrderedDict()
        self._names: dict[str, str] = {}

    @property
    def backend(self) -> str:
        return "memory" if self.shared is None else self.shared.kind

    # -- a request's lexicons ---------------------------------------------------------------
    def layers(self, value: object) -> tuple[LexiconLayer, ...]:
        """What a request's ``lexicon`` (a map, a stored one's id or name, or None) reads its
        text with, the server's own last. A stored one must be here already (:meth:`fetch`
        brings it from the shared store); else a :class:`FieldError` naming it."""
        under: tuple[LexiconLayer, ...] = () if self.base is None else (self.base,)
        if value is None:
            return under
        if isinstance(value, str):
            found = self.get(value)
            if found is None:
                raise FieldError(
                    "lexicon",
                    f"lexicon: no stored lexicon {value[:80]!r} on this server (POST /v1/lexicons stores "
                    "one; GET /v1/lexicons lists them), or give the entries as a map",
                )
            return (found, *under)
        return (Lexicon.compile(value), *under)

    def get(self, ref: str) -> Lexicon | None:
        """The stored lexicon ``ref`` (an id or a name) if this process holds it (no I/O)."""
        item = self._local.get(self._resolve(ref))
        return None if item is None else item[0]

    def _resolve(self, ref: str) -> str:
        return ref if is_lexicon_id(ref) else self._names.get(ref, ref)

    async def fetch(self, ref: str) -> Lexicon | None:
        """The stored lexicon ``ref`` (an id or a name), from here or the shared store."""
        if self.shared is None:
            return self.get(ref)
        lid = ref
        if not is_lexicon_id(ref):
            if not valid_lexicon_name(ref):
                return None
            try:
                found = await self.shared.find_lexicon_name(ref)
            except VoiceStoreUnavailableError:
                if ref in self._names:  # keep serving what we know
                    return self.get(ref)
                raise
            if found is None:
                self._names.pop(ref, None)
                return None
            self._names[ref] = lid = found
        item = self._local.get(lid)
        if item is not None:
            if self._clock() - item[1] < self.recheck_s:
                self._local.move_to_end(lid)
                return item[0]
            try:
                exists = await self.shared.touch_lexicon(lid)
            except VoiceStoreUnavailableError:
                return item[0]  # keep serving the copy we hold
            if exists:
                self._put(lid, item[0])
                return item[0]
            self._forget(lid)
            return None
        data = await self.shared.load_lexicon(lid)
        if data is None:
            return None
        lex = _decode(data)
        self._put(lid, lex)
        return lex

    # -- the endpoints' operations ----------------------------------------------------------
    async def add(self, entries: object, name: str = "") -> tuple[LexiconInfo, bool]:
        """Store ``entries`` (checked: :class:`FieldError` naming the entry); (its info,
        whether it was new). ``name`` then stands for it in requests."""
        lex = Lexicon.compile(entries, name=name)
        lid = lex.id
        known = self._local.get(lid)
        if self.shared is not None:
            value = json.dumps({"name": name, "entries": lex.entries}, ensure_ascii=False).encode(
                "utf-8", "surrogatepass"
            )
            await self.shared.save_lexicon(lid, value, name)
        self._put(lid, lex if known is None or name else known[0])
        if name:
            self._names[name] = lid
        stored = self._local[lid][0]
        return LexiconInfo(lid, stored.name, len(stored)), known is None

    async def delete(self, ref: str) -> bool:
        lid = self._resolve(ref)
        if self.shared is not None and not is_lexicon_id(lid):
            lid = await self.shared.find_lexicon_name(ref) or lid
        item = self._local.get(lid)
        here = self._forget(lid)
        if self.shared is None:
            return here
        names = [ref] if not is_lexicon_id(ref) else []
        if item is not None and item[0].name:
            names.append(item[0].name)
        there = await self.shared.delete_lexicon(lid, names)
        return here or there

    async def infos(self) -> list[LexiconInfo]:
        if self.shared is None:
            return [LexiconInfo(lid, lx.name, len(lx)) for lid, (lx, _) in self._local.items()]
        out = []
        for lid in await self.shared.lexicon_ids(limit=1000):
            lx = await self.fetch(lid)
            if lx is not None:
                out.append(LexiconInfo(lid, lx.name, len(lx)))
        return out

    def _put(self, lid: str, lex: Lexicon) -> None:
        self._local[lid] = (lex, self._clock())
        self._local.move_to_end(lid)
        if lex.name:
            self._names[lex.name] = lid
        while len(self._local) > self.capacity:
            old, _ = self._local.popitem(last=False)
            self._drop_names(old)

    def _forget(self, lid: str) -> bool:
        self._drop_names(lid)
        return self._local.pop(lid, None) is not None

    def _drop_names(self, lid: str) -> None:
        for n in [n for n, v in self._names.items() if v == lid]:
            del self._names[n]


def _decode(data: bytes) -> Lexicon:
    try:
        obj = json.loads(data)
        return Lexicon.compile(obj["entries"], name=str(obj.get("name") or ""))
    except (ValueError, KeyError, TypeError) as exc:  # FieldError is a ValueError
        raise VoiceStoreUnavailableError(
            f"the store returned an unreadable lexicon: {exc}"
        ) from exc
