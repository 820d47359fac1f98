"""A stream whose logits are not finite ends alone; the other streams of its step go on.

A backbone that overflows (float16 arithmetic on a model whose activations exceed it) gives
NaN for every logit of that stream's row. Its pair logits (two floats a row) show it, so
each step checks them before sampling: a bad row's logits are set to finite stand-ins so the
step samples every stream, and the bad streams' rows are dropped from the step before their
frames are routed; the caller ends those streams with :class:`NonFiniteLogitsError`. Rows
whose pair is finite but whose audio logits are not still make the step raise (the rarer
overflow of one head): then every stream of that step fails, as before.
"""

from __future__ import annotations

import numpy as np

from ..kernels.entries import DelayStep

__all__ = ["NonFiniteGuard"]


class NonFiniteGuard:
    """Checks the pair logits of a step's rows (into a buffer bound once) and drops bad rows."""

    def __init__(self, step: DelayStep, rows: int) -> None:
        self._step = step
        self._finite = np.zeros((rows, 2), dtype=np.bool_)

    def neutralise(self, b: int) -> np.ndarray | None:
        """Rows among the first ``b`` whose pair logits hold a NaN or +inf, or are both -inf
        (None: none, the usual step); their pair and audio logits are made finite."""
        pair = self._step.pair_logits(b)
        fin = self._finite[:b]
        np.isfinite(pair, out=fin)
        if fin.all():
            return None
        bad = np.flatnonzero(np.isnan(pair).any(axis=1) | (pair == np.inf).any(axis=1) | ~fin.any(axis=1))
        if not bad.size:  # a -inf in one column: a mask (a forced length), not an overflow
            return None
        pair[bad] = 0.0
        self._step.audio_logits(b)[bad] = 0.0
        return bad

    @staticmethod
    def drop(slot_buf: np.ndarray, out: np.ndarray, b: int, bad: np.ndarray) -> int:
        """Remove rows ``bad`` from the first ``b`` of the step's slots and output rows (the
        push reads both from there); returns how many rows are left."""
        keep = np.ones(b, dtype=np.bool_)
        keep[bad] = False
        n = int(keep.sum())
        slot_buf[:n] = slot_buf[:b][keep]
        out[:n] = out[:b][keep]
        return n
