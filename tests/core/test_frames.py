"""FrameAssembler: streaming de-delay equals the offline one."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtts.core.delay import de_delay, delay_layout, drop_pad_frames
from streamtts.core.frames import FrameAssembler

PAD = 1024


@st.composite
def row_streams(draw: st.DrawFn, k: int) -> np.ndarray:
    """Rows like a generation: pad stretches, delay-laid utterances, random rows."""
    parts = []
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["pad", "utt", "random"]))
        if kind == "pad":
            parts.append(np.full((draw(st.integers(1, 5)), k), PAD, np.int64))
        elif kind == "utt":
            t = draw(st.integers(1, 6))
            seed = draw(st.integers(0, 2**32 - 1))
            codes = np.random.default_rng(seed).integers(0, PAD, size=(t, k))
            parts.append(delay_layout(codes, PAD))
        else:
            seed = draw(st.integers(0, 2**32 - 1))
            rng = np.random.default_rng(seed)
            r = rng.integers(0, PAD, size=(draw(st.integers(1, 6)), k))
            r[rng.random(r.shape) < 0.5] = PAD
            parts.append(r)
    return np.concatenate(parts) if parts else np.empty((0, k), np.int64)


def _push_all(asm: FrameAssembler, slot: int, rows: np.ndarray) -> tuple[np.ndarray, list[int]]:
    got, idx = [], []
    for row in rows:
        frames, ready, index = asm.push(np.array([slot]), row[None, :])
        if ready[0]:
            got.append(frames[0].copy())
            idx.append(int(index[0]))
    k = rows.shape[1]
    return (np.array(got, np.int64) if got else np.empty((0, k), np.int64)), idx


@given(st.integers(1, 6).flatmap(lambda k: row_streams(k)))
@settings(max_examples=150)
def test_one_row_at_a_time_equals_offline(rows: np.ndarray) -> None:
    k = rows.shape[1]
    asm = FrameAssembler(3, k, PAD)
    got, idx = _push_all(asm, 1, rows)
    offline = de_delay(rows)
    np.testing.assert_array_equal(got, drop_pad_frames(offline, PAD))
    keep = np.flatnonzero(~np.all(offline == PAD, axis=1)) if offline.size else np.empty(0, int)
    assert idx == keep.tolist()


@given(st.lists(row_streams(4), min_size=1, max_size=5), st.randoms(use_true_random=False))
@settings(max_examples=60)
def test_interleaved_slots_in_random_batches(streams: list[np.ndarray], rnd: object) -> None:
    import random

    assert isinstance(rnd, random.Random)
    k = 4
    asm = FrameAssembler(8, k, PAD)
    slot_of = list(range(8))
    rnd.shuffle(slot_of)
    pos = [0] * len(streams)
    got: list[list[np.ndarray]] = [[] for _ in streams]
    for i in range(len(streams)):
        asm.reset(slot_of[i])
    while any(pos[i] < len(s) for i, s in enumerate(streams)):
        live = [i for i, s in enumerate(streams) if pos[i] < len(s)]
        batch = rnd.sample(live, rnd.randint(1, len(live)))
        slots = np.array([slot_of[i] for i in batch])
        rows = np.stack([streams[i][pos[i]] for i in batch])
        out = np.empty((len(batch), k), np.int64)
        frames, ready, _ = asm.push(slots, rows, frames_out=out)
        assert frames is out
        for j, i in enumerate(batch):
            pos[i] += 1
            if ready[j]:
                got[i].append(frames[j].copy())
    for i, s in enumerate(streams):
        want = drop_pad_frames(de_delay(s), PAD)
        have = np.array(got[i], np.int64).reshape(-1, k)
        np.testing.assert_array_equal(have, want)


def test_frame_f_released_after_row_f_plus_k() -> None:
    k = 32
    rng = np.random.default_rng(1)
    codes = rng.integers(0, PAD, size=(5, k))
    rows = delay_layout(codes, PAD)
    asm = FrameAssembler(2, k, PAD)
    for n, row in enumerate(rows, start=1):
        frames, ready, index = asm.push(np.array([0]), row[None, :])
        if n < k:
            assert not ready[0] and index[0] == -1
        else:
            assert ready[0] and index[0] == n - k
            np.testing.assert_array_equal(frames[0], codes[n - k])
    assert asm.rows_pushed(0) == len(rows)


def test_reset_starts_a_new_stream() -> None:
    k = 3
    asm = FrameAssembler(1, k, PAD)
    for _ in range(5):
        asm.push(np.array([0]), np.array([[1, 2, 3]]))
    asm.reset(0)
    assert asm.rows_pushed(0) == 0
    codes = np.array([[7, 8, 9]])
    got, _ = _push_all(asm, 0, delay_layout(codes, PAD))
    np.testing.assert_array_equal(got, codes)
