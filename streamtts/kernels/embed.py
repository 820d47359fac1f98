"""The step's input rows compiled (``native/embed.c``): ``Embedder.__call__`` on buffers bound once.

:class:`~streamtts.model.tables.Embedder` stays the specification: the text row then the
32 codebook rows added one after another in float32, which ``embed.c`` does in the same
order (same bits; ``tests/kernels/test_conformance.py``). Why: after a decode each NumPy call
runs on cold caches, and the five calls of a step's embedding cost about 0.1 ms there.
"""

from __future__ import annotations

import ctypes

import numpy as np

from ..model._llama import SttEmbed, ptr
from ..model.tables import Embedder
from .entries import Unreadable, check_range
from .tick_pool import TickPool


class StepEmbedTwin:
    """Writes the embedding of ``rows[slots[b]]`` to ``out[b]`` for b in ``[lo, hi)``. With a
    ``pool``, the engine's call (``lo`` = 0) is cut into chunks run on the pool's threads."""

    compiled = True

    def __init__(
        self, lib: ctypes.CDLL, embedder: Embedder, slots: np.ndarray, rows: np.ndarray, out: np.ndarray,
        pool: TickPool | None = None,
    ) -> None:  # fmt: skip
        text, audio = embedder.text, embedder.audio
        h, k = embedder.n_embd, embedder.n_vq
        if text.dtype not in (np.float16, np.float32) or not text.flags.c_contiguous:
            raise Unreadable(f"the text table must be contiguous float16 or float32, got {text.dtype}")
        if audio.dtype != np.float32 or not audio.flags.c_contiguous:  # a change in Embedder
            raise TypeError(f"Embedder.audio must be contiguous float32, got {audio.dtype}")
        if slots.dtype != np.int64 or slots.ndim != 1 or not slots.flags.c_contiguous:
            raise Unreadable(f"slots must be a contiguous 1-D int64 array, got {slots.dtype} {slots.shape}")
        if rows.dtype != np.int64 or rows.ndim != 2 or rows.shape[1] != 1 + k or rows.strides[1] != 8:
            raise Unreadable(f"rows must be int64 (N, {1 + k}) with contiguous ids, got {rows.dtype} {rows.shape}")
        if out.dtype != np.float32 or out.ndim != 2 or out.shape[1] != h or out.strides[1] != 4:
            raise Unreadable(f"out must be float32 (N, {h}) with contiguous rows, got {out.dtype} {out.shape}")
        self._keep = (text, audio, slots, rows, out)  # what the addresses point into
        self._struct = SttEmbed(
            n_embd=h, text_rows=text.shape[0], n_vq=k, audio_rows=embedder.rows,
            text_f16=int(text.dtype == np.float16), text=ptr(text), audio=ptr(audio),
        )  # fmt: skip
        self._ref = ctypes.byref(self._struct)
        self._fn = lib.stt_embed_rows
        self._pooled = lib.stt_pool_embed_rows
        self._pool = pool
        self._n_max = min(slots.shape[0], out.shape[0])
        self._codes = TickPool.chunk_codes(self._n_max)
        self._codes_p = ptr(self._codes)
        self._n_rows = rows.shape[0]
        self._slots = slots
        self._rows = rows
        self._rows_p, self._row_stride = int(ptr(rows) or 0), rows.strides[0] // 8
        self._out_stride = out.strides[0] // 4
        # each buffer's address and the bytes from one row to the next
        self._at0 = (int(ptr(slots) or 0), int(ptr(out) or 0))
        self._row_bytes = (slots.strides[0], out.strides[0])

    def __call__(self, lo: int, hi: int) -> None:
        if not 0 <= lo <= hi <= self._n_max:
            check_range(lo, hi, self._n_max)
        s, o = self._at0  # the engine's call (lo = 0): the addresses as bound
        pool = self._pool
        chunk = pool.chunk_rows(hi) if pool is not None and not lo else 0
        if chunk:
            assert pool is not None
            pool.parallel_runs += 1
            failed = self._pooled(
                pool.handle, chunk, self._codes_p, self._ref, s, hi, self._rows_p, self._n_rows, self._row_stride, o, self._out_stride
            )
            if failed < 0:  # cannot happen: chunk >= 1
                raise RuntimeError(f"stt_pool_embed_rows returned {failed}")
            if failed:
                codes = self._codes[: -(-hi // chunk)]
                self._check(int(codes[codes != 0][0]), lo, hi)
            return
        if lo:
            s, o = s + lo * self._row_bytes[0], o + lo * self._row_bytes[1]
        self._check(self._fn(self._ref, s, hi - lo, self._rows_p, self._n_rows, self._row_stride, o, self._out_stride), lo, hi)

    def _check(self, rc: int, lo: int, hi: int) -> None:
        if rc == -1:
            raise ValueError(f"slots must be in [0, {self._n_rows}), got {self._slots[lo:hi].tolist()}")
        if rc < 0:
            raise ValueError(f"an id out of range in rows {self._rows[self._slots[lo:hi]].tolist()}")
