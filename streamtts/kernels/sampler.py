"""The compiled row sampler (``native/sampler.c``): :func:`core.sampling.sample_rows`, faster.

Same arguments, same tokens for the same uniforms (``tests/kernels/test_conformance.py``
checks token for token against the NumPy sampler), so the engine can use either (the
config's ``kernels: ["-row_sampler"]`` or ``sampler: numpy`` turns this one off). Two
differences, both allowed by ``sample_rows``' contract: ``logits`` is only read (the
NumPy sampler scales it in place), and it may be any float32 array whose last axis
is contiguous, with rows numbered over its leading axes in C order, so strided views
(the fused heads' audio logits between text columns, ``(B, K, A)``) need no copy.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from ..core.sampling import SamplerWorkspace
from ..errors import NonFiniteLogitsError
from ..model._llama import load_bridge
from ..model._llama import ptr as _ptr

_SMALL_K = 256  # sampler.c keeps up to this many candidates on its stack; above, scratch


class NativeSampler:
    """Callable like ``sample_rows``; one per thread (it keeps its buffers). Rows may be
    strided views over several leading axes (``DelayStates(strided_rows=True)`` passes them
    uncopied)."""

    def __init__(self, lib: ctypes.CDLL | None = None) -> None:
        self._fn = (lib if lib is not None else load_bridge()).stt_sample_rows
        self._bad = np.zeros(0, dtype=np.uint8)
        self._scratch = np.zeros(0, dtype=np.uint8)
        # every row's offset for the last layout sampled whole (steady state: the same each step)
        self._whole: tuple[object, np.ndarray] = ((), np.zeros(0, dtype=np.int64))

    def __call__(
        self,
        logits: np.ndarray,
        temperature: np.ndarray,
        top_k: np.ndarray,
        top_p: np.ndarray,
        u: np.ndarray,
        *,
        rows: np.ndarray | None = None,
        seen: np.ndarray | None = None,
        penalty: np.ndarray | None = None,
        out: np.ndarray | None = None,
        workspace: SamplerWorkspace | None = None,  # the NumPy sampler's; unused here
    ) -> np.ndarray:
        if logits.ndim < 2 or logits.dtype != np.float32:
            raise TypeError(f"logits must be float32 with 2 or more axes, got {logits.dtype} {logits.shape}")
        v = logits.shape[-1]
        if v == 0:
            raise ValueError("logits have no columns")
        if logits.strides[-1] != 4 or any(s % 4 for s in logits.strides):
            raise ValueError(f"logits' last axis must be contiguous float32, got strides {logits.strides}")
        lead = logits.shape[:-1]
        n_all = int(np.prod(lead))
        if rows is None:
            layout = (logits.shape, logits.strides)
            if self._whole[0] != layout:
                self._whole = (layout, self._offsets(logits, np.arange(n_all, dtype=np.int64)))
            offsets = self._whole[1]
        else:
            sel = np.asarray(rows, dtype=np.int64)
            if sel.ndim != 1:
                raise ValueError(f"rows must be 1-D, got shape {sel.shape}")
            if sel.size and (int(sel.min()) < 0 or int(sel.max()) >= n_all):
                raise IndexError(f"rows must be in [0, {n_all}), got {int(sel.min())}..{int(sel.max())}")
            offsets = self._offsets(logits, sel)
        n = offsets.size
        if out is None:
            out = np.empty(n, dtype=np.int64)
        elif out.shape != (n,) or out.dtype != np.int64 or not out.flags.c_contiguous:
            raise ValueError(f"out must be contiguous int64 ({n},), got {out.dtype} {out.shape}")
        if n == 0:
            return out
        temp = _per_row(temperature, np.float32, n, "temperature")
        tk = _per_row(top_k, np.int64, n, "top_k")
        tp = _per_row(top_p, np.float64, n, "top_p")
        uu = _per_row(u, np.float64, n, "u")
        pen: np.ndarray | None = None
        seen_b: np.ndarray | None = None
        if penalty is not None:
            if seen is None:
                raise ValueError("penalty needs seen")
            pen = _per_row(penalty, np.float32, n, "penalty")
            seen_b = np.ascontiguousarray(seen, dtype=np.bool_)
            if seen_b.shape != (n, v):
                raise ValueError(f"shape mismatch: {n} rows of {v} logits, seen {seen_b.shape}")
        scratch = None
        if int(tk.max()) > _SMALL_K or int(tk.min()) <= 0:  # top-k off or large: sorted scratch
            if self._scratch.size < 16 * v:
                self._scratch = np.zeros(16 * v, dtype=np.uint8)
            scratch = self._scratch
        if self._bad.size < n:
            self._bad = np.zeros(n, dtype=np.uint8)
        bad = self._bad[:n]
        rc = self._fn(
            _ptr(logits), _ptr(offsets), n, v, _ptr(temp), _ptr(tk), _ptr(tp), _ptr(uu),
            _ptr(seen_b), _ptr(pen), _ptr(scratch), _ptr(out), _ptr(bad),
        )  # fmt: skip
        if rc < 0:  # cannot happen: scratch is passed whenever a row needs it
            raise RuntimeError("stt_sample_rows: a row needed scratch space")
        if rc:
            raise NonFiniteLogitsError(np.flatnonzero(bad))
        return out

    @staticmethod
    def _offsets(logits: np.ndarray, sel: np.ndarray) -> np.ndarray:
        """Element offset of each selected row from ``logits``' first element."""
        lead = logits.shape[:-1]
        strides = [s // 4 for s in logits.strides[:-1]]
        if len(lead) == 1:
            return sel * strides[0]
        off = np.zeros(sel.size, dtype=np.int64)
        rest = sel
        for size, stride in zip(reversed(lead), reversed(strides), strict=True):
            rest, idx = np.divmod(rest, size)
            off += idx * stride
        return off


def _per_row(a: Any, dtype: type[np.generic], n: int, name: str) -> np.ndarray:
    arr: np.ndarray = np.ascontiguousarray(a, dtype=dtype)
    if arr.shape != (n,):
        raise ValueError(f"{name} must have one value per sampled row ({n}), got shape {arr.shape}")
    return arr
