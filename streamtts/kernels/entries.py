"""What the engine calls each step: one interface per kernel, met by its spec and its twin.

Every entry is bound once to the caller's buffers and called with a range of rows
``[lo, hi)``: rows are independent (each is one stream's slot), so a caller may cut a step
into ranges and call them one after another, or, with one entry per thread for the row
sampler, from several threads on disjoint ranges (issue 28). ``compiled`` says which
implementation it is.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ..errors import StreamTTSError


class Unreadable(StreamTTSError, ValueError):
    """A compiled twin does not read the buffers it was offered (the spec runs instead)."""


class DelayStep(Protocol):
    """``DelayStates.step`` on bound buffers: the slots in ``slots[lo:hi]`` (distinct) step
    on rows ``[lo, hi)`` of the pair logits, audio logits and output rows."""

    compiled: bool
    reads_lent: bool
    """Whether :meth:`read_logits_at` takes an address: the logits where a backbone left them."""

    def __call__(self, lo: int, hi: int) -> None: ...

    def read_logits_at(self, address: int) -> None:
        """The next steps read the pair and audio logits from rows at ``address`` laid out as
        the bound logits rows (0: the bound buffers again); a ValueError where not ``reads_lent``."""

    def pair_logits(self, rows: int) -> np.ndarray:
        """The first ``rows`` rows (rows, 2) of the pair logits the next step reads, writable."""
        ...

    def audio_logits(self, rows: int) -> np.ndarray:
        """The first ``rows`` rows (rows, K, A) of the audio logits the next step reads, writable."""
        ...


class FramePush(Protocol):
    """``FrameAssembler.push`` on bound buffers: row b of the rows goes to slot ``slots[b]``
    for b in ``[lo, hi)``; the frames it completed land in rows ``[lo, hi)`` of ``frames``,
    ``ready`` and ``index``; returns how many of them are ready."""

    compiled: bool
    frames: np.ndarray
    ready: np.ndarray
    index: np.ndarray

    def __call__(self, lo: int, hi: int) -> int: ...


class StepEmbed(Protocol):
    """``Embedder.__call__`` on bound buffers: ``out[b]`` = the embedding of
    ``rows[slots[b]]`` for b in ``[lo, hi)``."""

    compiled: bool

    def __call__(self, lo: int, hi: int) -> None: ...


def check_range(lo: int, hi: int, rows: int) -> None:
    """``[lo, hi)`` within the ``rows`` bound rows, or a ValueError naming both."""
    if not 0 <= lo <= hi <= rows:
        raise ValueError(f"rows [{lo}, {hi}) do not fit the {rows} rows bound")
