"""Delay layout / de-delay (contract section 5)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from streamtts.core.delay import de_delay, delay_layout, drop_pad_frames
from streamtts.errors import InputError

PAD = 1024


def _naive_layout(codes: np.ndarray, pad: int) -> np.ndarray:
    t, k = codes.shape
    out = np.full((t + k - 1, k), pad, dtype=codes.dtype)
    for r in range(t + k - 1):
        for c in range(k):
            if 0 <= r - c < t:
                out[r, c] = codes[r - c, c]
    return out


@st.composite
def code_matrices(draw: st.DrawFn) -> np.ndarray:
    t = draw(st.integers(0, 12))
    k = draw(st.integers(1, 8))
    return draw(arrays(np.int64, (t, k), elements=st.integers(0, PAD - 1)))


@given(code_matrices())
def test_layout_matches_definition_and_round_trips(codes: np.ndarray) -> None:
    t, k = codes.shape
    laid = delay_layout(codes, PAD)
    assert laid.shape == (t + k - 1, k)
    assert laid.dtype == codes.dtype
    np.testing.assert_array_equal(laid, _naive_layout(codes, PAD))
    np.testing.assert_array_equal(de_delay(laid), codes if t else np.empty((0, k), np.int64))


@given(arrays(np.int64, st.tuples(st.integers(0, 15), st.integers(1, 8))))
@settings(max_examples=30)
def test_de_delay_takes_channel_k_from_row_f_plus_k(rows: np.ndarray) -> None:
    n, k = rows.shape
    frames = de_delay(rows)
    assert frames.shape == (max(n - k + 1, 0), k)
    for f in range(frames.shape[0]):
        for c in range(k):
            assert frames[f, c] == rows[f + c, c]


def test_de_delay_short_input_is_empty() -> None:
    rows = np.zeros((31, 32), dtype=np.int64)
    out = de_delay(rows)
    assert out.shape == (0, 32)
    assert de_delay(np.zeros((32, 32), np.int64)).shape == (1, 32)


def test_drop_pad_frames_drops_only_all_pad() -> None:
    frames = np.array([[PAD, PAD], [1, PAD], [PAD, PAD], [3, 4]], dtype=np.int64)
    np.testing.assert_array_equal(drop_pad_frames(frames, PAD), [[1, PAD], [3, 4]])
    assert drop_pad_frames(np.empty((0, 2), np.int64), PAD).shape == (0, 2)


def test_full_utterance_pipeline_real_shape() -> None:
    rng = np.random.default_rng(0)
    codes = rng.integers(0, PAD, size=(50, 32))
    rows = np.concatenate([np.full((3, 32), PAD), delay_layout(codes, PAD), np.full((4, 32), PAD)])
    np.testing.assert_array_equal(drop_pad_frames(de_delay(rows), PAD), codes)


def test_bad_shapes() -> None:
    with pytest.raises(InputError):
        delay_layout(np.zeros(5, np.int64), PAD)
    with pytest.raises(InputError):
        de_delay(np.zeros((2, 3, 4), np.int64))
