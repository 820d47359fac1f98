"""Incremental de-delay: turn each stream's generated rows into audio frames.

Codebook k of frame f arrives in row f + k, so frame f is complete once a
stream has pushed f + K rows; after the first K - 1 rows every row completes
exactly one frame. :class:`FrameAssembler` keeps, per stream slot, a ring of
the last K audio rows (struct of arrays over slots) and releases the frame
completed by each push, so audio can be decoded 80 ms at a time instead of
after the whole utterance. Frames that are all pad (rows outside an
utterance, e.g. after ``<|audio_end|>``) are flagged not ready, which makes
the stream of ready frames equal to ``drop_pad_frames(de_delay(rows))``.
"""

from __future__ import annotations

import numpy as np

from .delay import de_delay


class FrameAssembler:
    """De-delays rows pushed per slot; vectorised over slots and codebooks."""

    def __init__(self, capacity: int, n_vq: int, pad: int) -> None:
        if capacity < 1 or n_vq < 1:
            raise ValueError(f"capacity and n_vq must be >= 1, got {capacity}, {n_vq}")
        self.capacity = capacity
        self.n_vq = n_vq
        self.pad = pad
        # public for the compiled push (model/frames_push.py), which works on these arrays
        self.ring = np.full((capacity, n_vq, n_vq), pad, dtype=np.int64)  # each slot's last K rows
        self.count = np.zeros(capacity, dtype=np.int64)  # rows pushed per slot
        self._k = np.arange(n_vq, dtype=np.int64)

    def reset(self, slot: int) -> None:
        """Forget the slot's rows; its next push is row 0 of a new stream."""
        self.count[slot] = 0
        self.ring[slot] = self.pad

    def seed(self, slot: int, audio_rows: np.ndarray) -> np.ndarray:
        """Start the slot from ``audio_rows`` (T, K) already in its sequence (a continuation's
        audio prefix, in the delay layout) as if they had been pushed; returns the frames
        those rows complete (frames 0 .. T - K, fewer when T < K). The next push is row T:
        it completes frame T - K + 1, whose upper codebooks the prefix left open."""
        t, k_n = audio_rows.shape
        if k_n != self.n_vq:
            raise ValueError(f"audio_rows must have {self.n_vq} codebooks, got {k_n}")
        self.reset(slot)
        last = np.arange(max(0, t - k_n), t)
        self.ring[slot, last % k_n, :] = audio_rows[last]
        self.count[slot] = t
        return de_delay(audio_rows)

    def rows_pushed(self, slot: int) -> int:
        return int(self.count[slot])

    def push(
        self,
        slots: np.ndarray,
        audio_rows: np.ndarray,
        frames_out: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Append one audio row (K codes) to each slot in ``slots`` (distinct).

        Returns ``(frames (B, K) int64, ready (B,) bool, index (B,) int64)``:
        ``frames[b]`` is the frame the push completed (frame ``index[b]``,
        i.e. the slot's (index + K)-th row was just pushed); ``ready[b]`` is
        True when such a frame exists and is not all pad. ``index`` is -1 while
        no frame is complete yet. ``frames_out`` may be passed to reuse a buffer.
        """
        s = np.asarray(slots, dtype=np.intp)
        k_n = self.n_vq
        b_n = s.shape[0]
        if audio_rows.shape != (b_n, k_n):
            raise ValueError(f"audio_rows must be ({b_n}, {k_n}), got {audio_rows.shape}")
        row_no = self.count[s]
        pos = row_no % k_n
        self.ring[s, pos, :] = audio_rows
        n = row_no + 1
        self.count[s] = n
        f = n - k_n
        complete = f >= 0
        # Frame f takes channel k from row f + k, stored at ring position (f + k) % K.
        ring_pos = (f[:, None] + self._k[None, :]) % k_n
        if frames_out is None:
            frames_out = np.empty((b_n, k_n), dtype=np.int64)
        frames_out[...] = self.ring[s[:, None], ring_pos, self._k[None, :]]
        frames_out[~complete] = self.pad
        ready = complete & np.any(frames_out != self.pad, axis=1)
        index = np.where(complete, f, -1)
        return frames_out, ready, index
