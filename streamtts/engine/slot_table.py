"""The engine's slot table: one row per stream slot (= llama.cpp sequence id).

What the hot path reads for every running stream at once lives in NumPy columns
(``kv_pos[run]``, ``steps[run]``, the frames waiting for the decode thread in
``pend[slot, :pend_n[slot]]``, ...); what only the rare paths touch (the request,
its prefill progress, backpressure) lives in a :class:`Stream` object. ``reset``
fills a whole row for a new stream and ``release`` empties it, so no column is ever
left holding a previous stream's value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..constants import FRAME_S, SAMPLE_RATE
from ..request import PreparedRequest


@dataclass(eq=False)
class Stream:
    """One admitted request, as the engine thread sees it."""

    req: PreparedRequest
    fed: int = 0  # prompt rows already in the KV cache
    running: bool = False  # prefill done, stepping
    paused: bool = False  # backpressure
    # continuation: the frames its audio prefix completes, warm-up that leads its first chunk
    # (kept here, not in SlotTable.pend: a prefix may be long, and only one chunk needs them)
    lead: np.ndarray | None = None
    rows: list[np.ndarray] = field(default_factory=list)  # keep_rows: generated rows not yet sent
    order: int = 0  # streams admitted before it (chunk_policy.py: a session's segments in order)


class SlotTable:
    """Per-slot state of ``capacity`` stream slots; ``pend_frames`` frames of ``n_vq``
    codes can wait per slot (``add_pending`` makes room for more rather than drop one)."""

    def __init__(self, capacity: int, n_vq: int = 0, pend_frames: int = 1) -> None:
        self.capacity = capacity
        self.streams: list[Stream | None] = [None] * capacity
        self._active = 0
        self.kv_pos = np.zeros(capacity, dtype=np.int32)  # next KV position of the sequence
        self.steps = np.zeros(capacity, dtype=np.int64)  # generation steps taken
        self.step_s = np.zeros(capacity, dtype=np.float64)  # wall time of the ticks it stepped in
        self.max_new = np.zeros(capacity, dtype=np.int64)  # step limit
        self.fixed = np.full(capacity, -1, dtype=np.int64)  # benchmarks: forced length, -1 = off
        self.n_fixed = 0  # slots with a forced length (the step skips them all when none)
        # when a real-time listener of the slot would run dry (-inf before its first audio)
        self.audio_due = np.full(capacity, -np.inf, dtype=np.float64)
        self.keep_rows = np.zeros(capacity, dtype=bool)  # the stream wants its raw rows
        self.n_keep_rows = 0
        # complete frames not yet sent: pend[slot, :pend_n[slot]], the first `warm` of them a
        # continuation's prefix frames the first steps complete (they warm the codec; their
        # samples are not sent); frames completed before generation are in Stream.lead
        self.pend = np.zeros((capacity, max(pend_frames, 1), n_vq), dtype=np.int64)
        self.pend_n = np.zeros(capacity, dtype=np.int64)
        self.warm = np.zeros(capacity, dtype=np.int64)
        self.pending_first = np.zeros(capacity, dtype=np.int64)  # frame index of the first new one
        self.prefix_frames = np.zeros(capacity, dtype=np.int64)  # continuation: the prefix's frames
        self.frames_sent = np.zeros(capacity, dtype=np.int64)  # frames handed to the decode thread
        self.chunk_index = np.zeros(capacity, dtype=np.int64)  # chunks sent so far (picks the size)
        # each stream's chunk sizes: chunks[slot, i] frames for its chunk i, the last column
        # repeating (streams may differ: a client's playback buffer, a benchmark's policy)
        self.chunks = np.ones((capacity, 1), dtype=np.int64)
        self.t_first_emit = np.zeros(capacity, dtype=np.float64)
        # frames_sent when backpressure last looked at the slot (-1: not yet): see Scheduler
        self.bp_seen = np.full(capacity, -1, dtype=np.int64)

    def free_slot(self) -> int | None:
        for i, s in enumerate(self.streams):
            if s is None:
                return i
        return None

    @property
    def active(self) -> int:
        """Slots holding a stream (a count kept by reset and release: the loop asks every tick)."""
        return self._active

    def find(self, rid: int) -> int | None:
        for i, s in enumerate(self.streams):
            if s is not None and s.req.rid == rid:
                return i
        return None

    def buffered_s(self, slot: int) -> float:
        """Audio handed to the decode thread and not yet taken by the consumer.

        Counting from what was *sent* (not what the decode thread has delivered) keeps
        backpressure exact when the codec lags: frames in flight are buffered audio too.
        """
        s = self.streams[slot]
        assert s is not None
        sent = int(self.frames_sent[slot]) * FRAME_S
        return sent - float(s.req.sink.consumed_samples) / SAMPLE_RATE

    def grow_pending(self, frames: int) -> None:
        """Room for ``frames`` pending frames per slot."""
        cap, have, n_vq = self.pend.shape
        if frames <= have:
            return
        pend = np.zeros((cap, max(frames, 2 * have), n_vq), dtype=np.int64)
        pend[:, :have] = self.pend
        self.pend = pend

    def add_pending(self, slots: np.ndarray, frames: np.ndarray, index: np.ndarray) -> None:
        """Append frame ``index[i]`` (``frames[i]``) to the pending frames of ``slots[i]``
        (distinct slots), all at once; a continuation's prefix frames count as warm-up."""
        n = self.pend_n[slots]
        if n.size and int(n.max()) >= self.pend.shape[1]:
            # not expected (a chunk goes out at its target, behind < n_vq warm-up frames here)
            self.grow_pending(int(n.max()) + 1)
        self.pend[slots, n] = frames
        f = index - self.prefix_frames[slots]  # a continuation's new frames count from 0
        warm = self.warm[slots]
        new = f >= 0
        first = new & (n == warm)  # the first new frame of the next chunk
        self.pending_first[slots[first]] = f[first]
        self.warm[slots] = warm + ~new
        self.pend_n[slots] = n + 1

    def take_pending(self, slot: int) -> np.ndarray:
        """The slot's pending frames, as an array of their own (the buffer is reused); the
        slot then has none."""
        n = int(self.pend_n[slot])
        codes = self.pend[slot, :n].copy()
        self.pend_n[slot] = self.warm[slot] = 0
        return codes

    def set_chunks(self, slot: int, sizes: Sequence[int]) -> None:
        """``slot``'s chunk sizes (the last repeating); the columns grow for a longer list."""
        n, have = len(sizes), self.chunks.shape[1]
        if n > have:  # every other row repeats its last size into the new columns
            self.chunks = np.concatenate([self.chunks, np.repeat(self.chunks[:, -1:], n - have, axis=1)], axis=1)
        self.chunks[slot, :n] = sizes
        self.chunks[slot, n:] = sizes[-1]

    def reset(self, slot: int, req: PreparedRequest, chunks: Sequence[int] = (1,)) -> Stream:
        """Give ``slot`` to ``req``, its chunks of ``chunks`` frames: every column starts fresh."""
        self._active += self.streams[slot] is None
        s = self.streams[slot] = Stream(req)
        self._clear(slot)
        self.set_chunks(slot, chunks)
        self.max_new[slot] = req.max_new_tokens
        self.fixed[slot] = -1 if req.fixed_frames is None else req.fixed_frames
        self.n_fixed += req.fixed_frames is not None
        self.n_keep_rows += int(req.keep_rows)
        self.keep_rows[slot] = req.keep_rows
        return s

    def release(self, slot: int) -> Stream | None:
        """Empty ``slot``; returns the stream that held it (None if it was free)."""
        s = self.streams[slot]
        self._active -= s is not None
        self.streams[slot] = None
        self._clear(slot)
        return s

    def _clear(self, slot: int) -> None:
        """Every column of ``slot`` as for a free slot (the counts of the flags kept right)."""
        self.kv_pos[slot] = 0
        self.steps[slot] = 0
        self.step_s[slot] = 0.0
        self.max_new[slot] = 0
        if self.fixed[slot] >= 0:
            self.n_fixed -= 1
        self.fixed[slot] = -1
        self.audio_due[slot] = -np.inf
        self.n_keep_rows -= int(self.keep_rows[slot])
        self.keep_rows[slot] = False
        self.pend[slot] = 0
        self.pend_n[slot] = 0
        self.warm[slot] = 0
        self.pending_first[slot] = 0
        self.prefix_frames[slot] = 0
        self.frames_sent[slot] = 0
        self.chunk_index[slot] = 0
        self.chunks[slot] = 1
        self.t_first_emit[slot] = 0.0
        self.bp_seen[slot] = -1
