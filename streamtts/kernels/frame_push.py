"""The compiled ``FrameAssembler.push`` (``native/frames.c``) on buffers bound once.

:class:`~streamtts.core.frames.FrameAssembler` stays the specification; this is its twin,
working on the assembler's own ring and counts, so either may push any step
(``tests/kernels/test_frames_push.py`` runs both side by side). The engine binds it to its step's
slot numbers and rows (``sampler: native``, the default): after a decode every NumPy call
runs on cold caches, and the NumPy push's fifteen calls cost 0.1-0.15 ms a step there.
"""

from __future__ import annotations

import ctypes

import numpy as np

from ..core.frames import FrameAssembler
from ..model._llama import SttFrames, load_bridge
from ..model._llama import ptr as _ptr


class BoundFramePush:
    """Pushes ``rows[b]`` to slot ``slots[b]`` for b < n; the frames it completed land in
    ``frames``, ``ready`` and ``index`` (first n rows), as ``FrameAssembler.push`` returns them."""

    def __init__(self, assembler: FrameAssembler, slots: np.ndarray, rows: np.ndarray) -> None:
        k = assembler.n_vq
        for name, a in (("ring", assembler.ring), ("count", assembler.count)):
            if a.dtype != np.int64 or not a.flags.c_contiguous:  # a change in FrameAssembler
                raise TypeError(f"FrameAssembler.{name} must be contiguous int64, got {a.dtype}")
        if slots.dtype != np.int64 or slots.ndim != 1 or not slots.flags.c_contiguous:
            raise ValueError(f"slots must be a contiguous 1-D int64 array, got {slots.dtype} {slots.shape}")
        if rows.dtype != np.int64 or rows.shape != (slots.shape[0], k) or rows.strides[1] != 8 or rows.strides[0] % 8:
            raise ValueError(f"rows must be int64 ({slots.shape[0]}, {k}) with contiguous codes, got {rows.dtype} {rows.shape}")
        r = slots.shape[0]
        self._keep = (assembler, slots, rows)  # the arrays the addresses point into
        self.frames = np.zeros((r, k), dtype=np.int64)
        self.ready = np.zeros(r, dtype=np.bool_)
        self.index = np.zeros(r, dtype=np.int64)
        self._struct = SttFrames(
            capacity=assembler.capacity, n_vq=k, pad=assembler.pad, ring=_ptr(assembler.ring), count=_ptr(assembler.count)
        )
        self._ref = ctypes.byref(self._struct)
        self._fn = load_bridge().stt_frames_push
        self._rows = r
        self._slots = slots
        self._args = (_ptr(slots), _ptr(rows), rows.strides[0] // 8, _ptr(self.frames), _ptr(self.ready), _ptr(self.index))

    def __call__(self, n: int) -> int:
        """Push the first ``n`` rows; returns how many frames became ready."""
        if n > self._rows:
            raise ValueError(f"{n} streams do not fit the {self._rows} rows bound")
        a = self._args
        rc: int = self._fn(self._ref, a[0], n, a[1], a[2], a[3], a[4], a[5])
        if rc < 0:
            raise ValueError(f"slots must be in [0, {self._keep[0].capacity}), got {self._slots[:n].tolist()}")
        return rc
