"""Syllable nuclei in the audio so far: peaks of a smoothed band-limited energy envelope.

A syllable's vowel is its loudest part in the band where vowels carry their energy (300 to
2500 Hz: the first two formants), and the consonants between vowels dip there, so counting
the envelope's peaks counts the syllables heard, whatever the speaking rate. The aligner
(estimate.py) uses the count to place words: a word spans about as many peaks as it has
syllables (``Word.syllables``). Pure NumPy; the envelope grows by hops as audio comes.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["BandEnvelope", "peak_hops"]

BAND_HZ = (300.0, 2500.0)
SMOOTH_HOPS = 5  # 50 ms moving average: one peak per vowel, not per pitch period
SPACING_HOPS = 6  # a peak is the loudest within +-60 ms (syllables are longer than 120 ms)
PROMINENCE_DB = 3.0  # ... and stands this far above the dip on each side
REACH_HOPS = 15  # ... the dip looked for within 150 ms
VOICED_DB = 25.0  # ... and is at most this far under the loud hops' level (95th percentile)


class BandEnvelope:
    """Band energy (dB) per hop, each hop's window the hop and the one before it (Hann)."""

    def __init__(self, sample_rate: int, hop: int) -> None:
        self.hop = hop
        self._window = np.hanning(2 * hop)
        f = np.fft.rfftfreq(2 * hop, 1.0 / sample_rate)
        self._band = (f >= BAND_HZ[0]) & (f <= BAND_HZ[1])
        self._prev = np.zeros(hop, np.float64)
        self.db = np.zeros(0, np.float64)

    def push(self, frames: npt.NDArray[np.float64]) -> None:
        """Add whole hops (``(n, hop)``)."""
        n = frames.shape[0]
        if n == 0:
            return
        flat = np.concatenate([self._prev, frames.reshape(-1)])
        win = np.lib.stride_tricks.sliding_window_view(flat, 2 * self.hop)[:: self.hop][:n]
        spec = np.abs(np.fft.rfft(win * self._window, axis=1)) ** 2
        power = spec[:, self._band].sum(axis=1) / (2 * self.hop) ** 2
        self.db = np.concatenate([self.db, 10.0 * np.log10(power + 1e-12)])
        self._prev = flat[-self.hop :].copy()


def peak_hops(db: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """The hops of the envelope's syllable peaks. A peak near the end whose fall is not heard
    yet counts once it stands clear of the dip before it (a syllable begun)."""
    n = db.shape[0]
    if n < 3:
        return np.zeros(0, np.int64)
    k = SMOOTH_HOPS
    sm = np.convolve(np.pad(db, (k // 2, k - 1 - k // 2), mode="edge"), np.ones(k) / k, "valid")
    ref = float(np.percentile(sm, 95))
    pad = max(SPACING_HOPS, REACH_HOPS)
    hi = np.pad(sm, pad, constant_values=-np.inf)
    lo = np.pad(sm, pad, constant_values=np.inf)
    idx = np.arange(n) + pad
    s = SPACING_HOPS
    left_max = np.lib.stride_tricks.sliding_window_view(hi, s)[idx - s]  # [i-s, i)
    right_max = np.lib.stride_tricks.sliding_window_view(hi, s)[idx + 1]  # (i, i+s]
    r = REACH_HOPS
    left_min = np.lib.stride_tricks.sliding_window_view(lo, r + 1)[idx - r].min(axis=1)  # [i-r, i]
    right_min = np.lib.stride_tricks.sliding_window_view(lo, r + 1)[idx].min(axis=1)  # [i, i+r]
    top = (sm > left_max.max(axis=1)) & (sm >= right_max.max(axis=1))
    fall_unheard = np.arange(n) + r >= n  # the dip after it may still come
    rise = sm - left_min >= PROMINENCE_DB
    fall = (sm - right_min >= PROMINENCE_DB) | fall_unheard
    ok = top & rise & fall & (sm >= ref - VOICED_DB)
    return np.flatnonzero(ok).astype(np.int64)
