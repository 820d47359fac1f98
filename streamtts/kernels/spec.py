"""The specifications as kernel entries: the NumPy code of ``core/`` and ``model/tables.py``
on buffers bound once. A caller binds the spec; :class:`~streamtts.kernels.Kernels` hands
back it or its twin on the same buffers, so the caller never asks which one it has."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..core.delay_state import DelayStates
from ..core.frames import FrameAssembler
from ..model.tables import Embedder
from .entries import check_range


class SpecDelayStep:
    """:meth:`DelayStates.step` of the slots in ``slots[lo:hi]`` on rows ``[lo, hi)`` of
    ``pair``, ``audio`` and ``out``; ``full_text(i)`` gives bound row i's full text logits."""

    compiled = False

    def __init__(
        self,
        states: DelayStates,
        slots: np.ndarray,
        pair: np.ndarray,
        audio: np.ndarray,
        out: np.ndarray,
        full_text: Callable[[int], np.ndarray],
    ) -> None:
        # the bound buffers, which a twin built from this spec reads too
        self.states, self.slots, self.pair, self.audio, self.out = states, slots, pair, audio, out
        self.full_text = full_text

    reads_lent = False
    """It reads the bound buffers only (see :meth:`read_logits_at`)."""

    def read_logits_at(self, address: int) -> None:
        if address:
            raise ValueError("the NumPy delay step reads its bound buffers only: lent rows cannot be read")

    def pair_logits(self, rows: int) -> np.ndarray:
        return self.pair[:rows]

    def audio_logits(self, rows: int) -> np.ndarray:
        return self.audio[:rows]

    def __call__(self, lo: int, hi: int) -> None:
        check_range(lo, hi, self.slots.shape[0])
        full = self.full_text if lo == 0 else (lambda b: self.full_text(lo + b))
        self.states.step(self.slots[lo:hi], self.pair[lo:hi], self.audio[lo:hi], full, out=self.out[lo:hi])


class SpecFramePush:
    """:meth:`FrameAssembler.push` of ``rows[lo:hi]`` to the slots in ``slots[lo:hi]``."""

    compiled = False

    def __init__(self, assembler: FrameAssembler, slots: np.ndarray, rows: np.ndarray) -> None:
        r, k = slots.shape[0], assembler.n_vq
        self.assembler, self.slots, self.rows = assembler, slots, rows
        self.frames = np.zeros((r, k), dtype=np.int64)
        self.ready = np.zeros(r, dtype=np.bool_)
        self.index = np.zeros(r, dtype=np.int64)

    def __call__(self, lo: int, hi: int) -> int:
        check_range(lo, hi, self.slots.shape[0])
        _, ready, index = self.assembler.push(self.slots[lo:hi], self.rows[lo:hi], frames_out=self.frames[lo:hi])
        self.ready[lo:hi] = ready
        self.index[lo:hi] = index
        return int(np.count_nonzero(ready))


class SpecStepEmbed:
    """:meth:`Embedder.__call__` of ``rows[slots[lo:hi]]`` into ``out[lo:hi]``."""

    compiled = False

    def __init__(self, embedder: Embedder, slots: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
        self.embedder, self.slots, self.rows, self.out = embedder, slots, rows, out
        self._n_max = min(slots.shape[0], out.shape[0])
        self._gathered = np.zeros((self._n_max, rows.shape[1]), dtype=np.int64)

    def __call__(self, lo: int, hi: int) -> None:
        check_range(lo, hi, self._n_max)
        g = self._gathered[lo:hi]
        np.take(self.rows, self.slots[lo:hi], axis=0, out=g, mode="clip")  # "clip": no buffered copy
        self.embedder(g, out=self.out[lo:hi])
