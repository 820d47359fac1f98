"""The compiled ``FrameAssembler.push`` (``native/frames.c``) on buffers bound once.

:class:`~streamtts.core.frames.FrameAssembler` stays the specification; this is its twin,
working on the assembler's own ring and counts, so either may push any step
(``tests/kernels/test_conformance.py`` runs both side by side). Why: after a decode every
NumPy call runs on cold caches, and the NumPy push's fifteen calls cost 0.1-0.15 ms a step there.
"""

from __future__ import annotations

import ctypes

import numpy as np

from ..core.frames import FrameAssembler
from ..model._llama import SttFrames, ptr
from .entries import Unreadable, check_range


class FramePushTwin:
    """Pushes ``rows[b]`` to slot ``slots[b]`` for b in ``[lo, hi)``; the frames it completed
    land in ``frames``, ``ready`` and ``index`` (the same rows), as ``FrameAssembler.push``
    returns them."""

    compiled = True

    def __init__(self, lib: ctypes.CDLL, assembler: FrameAssembler, slots: np.ndarray, rows: np.ndarray) -> None:
        k = assembler.n_vq
        for name, a in (("ring", assembler.ring), ("count", assembler.count)):
            if a.dtype != np.int64 or not a.flags.c_contiguous:  # a change in FrameAssembler
                raise TypeError(f"FrameAssembler.{name} must be contiguous int64, got {a.dtype}")
        if slots.dtype != np.int64 or slots.ndim != 1 or not slots.flags.c_contiguous:
            raise Unreadable(f"slots must be a contiguous 1-D int64 array, got {slots.dtype} {slots.shape}")
        if rows.dtype != np.int64 or rows.shape != (slots.shape[0], k) or rows.strides[1] != 8 or rows.strides[0] % 8:
            raise Unreadable(f"rows must be int64 ({slots.shape[0]}, {k}) with contiguous codes, got {rows.dtype} {rows.shape}")
        r = slots.shape[0]
        self.frames = np.zeros((r, k), dtype=np.int64)
        self.ready = np.zeros(r, dtype=np.bool_)
        self.index = np.zeros(r, dtype=np.int64)
        self._keep = (assembler, slots, rows)  # what the addresses point into
        self._capacity = assembler.capacity
        self._struct = SttFrames(
            capacity=assembler.capacity, n_vq=k, pad=assembler.pad, ring=ptr(assembler.ring), count=ptr(assembler.count)
        )
        self._ref = ctypes.byref(self._struct)
        self._fn = lib.stt_frames_push
        self._rows = r
        self._slots = slots
        self._row_stride = rows.strides[0] // 8
        # each buffer's address and the bytes from one row to the next
        bufs = (slots, rows, self.frames, self.ready, self.index)
        self._at0 = tuple(int(ptr(x) or 0) for x in bufs)
        self._row_bytes = tuple(x.strides[0] for x in bufs)

    def __call__(self, lo: int, hi: int) -> int:
        if not 0 <= lo <= hi <= self._rows:
            check_range(lo, hi, self._rows)
        s, r, f, rd, ix = self._at0  # the engine's call (lo = 0): the addresses as bound
        if lo:
            s_b, r_b, f_b, rd_b, ix_b = self._row_bytes
            s, r, f, rd, ix = s + lo * s_b, r + lo * r_b, f + lo * f_b, rd + lo * rd_b, ix + lo * ix_b
        rc: int = self._fn(self._ref, s, hi - lo, r, self._row_stride, f, rd, ix)
        if rc < 0:
            raise ValueError(f"slots must be in [0, {self._capacity}), got {self._slots[lo:hi].tolist()}")
        return rc
