"""Turns on shared cores: the backbone's compute and the codec's calls, one at a time.

When llama.cpp and the codec both run on the CPU they share its cores. Running them at
once costs more than running them in turn: llama.cpp's threads meet at a barrier after
every operation of the graph, so one of its threads losing its core to a codec thread
stalls the whole decode until the codec's call is over, while the other thread spins at
the barrier instead of leaving its core to the codec. Taking turns, each runs alone on all
the cores; the codec's calls (a few ms every few steps) go first when they wait, so audio
is never held back by more than one backbone call. On a GPU, where the codec has its own
stream, turns are off (``codec_turns``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

__all__ = ["CoreTurns"]

_FREE = 0
_BACKBONE = 1
_CODEC = 2


class CoreTurns:
    """``with turns.backbone():`` around the backbone's compute, ``with turns.codec():``
    around a codec call; when ``enabled`` is false both are no-ops."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._cv = threading.Condition()
        self._holder = _FREE
        self._last = _FREE
        self._waiting = {_BACKBONE: 0, _CODEC: 0}
        self.backbone_waits = 0  # how often the backbone waited for a codec call (info, tests)
        self.codec_waits = 0

    def backbone(self) -> AbstractContextManager[None]:
        return self._turn(_BACKBONE) if self.enabled else nullcontext()

    def codec(self) -> AbstractContextManager[None]:
        return self._turn(_CODEC) if self.enabled else nullcontext()

    def _must_wait(self, who: int) -> bool:
        # When both wait they alternate (neither starves); a codec call that waits goes
        # before the backbone's next call (it is short, and a listener waits for it).
        other = _CODEC if who == _BACKBONE else _BACKBONE
        return self._holder != _FREE or (self._waiting[other] > 0 and self._last == who)

    @contextmanager
    def _turn(self, who: int) -> Iterator[None]:
        with self._cv:
            if self._must_wait(who):
                if who == _CODEC:
                    self.codec_waits += 1
                else:
                    self.backbone_waits += 1
                self._waiting[who] += 1
                while self._must_wait(who):
                    self._cv.wait()
                self._waiting[who] -= 1
            self._holder = self._last = who
        try:
            yield
        finally:
            with self._cv:
                self._holder = _FREE
                self._cv.notify_all()
