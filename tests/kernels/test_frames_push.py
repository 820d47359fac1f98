"""The compiled push (native/frames.c through streamtts.kernels.frame_push) against FrameAssembler.push."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_frames import PAD, row_streams

from streamtts.core.delay import de_delay, drop_pad_frames
from streamtts.core.frames import FrameAssembler
from streamtts.kernels.frame_push import BoundFramePush


@given(st.lists(row_streams(4), min_size=1, max_size=6), st.integers(0, 2**32 - 1))
@settings(max_examples=80, deadline=None)
def test_same_frames_and_rings_as_the_numpy_push(bridge_lib: Any, streams: list[np.ndarray], seed: int) -> None:
    rng = np.random.default_rng(seed)
    k, cap = 4, 8
    py, cc = FrameAssembler(cap, k, PAD), FrameAssembler(cap, k, PAD)
    slot_buf = np.zeros(cap, np.int64)
    # the engine's rows: codes after a text column, rows of a wider buffer
    out_buf = np.full((cap, 1 + k), -7, np.int64)
    push = BoundFramePush(cc, slot_buf, out_buf[:, 1:])
    slot_of = rng.permutation(cap)[: len(streams)]
    for s in slot_of:
        py.reset(int(s))
        cc.reset(int(s))
    pos = [0] * len(streams)
    got: list[list[np.ndarray]] = [[] for _ in streams]
    while any(pos[i] < len(s) for i, s in enumerate(streams)):
        live = [i for i, s in enumerate(streams) if pos[i] < len(s)]
        batch = [int(i) for i in rng.permutation(live)[: int(rng.integers(1, len(live) + 1))]]
        b = len(batch)
        slots = np.array([slot_of[i] for i in batch], np.int64)
        rows = np.stack([streams[i][pos[i]] for i in batch])
        frames, ready, index = py.push(slots, rows)
        slot_buf[:b] = slots
        out_buf[:b, 1:] = rows
        n_ready = push(b)
        np.testing.assert_array_equal(push.frames[:b], frames)
        np.testing.assert_array_equal(push.ready[:b], ready)
        np.testing.assert_array_equal(push.index[:b], index)
        assert n_ready == int(ready.sum())
        np.testing.assert_array_equal(cc.ring, py.ring)
        np.testing.assert_array_equal(cc.count, py.count)
        for j, i in enumerate(batch):
            pos[i] += 1
            if push.ready[j]:
                got[i].append(push.frames[j].copy())
    for i, s in enumerate(streams):  # and so, streaming equals offline
        np.testing.assert_array_equal(np.array(got[i], np.int64).reshape(-1, k), drop_pad_frames(de_delay(s), PAD))


def test_real_width_and_bad_input(bridge_lib: Any) -> None:
    k, cap = 32, 3
    asm = FrameAssembler(cap, k, PAD)
    slot_buf = np.zeros(cap, np.int64)
    rows = np.zeros((cap, k), np.int64)
    push = BoundFramePush(asm, slot_buf, rows)
    codes = np.arange(k * 2).reshape(2, k) % PAD
    for n in range(k + 1):  # a delay-laid utterance of 2 frames in slot 2
        slot_buf[0] = 2
        rows[0] = [codes[n - j, j] if 0 <= n - j < 2 else PAD for j in range(k)]
        assert push(1) == (1 if n >= k - 1 else 0)
        assert push.index[0] == (n - k + 1 if n >= k - 1 else -1)
    np.testing.assert_array_equal(push.frames[0], codes[1])
    before = (asm.ring.copy(), asm.count.copy())
    slot_buf[:2] = [0, 3]
    with pytest.raises(ValueError, match=r"slots must be in \[0, 3\), got \[0, 3\]"):
        push(2)
    np.testing.assert_array_equal(asm.ring, before[0])  # nothing changed
    np.testing.assert_array_equal(asm.count, before[1])
    with pytest.raises(ValueError, match="4 streams do not fit the 3 rows bound"):
        push(4)
    with pytest.raises(ValueError, match="rows must be int64"):
        BoundFramePush(asm, slot_buf, rows[:, ::2])
    with pytest.raises(ValueError, match="slots must be a contiguous 1-D int64 array"):
        BoundFramePush(asm, slot_buf.astype(np.int32), rows)
