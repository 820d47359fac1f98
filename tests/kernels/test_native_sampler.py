"""The compiled sampler (native/sampler.c through streamtts.kernels.sampler) against the NumPy one.

Both implement one specification (core/sampling.py): for the same uniforms they must return
the same token in every row, whatever the values (ties, masked tokens, rows of equal values,
extreme temperatures), the parameters, the row layout (strided views, selected rows) and the
bad rows. The engine uses the compiled one by default, so its streams are checked too.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtts import Engine
from streamtts.config import EngineConfig, SamplingParams
from streamtts.core.delay_state import DelayStates
from streamtts.core.sampling import sample_rows, sample_rows_reference
from streamtts.core.tokens import TokenIds
from streamtts.errors import ConfigError, NonFiniteLogitsError
from streamtts.kernels.sampler import NativeSampler
from streamtts.request import StreamOptions


@pytest.fixture(scope="module")
def native(bridge_lib: Any) -> NativeSampler:
    return NativeSampler(bridge_lib)


def _case(rng: np.random.Generator, n: int, v: int, kind: int) -> tuple[np.ndarray, ...]:
    lg = (rng.standard_normal((n, v)) * rng.choice([0.5, 2.0, 30.0])).astype(np.float32)
    if kind % 3 == 0:
        lg = np.round(lg, 1)  # many equal values: ids decide
    if kind % 4 == 0:
        lg[:, rng.integers(0, v, size=max(1, v // 3))] = -np.inf  # masked tokens
    if kind % 5 == 0:
        lg[:, : v // 2] = lg[:, :1]  # half the row one value
    temp = rng.choice([0.0, 0.3, 1.0, 1.7, 1e-3, 50.0, 1e6], size=n).astype(np.float32)
    top_k = rng.choice([0, 1, 2, 25, 50, 300, v + 5], size=n).astype(np.int64)
    top_p = rng.choice([1.0, 0.8, 0.3, 0.0, 0.999], size=n)
    u = rng.random(n)
    return lg, temp, top_k, top_p, u


@pytest.mark.parametrize("v", [2, 7, 600, 1025, 3000, 20000])
def test_same_tokens_as_numpy(native: NativeSampler, v: int) -> None:
    rng = np.random.default_rng(v)
    for kind in range(12):
        lg, temp, top_k, top_p, u = _case(rng, int(rng.integers(1, 200)), v, kind)
        want = sample_rows(lg.copy(), temp, top_k, top_p, u)
        before = lg.copy()
        got = native(lg, temp, top_k, top_p, u)
        np.testing.assert_array_equal(got, want, err_msg=f"v={v} kind={kind}")
        np.testing.assert_array_equal(lg, before)  # only read


@settings(max_examples=200, deadline=None)
@given(
    v=st.integers(1, 700),
    data=st.data(),
)
def test_same_tokens_for_any_values(native: NativeSampler, v: int, data: st.DataObject) -> None:
    """Few distinct values (ties everywhere), masked tokens, any parameters."""
    n = data.draw(st.integers(1, 6))
    pool = data.draw(st.lists(st.sampled_from([-np.inf, -3.0, -0.5, 0.0, 0.25, 1.0, 2.5, 7.0]), min_size=1, max_size=4))
    lg = np.array(data.draw(st.lists(st.sampled_from(pool), min_size=n * v, max_size=n * v)), np.float32).reshape(n, v)
    lg[:, -1] = 1.0  # every row has a finite value
    temp = np.array(data.draw(st.lists(st.sampled_from([0.0, 0.7, 1.0, 1.7, 3.0]), min_size=n, max_size=n)), np.float32)
    top_k = np.array(data.draw(st.lists(st.integers(0, v + 2), min_size=n, max_size=n)), np.int64)
    top_p = np.array(data.draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n)))
    u = np.array(data.draw(st.lists(st.floats(0.0, 0.999999), min_size=n, max_size=n)))
    want = sample_rows(lg.copy(), temp, top_k, top_p, u)
    np.testing.assert_array_equal(native(lg, temp, top_k, top_p, u), want)


def test_same_tokens_as_the_plain_reference(native: NativeSampler) -> None:
    rng = np.random.default_rng(5)
    for kind in range(6):
        lg, temp, top_k, top_p, u = _case(rng, 40, 1025, kind)
        want = sample_rows_reference(lg, temp, top_k, top_p, u)
        np.testing.assert_array_equal(native(lg, temp, top_k, top_p, u), want)


def test_audio_rows_as_the_engine_samples_them(native: NativeSampler) -> None:
    """The default audio parameters over many rows: the fast path, never the fallback's answer."""
    rng = np.random.default_rng(9)
    n = 4096
    lg = (2 * rng.standard_normal((n, 1025))).astype(np.float32)
    lg[:, 1024] = -np.inf  # the pad code, masked
    temp = np.full(n, 1.7, np.float32)
    top_k = np.full(n, 25, np.int64)
    top_p = np.full(n, 0.8)
    u = rng.random(n)
    got = native(lg, temp, top_k, top_p, u)
    np.testing.assert_array_equal(got, sample_rows(lg.copy(), temp, top_k, top_p, u))
    assert len(np.unique(got)) > 500  # sampled, not a constant


def test_repetition_penalty(native: NativeSampler) -> None:
    rng = np.random.default_rng(3)
    n, v = 300, 1025
    lg = (2 * rng.standard_normal((n, v))).astype(np.float32)
    seen = rng.random((n, v)) < 0.2
    pen = rng.choice([1.0, 1.3, 0.7], size=n).astype(np.float32)
    temp = rng.choice([0.0, 1.7], size=n).astype(np.float32)
    top_k = np.full(n, 25, np.int64)
    top_p = np.full(n, 0.8)
    u = rng.random(n)
    want = sample_rows(lg.copy(), temp, top_k, top_p, u, seen=seen, penalty=pen)
    np.testing.assert_array_equal(native(lg, temp, top_k, top_p, u, seen=seen, penalty=pen), want)
    plain = native(lg, temp, top_k, top_p, u)
    assert np.any(plain != want)  # the penalty changed something


def test_strided_rows_and_selected_rows(native: NativeSampler) -> None:
    """(B, K, A) views over rows with other columns between (the fused heads' logits)."""
    rng = np.random.default_rng(4)
    b, k, a = 6, 4, 1025
    full = (2 * rng.standard_normal((b, 2 + k * a))).astype(np.float32)
    view = full[:, 2:].reshape(b, k, a)
    assert not view.flags.c_contiguous
    flat = np.ascontiguousarray(view).reshape(b * k, a)
    n = b * k
    temp = np.full(n, 1.7, np.float32)
    top_k = np.full(n, 25, np.int64)
    top_p = np.full(n, 0.8)
    u = rng.random(n)
    want = sample_rows(flat.copy(), temp, top_k, top_p, u)
    np.testing.assert_array_equal(native(view, temp, top_k, top_p, u), want)
    pick = np.array([1, 5, 6, 23])
    got = native(view, temp[pick], top_k[pick], top_p[pick], u[pick], rows=pick)
    np.testing.assert_array_equal(got, want[pick])
    rev = flat[::-1]  # a negative row stride
    np.testing.assert_array_equal(native(rev, temp, top_k, top_p, u), sample_rows(rev.copy(), temp, top_k, top_p, u))


def test_bad_rows_are_named(native: NativeSampler) -> None:
    rng = np.random.default_rng(6)
    n, v = 8, 1025
    lg = rng.standard_normal((n, v)).astype(np.float32)
    lg[1, 700] = np.nan
    lg[3, 5] = np.inf
    lg[5] = -np.inf
    lg[6] = 1e38  # finite, but the temperature below overflows it
    temp = np.full(n, 1.7, np.float32)
    temp[6] = 1e-3
    args = (temp, np.full(n, 25, np.int64), np.full(n, 0.8), rng.random(n))
    with pytest.raises(NonFiniteLogitsError) as ei:
        native(lg, *args)
    assert ei.value.rows == (1, 3, 5, 6)
    with pytest.raises(NonFiniteLogitsError) as ref:
        sample_rows(lg.copy(), *args)
    assert ref.value.rows == ei.value.rows
    greedy = np.zeros(n, np.float32)
    with pytest.raises(NonFiniteLogitsError) as eg:
        native(lg, greedy, *args[1:])
    assert eg.value.rows == (1, 5)  # +inf is a fine argmax


def test_bad_arguments_are_named(native: NativeSampler) -> None:
    lg = np.zeros((4, 10), np.float32)
    ok = (np.ones(4, np.float32), np.zeros(4, np.int64), np.ones(4), np.zeros(4))
    with pytest.raises(TypeError, match="float32"):
        native(lg.astype(np.float64), *ok)
    with pytest.raises(ValueError, match="contiguous"):
        native(lg[:, ::2], *ok)
    with pytest.raises(ValueError, match="temperature"):
        native(lg, np.ones(3, np.float32), *ok[1:])
    with pytest.raises(IndexError, match=r"rows must be in \[0, 4\)"):
        native(lg, *ok, rows=np.array([0, 1, 2, 4]))
    with pytest.raises(ValueError, match="penalty needs seen"):
        native(lg, *ok, penalty=np.ones(4, np.float32))
    assert native(lg[:0], *(a[:0] for a in ok)).shape == (0,)


def test_delay_states_same_rows_with_either_sampler(native: NativeSampler) -> None:
    """The state machine over 90 steps of made-up logits (strided, as the fused heads hand
    them; through delays, flushes and text mode): the same rows with either sampler."""
    ids = TokenIds()
    k, a = ids.n_vq, ids.audio_rows
    cap = 3
    rng = np.random.default_rng(8)
    prompt = np.full((7, 1 + k), ids.audio_pad_code, np.int64)  # text rows, then <|audio_start|>
    prompt[:-1, 0] = 100
    prompt[-1, 0] = ids.audio_start
    states = [DelayStates(cap, ids), DelayStates(cap, ids, native)]
    for ds in states:
        for slot in range(cap):
            ds.reset(slot, prompt, SamplingParams(), seed=slot + 1)
    slots = np.arange(cap)
    asked: list[int] = []
    texts: set[int] = set()
    for step in range(90):
        pair = rng.standard_normal((cap, 2)).astype(np.float32)
        pair[:, 0] += 3.0  # mostly gen slot, sometimes the delay
        logits = (2 * rng.standard_normal((cap, 2 + k * a))).astype(np.float32)
        rows = []
        for ds in states:
            audio = logits.copy()[:, 2:].reshape(cap, k, a)
            def full(b: int, step: int = step) -> np.ndarray:  # the same row for both
                asked.append(b)
                return np.random.default_rng((step, b)).standard_normal(151663).astype(np.float32)

            rows.append(ds.step(slots, pair.copy(), audio, full))
        np.testing.assert_array_equal(rows[0], rows[1], err_msg=f"step {step}")
        texts |= set(rows[0][:, 0].tolist())
    assert {ids.delay_slot, ids.audio_end} <= texts and asked  # flushes and text mode were run


def test_engine_streams_the_same_codes_with_either_sampler(demo_model_dir: Path) -> None:
    async def codes(sampler: str) -> tuple[list[np.ndarray], str]:
        async with Engine.from_config(demo_model_dir / "config.yaml", n_threads=1, max_streams=2, sampler=sampler) as e:
            out = [(await e.generate("Hello there, how are you?", options=StreamOptions(seed=s, fixed_frames=40))).codes for s in (1, 2)]
            return out, str(e.info["sampler"])

    numpy_codes, n_info = asyncio.run(codes("numpy"))
    native_codes, c_info = asyncio.run(codes("native"))
    assert (n_info, c_info) == ("numpy", "native")
    for x, y in zip(numpy_codes, native_codes, strict=True):
        assert x.shape[0] >= 40
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(numpy_codes[0], numpy_codes[1])  # seeds differ: sampled


def test_unknown_sampler_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="sampler must be 'native' or 'numpy'"):
        EngineConfig(sampler="fast").validate()
