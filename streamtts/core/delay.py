"""Delay layout and de-delay of audio code matrices (contract section 5).

The model emits codebook k of audio frame f at step f + k, so a (T, K) code
matrix occupies T + K - 1 rows of the multi-channel sequence. These helpers
convert between the two layouts offline (whole matrices at once): the prompt
builder lays reference codes out with :func:`delay_layout`, and tests/tools
recover frames with :func:`de_delay`. The streaming counterpart is
:class:`streamtts.core.frames.FrameAssembler`.

Everything is one fancy-indexing operation; there is no Python loop over
codebooks.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError


def _check_2d(a: np.ndarray, name: str) -> None:
    if a.ndim != 2:
        raise InputError(f"{name} must be a 2-D (rows, codebooks) array, got shape {a.shape}")


def delay_layout(codes: np.ndarray, pad: int) -> np.ndarray:
    """Lay a (T, K) code matrix out in delay order: (T + K - 1, K).

    Row r, channel k holds ``codes[r - k, k]`` when ``0 <= r - k < T``, else ``pad``.
    The dtype of ``codes`` is kept.
    """
    _check_2d(codes, "codes")
    t, k = codes.shape
    if k == 0:
        raise InputError("codes must have at least one codebook")
    out = np.full((t + k - 1, k), pad, dtype=codes.dtype)
    rows = np.arange(t)[:, None] + np.arange(k)[None, :]
    out[rows, np.arange(k)[None, :]] = codes
    return out


def de_delay(rows: np.ndarray) -> np.ndarray:
    """Undo the delay layout: (N, K) rows -> (N - K + 1, K) frames.

    Frame f takes channel k from row f + k. Returns an empty (0, K) array when
    fewer than K rows are given (no frame is complete yet).
    """
    _check_2d(rows, "rows")
    n, k = rows.shape
    t = n - k + 1
    if t <= 0:
        return np.empty((0, k), dtype=rows.dtype)
    idx = np.arange(t)[:, None] + np.arange(k)[None, :]
    result: np.ndarray = rows[idx, np.arange(k)[None, :]]
    return result


def drop_pad_frames(frames: np.ndarray, pad: int) -> np.ndarray:
    """Drop frames whose codes are all ``pad`` (rows outside any utterance)."""
    _check_2d(frames, "frames")
    keep = ~np.all(frames == pad, axis=1)
    result: np.ndarray = frames[keep]
    return result
