"""The compiled step (native/delay.c through streamtts.kernels.delay_step) against the Python one.

``DelayStates.step`` is the specification (itself checked against the official step in
core/test_delay_state.py); the compiled twin must produce the same rows and leave every state array
(lengths, flags, step counters, the penalty's ``seen``) the same, step after step, through
whole lifecycles: audio, the delay flush, ``<|audio_end|>``, text mode (where it hands the
step back to Python), ``<|im_end|>``; with any sampling parameters, the fused heads' strided
logits, swapped pair ids, bad rows and bad slots.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import SMALL_IDS, SWAPPED_IDS, random_sampling_params
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtts.config import SamplingParams
from streamtts.core.delay_state import DelayStates
from streamtts.core.tokens import TokenIds
from streamtts.errors import NonFiniteLogitsError
from streamtts.kernels.sampler import NativeSampler

REAL = TokenIds()
SMALL = SMALL_IDS
SWAPPED = SWAPPED_IDS
STATE = ("audio_length", "delayed_length", "is_audio", "is_stopping", "audio_ended", "time_step", "seen")


class PythonStep:
    """The compiled sampler without the compiled step: DelayStates steps in Python."""

    accepts_strided = True

    def __init__(self, native: NativeSampler) -> None:
        self._native = native

    def __call__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        return self._native(*args, **kwargs)


class Counting:
    """Counts the steps the compiled twin took and the ones it handed back."""

    def __init__(self, states: DelayStates) -> None:
        assert states._compiled is not None
        self.inner = states._compiled
        self.took = self.handed_back = 0
        states._compiled = self

    def __call__(self, *args: Any) -> bool:
        done = self.inner(*args)
        self.took += done
        self.handed_back += not done
        return done


@pytest.fixture(scope="module")
def native(bridge_lib: Any) -> NativeSampler:
    return NativeSampler(bridge_lib)


def _prompt(rng: np.random.Generator, ids: TokenIds) -> np.ndarray:
    s = int(rng.integers(2, 9))
    p = np.full((s, 1 + ids.n_vq), ids.audio_pad_code, np.int64)
    p[:, 0] = 8 if ids.im_start < 100 else 100
    keep = rng.random((s, ids.n_vq)) < 0.3
    p[:, 1:][keep] = rng.integers(0, ids.audio_vocab_size, (s, ids.n_vq))[keep]
    end = rng.choice(["audio_start", "gen", "text"], p=[0.6, 0.3, 0.1])
    if end == "audio_start":
        p[-1, 0] = ids.audio_start
    elif end == "gen":
        p[0, 0] = ids.audio_start
        p[1:, 0] = ids.gen_slot
    return p


def _run(
    native: NativeSampler,
    ids: TokenIds,
    seed: int,
    steps: int,
    capacity: int,
    fused: bool,
    bad: float = 0.0,
    delay: tuple[float, ...] = (-6.0, -3.0, 0.0, 2.0),
    bound: bool = False,
) -> Counting:
    rng = np.random.default_rng(seed)
    k_n, a_n = ids.n_vq, ids.audio_rows
    v = max(ids.pad, ids.im_start, ids.im_end, ids.audio_start, ids.audio_end, ids.user_slot, ids.gen_slot, ids.delay_slot) + 3  # text vocabulary
    py = DelayStates(capacity, ids, PythonStep(native))
    cc = DelayStates(capacity, ids, native)
    assert py._compiled is None
    k_all = 2 + k_n * a_n if fused else 2
    # the engine's way (bound=True): buffers bound once, a step in their first rows
    slot_buf = np.zeros(capacity, np.int64)
    logits_buf = np.zeros((capacity, k_all), np.float32)
    audio_buf = logits_buf[:, 2:].reshape(capacity, k_n, a_n) if fused else np.zeros((capacity, k_n, a_n), np.float32)
    out_buf = np.zeros((capacity, 1 + k_n), np.int64)
    fast = cc.bound_step(slot_buf, logits_buf[:, :2], audio_buf, out_buf) if bound else None
    assert (fast is not None) == bound
    count = Counting(cc)  # counts the general step's calls (the bound one's: below)
    live = [int(s) for s in rng.permutation(capacity)[: int(rng.integers(1, capacity + 1))]]
    for s in live:
        prompt, params, seed_s = _prompt(rng, ids), random_sampling_params(rng, (0, 1, 5, 25, 300)), int(rng.integers(0, 2**63))  # 0, 300: sorted path
        py.reset(s, prompt, params, seed_s)
        cc.reset(s, prompt, params, seed_s)
    for _ in range(steps):
        batch = np.array(rng.permutation(live)[: int(rng.integers(1, len(live) + 1))], dtype=np.int64)
        b = batch.size
        pair = (rng.standard_normal((b, 2)) * 2).astype(np.float32)
        pair[:, 1] += rng.choice(delay, b).astype(np.float32)  # the delay slot now and then
        full = (rng.standard_normal((b, v)) * 2).astype(np.float32)
        wide = v > 1000  # the real vocabulary: random ids would win in text mode for ever
        full[:, ids.im_end] += 9.0 if wide else 1.0
        full[:, ids.audio_start] += 10.0 if wide else 2.0
        audio = (rng.standard_normal((b, k_n, a_n)) * 2).astype(np.float32)
        if rng.random() < 0.3:
            audio = np.round(audio)  # ties: ids decide
        if rng.random() < bad:
            (audio if rng.random() < 0.7 else pair)[int(rng.integers(0, b))].flat[int(rng.integers(0, 2))] = np.nan
        results = []
        for states in (py, cc):
            if fused:  # the fused heads' layout: audio rows between two text columns, uncopied
                rows = np.empty((b, 2 + k_n * a_n), np.float32)
                rows[:, 2:] = audio.reshape(b, -1)
                lg = rows[:, 2:].reshape(b, k_n, a_n)
            else:
                lg = audio.copy()
            out = np.full((b, 1 + k_n), -5, np.int64)
            try:
                if states is cc and fast is not None:
                    logits_buf[:b, :2] = pair
                    audio_buf[:b] = audio
                    slot_buf[:b] = batch
                    out = out_buf[:b]
                    if fast(b):
                        count.took += 1
                    else:  # handed back: the general step on the same buffers
                        states.step(batch, logits_buf[:b, :2], audio_buf[:b], lambda j, full=full: full[j].copy(), out=out)
                else:
                    states.step(batch, pair.copy(), lg, lambda j, full=full: full[j].copy(), out=out)
                results.append(("ok", out.copy()))
            except NonFiniteLogitsError as exc:
                results.append(("error", str(exc)))
        assert results[0][0] == results[1][0], results
        if results[0][0] == "ok":
            np.testing.assert_array_equal(results[1][1], results[0][1])
        else:
            assert results[0][1] == results[1][1]
        for name in STATE:
            np.testing.assert_array_equal(getattr(cc, name), getattr(py, name), err_msg=name)
    return count


@given(st.integers(0, 2**32 - 1), st.booleans(), st.booleans())
@settings(max_examples=80, deadline=None)
def test_same_rows_and_states_as_the_python_step_small(native: NativeSampler, seed: int, fused: bool, bound: bool) -> None:
    _run(native, SMALL, seed, steps=40, capacity=6, fused=fused, bad=0.05, bound=bound)


@given(st.integers(0, 2**32 - 1))
@settings(max_examples=15, deadline=None)
def test_same_rows_and_states_with_swapped_pair_ids(native: NativeSampler, seed: int) -> None:
    _run(native, SWAPPED, seed, steps=30, capacity=4, fused=False, bad=0.05)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("bound", [False, True])
def test_same_rows_and_states_real_shapes(native: NativeSampler, fused: bool, bound: bool) -> None:
    count = _run(native, REAL, 3, steps=120, capacity=4, fused=fused, delay=(-9.0,) * 12 + (3.0,), bound=bound)
    # the compiled twin took the steps in audio mode, and handed the text-mode ones back
    assert count.took > 60 and count.handed_back >= 1, (count.took, count.handed_back)


def test_bad_slots_and_bad_rows_leave_the_states_unchanged(native: NativeSampler) -> None:
    ids = REAL
    states = DelayStates(4, ids, native)
    prompt = np.full((3, 1 + ids.n_vq), ids.audio_pad_code, np.int64)
    prompt[:, 0] = [100, 100, ids.audio_start]
    for s in range(4):
        states.reset(s, prompt, SamplingParams(), seed=s)
    count = Counting(states)
    before = {n: getattr(states, n).copy() for n in STATE}
    pair = np.zeros((2, 2), np.float32)
    audio = np.zeros((2, ids.n_vq, ids.audio_rows), np.float32)
    for bad in ([0, 0], [-1, 0], [0, 4]):
        with pytest.raises(ValueError, match=r"slots must be distinct and in \[0, 4\)"):
            states.step(np.array(bad), pair, audio.copy(), lambda j: np.zeros(1, np.float32))
    audio[1, 0, 5] = np.nan
    with pytest.raises(NonFiniteLogitsError, match=r"audio of slots \[3\]"):
        states.step(np.array([2, 3]), pair, audio.copy(), lambda j: np.zeros(1, np.float32))
    nan_pair = pair.copy()
    nan_pair[0, 0] = np.nan
    with pytest.raises(NonFiniteLogitsError, match=r"text of slots \[2\]"):
        states.step(np.array([2, 3]), nan_pair, np.zeros_like(audio), lambda j: np.zeros(1, np.float32))
    for n, v in before.items():
        np.testing.assert_array_equal(getattr(states, n), v, err_msg=n)
    assert count.took == 0  # every one of those raised from the compiled step


def test_bound_step_refuses_buffers_it_cannot_read(native: NativeSampler) -> None:
    ids = SMALL
    states = DelayStates(4, ids, native)
    k, a = ids.n_vq, ids.audio_rows
    ok = (np.zeros(4, np.int64), np.zeros((4, 2), np.float32), np.zeros((4, k, a), np.float32), np.zeros((4, 1 + k), np.int64))
    assert states.bound_step(*ok) is not None
    assert DelayStates(4, ids).bound_step(*ok) is None  # the NumPy sampler has no compiled twin
    for i, bad in enumerate(
        (np.zeros(4, np.int32), np.zeros((3, 2), np.float32), np.zeros((4, k, a), np.float64), np.zeros((4, 1 + k), np.int32))
    ):
        args = list(ok)
        args[i] = bad
        assert states.bound_step(*args) is None, i
    fast = states.bound_step(*ok)
    assert fast is not None
    with pytest.raises(ValueError, match="5 streams do not fit the 4 rows bound"):
        fast(5)
    ok[0][:2] = [1, 1]
    with pytest.raises(ValueError, match=r"slots must be distinct and in \[0, 4\), got \[1, 1\]"):
        fast(2)
