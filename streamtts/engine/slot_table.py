"""The engine's slot table: one row per stream slot (= llama.cpp sequence id).

What the hot path reads for every running stream at once lives in NumPy columns
(``kv_pos[run]``, ``steps[run]``, ...); what only the rare paths touch (the
request, its prefill progress, frames waiting for the decode thread) lives in a
:class:`Stream` object. ``reset`` fills a whole row for a new stream and
``release`` empties it, so no column is ever left holding a previous stream's value.
"""

from __future__ import annotations

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
    frames_sent: int = 0  # frames handed to the decode thread
    pending: list[np.ndarray] = field(default_factory=list)  # complete frames not yet sent
    pending_first: int = 0  # frame index of pending[0]
    chunk_index: int = 0  # chunks sent so far (picks the chunk size)
    t_first_emit: float = 0.0
    # continuation: the leading pending frames that are the audio prefix's (they warm the
    # codec; their samples are not sent), and how many frames the prefix has
    warm: int = 0
    prefix_frames: int = 0
    rows: list[np.ndarray] = field(default_factory=list)  # keep_rows: generated rows not yet sent

    def buffered_s(self) -> float:
        """Audio handed to the decode thread and not yet taken by the consumer.

        Counting from what was *sent* (not what the decode thread has delivered) keeps
        backpressure exact when the codec lags: frames in flight are buffered audio too.
        """
        return self.frames_sent * FRAME_S - float(self.req.sink.consumed_samples) / SAMPLE_RATE


class SlotTable:
    """Per-slot state of ``capacity`` stream slots."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.streams: list[Stream | None] = [None] * capacity
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

    def free_slot(self) -> int | None:
        for i, s in enumerate(self.streams):
            if s is None:
                return i
        return None

    @property
    def active(self) -> int:
        return sum(s is not None for s in self.streams)

    def find(self, rid: int) -> int | None:
        for i, s in enumerate(self.streams):
            if s is not None and s.req.rid == rid:
                return i
        return None

    def reset(self, slot: int, req: PreparedRequest) -> Stream:
        """Give ``slot`` to ``req``: every column starts fresh."""
        s = self.streams[slot] = Stream(req)
        self.kv_pos[slot] = 0
        self.steps[slot] = 0
        self.step_s[slot] = 0.0
        self.max_new[slot] = req.max_new_tokens
        if self.fixed[slot] >= 0:  # a slot given again without a release
            self.n_fixed -= 1
        self.fixed[slot] = -1 if req.fixed_frames is None else req.fixed_frames
        self.n_fixed += req.fixed_frames is not None
        self.audio_due[slot] = -np.inf
        self.n_keep_rows += int(req.keep_rows) - int(self.keep_rows[slot])
        self.keep_rows[slot] = req.keep_rows
        return s

    def release(self, slot: int) -> Stream | None:
        """Empty ``slot``; returns the stream that held it (None if it was free)."""
        s = self.streams[slot]
        self.streams[slot] = None
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
        return s
