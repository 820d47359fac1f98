"""KV snapshots of shared prompt prefixes, so a stream can skip recomputing them.

Every prompt starts with the same template, and a voice agent speaks every reply
with the same reference voice: all rows before the text field are identical
across its requests (a 10 s voice is about 200 of them). The engine prefills such
a prefix once, keeps the sequence's KV cells as bytes (llama.cpp's per-sequence
state), and loads them into the next stream's slot instead of recomputing.

Pure bookkeeping (no llama.cpp here): entries are keyed by a digest of the
prefix rows, evicted least-recently-used by size, and a prefix being computed by
one stream is *claimed* so others with the same prefix wait for it rather than
compute it again.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np


def prefix_key(prompt: np.ndarray, rows: int) -> bytes:
    """Digest of the first ``rows`` prompt rows (text and audio channels)."""
    head = np.ascontiguousarray(prompt[:rows])
    return hashlib.blake2b(head.tobytes(), digest_size=16, person=rows.to_bytes(8, "little")).digest()


@dataclass(slots=True)
class _Entry:
    state: np.ndarray | None  # None while its owner computes it
    owner: int  # slot computing it (-1 once stored)
    rows: int
    session: int = 0  # the session whose own voice it holds (dropped when it ends); 0: none


class PrefixCache:
    """LRU map prefix key -> KV snapshot, bounded in bytes."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = max(0, int(capacity_bytes))
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    @property
    def enabled(self) -> bool:
        return self.capacity > 0

    def __len__(self) -> int:
        return sum(e.state is not None for e in self._entries.values())

    def lookup(self, key: bytes, slot: int, rows: int) -> np.ndarray | str:
        """The snapshot for ``key`` (counted as a hit), ``"wait"`` when another slot
        is computing it, or ``"compute"``: the prefix is now claimed by ``slot``."""
        e = self._entries.get(key)
        if e is not None and e.state is not None:
            self._entries.move_to_end(key)
            self.hits += 1
            return e.state
        if e is not None and e.owner != slot:
            return "wait"
        if e is None:
            self.misses += 1
            self._entries[key] = _Entry(None, slot, rows)
        return "compute"

    def store(self, key: bytes, slot: int, state: np.ndarray, session: int = 0) -> bool:
        """Keep ``slot``'s computed snapshot (of ``session``'s own voice: see
        :meth:`drop_session`); False when it cannot fit at all."""
        e = self._entries.get(key)
        if e is None or e.owner != slot:
            return False  # released meanwhile (owner aborted and another took over)
        if state.nbytes > self.capacity:
            del self._entries[key]
            return False
        self._evict(self.capacity - state.nbytes)
        e.state, e.owner, e.session = state, -1, session
        self.bytes += state.nbytes
        self._entries.move_to_end(key)
        return True

    def release(self, slot: int) -> None:
        """Drop claims of ``slot`` (finished or cancelled before storing)."""
        for k in [k for k, e in self._entries.items() if e.state is None and e.owner == slot]:
            del self._entries[k]

    def drop_session(self, session: int) -> None:
        """Drop the snapshots of ``session``'s own voice: it ended, and no other request has
        that voice (a session speaking several sentences without a reference takes its first
        1.28 s as the voice of the rest; kept, one such entry per session filled the cache
        and evicted the prefixes worth keeping)."""
        for k in [k for k, e in self._entries.items() if e.session == session and e.state is not None]:
            self.bytes -= self._entries.pop(k).state.nbytes  # type: ignore[union-attr]

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0

    def _evict(self, budget: int) -> None:
        for k in list(self._entries):
            if self.bytes <= budget:
                return
            e = self._entries[k]
            if e.state is not None:
                self.bytes -= e.state.nbytes
                del self._entries[k]

    def info(self) -> dict[str, int]:
        return {
            "entries": len(self),
            "bytes": self.bytes,
            "capacity_bytes": self.capacity,
            "hits": self.hits,
            "misses": self.misses,
        }
