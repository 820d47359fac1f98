"""Vectorised sampling and the counter-based RNG."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtts.core.sampling import (
    AUDIO_STREAM,
    TEXT_STREAM,
    NonFiniteLogitsError,
    SamplerWorkspace,
    apply_repetition_penalty,
    counter_uniforms,
    sample_rows,
    sample_rows_plain,
)

NEG = -np.inf


def _params(n: int, temp: float = 1.0, k: int = 0, p: float = 1.0) -> tuple[np.ndarray, ...]:
    return (
        np.full(n, temp, np.float32),
        np.full(n, k, np.int64),
        np.full(n, p, np.float64),
    )


def _grid(n: int) -> np.ndarray:
    return (np.arange(n) + 0.5) / n


# -- counter_uniforms -------------------------------------------------------------------


def test_uniforms_range_shape_and_determinism() -> None:
    seed = np.array([0, 1, 2**64 - 1, 12345], dtype=np.uint64)
    ctr = np.array([0, 0, 7, 2**40], dtype=np.uint64)
    u = counter_uniforms(seed, ctr, 33, AUDIO_STREAM)
    assert u.shape == (4, 33) and u.dtype == np.float64
    assert np.all((u >= 0) & (u < 1))
    np.testing.assert_array_equal(u, counter_uniforms(seed, ctr, 33, AUDIO_STREAM))
    buf = np.empty((4, 33))
    assert counter_uniforms(seed, ctr, 33, AUDIO_STREAM, out=buf) is buf
    np.testing.assert_array_equal(buf, u)


def test_uniforms_rows_independent_of_batch() -> None:
    rng = np.random.default_rng(0)
    seed = rng.integers(0, 2**63, size=50).astype(np.uint64)
    ctr = rng.integers(0, 5000, size=50).astype(np.uint64)
    full = counter_uniforms(seed, ctr, 8, TEXT_STREAM)
    perm = rng.permutation(50)
    np.testing.assert_array_equal(counter_uniforms(seed[perm], ctr[perm], 8)[:, :], full[perm])
    for b in (0, 17, 49):
        np.testing.assert_array_equal(
            counter_uniforms(seed[b : b + 1], ctr[b : b + 1], 8)[0], full[b]
        )
    # a prefix of columns is the same whatever n is
    np.testing.assert_array_equal(counter_uniforms(seed, ctr, 3), full[:, :3])


def test_uniforms_differ_by_stream_counter_seed_and_column() -> None:
    s = np.array([42], np.uint64)
    c = np.array([3], np.uint64)
    a = counter_uniforms(s, c, 32, TEXT_STREAM)
    assert not np.any(a == counter_uniforms(s, c, 32, AUDIO_STREAM))
    assert not np.any(a == counter_uniforms(s, c + np.uint64(1), 32, TEXT_STREAM))
    assert not np.any(a == counter_uniforms(s + np.uint64(1), c, 32, TEXT_STREAM))
    assert len(np.unique(a)) == 32


def test_uniforms_are_uniform_and_uncorrelated() -> None:
    # many (seed, counter) keys with consecutive values: the worst case for a weak mix
    seed = np.repeat(np.arange(200, dtype=np.uint64), 100)
    ctr = np.tile(np.arange(100, dtype=np.uint64), 200)
    u = counter_uniforms(seed, ctr, 4, AUDIO_STREAM)
    flat = u.ravel()
    counts = np.bincount((flat * 64).astype(int), minlength=64)
    expected = flat.size / 64
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 120  # 63 dof: p ~ 1e-5 would be ~ 113
    assert abs(flat.mean() - 0.5) < 0.005
    for a, b in [(u[:, 0], u[:, 1]), (u[:-1, 0], u[1:, 0]), (u[:-100, 2], u[100:, 2])]:
        assert abs(np.corrcoef(a, b)[0, 1]) < 0.03


# -- repetition penalty -----------------------------------------------------------------


def test_repetition_penalty_rule() -> None:
    logits = np.array([[2.0, -2.0, 0.0, 3.0, NEG], [2.0, -2.0, 0.0, 3.0, NEG]], np.float32)
    seen = np.array([[1, 1, 1, 0, 1], [1, 1, 1, 1, 1]], bool)
    apply_repetition_penalty(logits, seen, np.array([2.0, 1.0], np.float32))
    np.testing.assert_array_equal(logits[0], [1.0, -4.0, 0.0, 3.0, NEG])
    np.testing.assert_array_equal(logits[1], [2.0, -2.0, 0.0, 3.0, NEG])


# -- greedy / filters -------------------------------------------------------------------


def test_greedy_first_index_on_ties_ignores_filters() -> None:
    logits = np.array(
        [[1.0, 5.0, 5.0, 2.0], [NEG, NEG, 0.0, 0.0], [3.0, 3.0, 3.0, 3.0]], np.float32
    )
    t, k, p = _params(3, temp=0.0, k=1, p=0.01)
    out = sample_rows(logits.copy(), t, k, p, np.full(3, 0.99))
    np.testing.assert_array_equal(out, [1, 2, 0])
    np.testing.assert_array_equal(sample_rows_plain(logits, t, k, p, np.full(3, 0.99)), out)


def test_top_k_1_is_argmax_for_every_u() -> None:
    rng = np.random.default_rng(3)
    row = rng.standard_normal(300).astype(np.float32)
    n = 500
    t, k, p = _params(n, temp=1.7, k=1)
    out = sample_rows(np.tile(row, (n, 1)), t, k, p, _grid(n))
    assert np.all(out == np.argmax(row))


def test_tiny_top_p_keeps_exactly_the_top_token() -> None:
    row = np.array([0.0, 1.0, 0.9, 0.95, -1.0], np.float32)
    n = 400
    for k in (0, 3, 5):
        t, kk, p = _params(n, temp=1.0, k=k, p=1e-6)
        out = sample_rows(np.tile(row, (n, 1)), t, kk, p, _grid(n))
        assert np.all(out == 1)


def test_top_p_one_keeps_all_of_top_k() -> None:
    row = np.array([5.0, 4.0, 3.0, 2.0, 1.0, 0.0, -1.0, -2.0], np.float32)
    n = 20000
    t, k, p = _params(n, temp=1.0, k=6, p=1.0)
    out = sample_rows(np.tile(row, (n, 1)), t, k, p, _grid(n))
    assert set(np.unique(out)) == set(range(6))


def test_top_p_drops_once_cumulative_before_exceeds_p() -> None:
    # probabilities 0.5, 0.25, 0.125, 0.125 (temperature 1): with p = 0.6 the
    # cumulative before token 1 is 0.5 <= 0.6 (kept), before token 2 it is
    # 0.75 > 0.6 (dropped) -> tokens {0, 1} with renormalised 2/3, 1/3.
    row = np.log(np.array([0.5, 0.25, 0.125, 0.125], np.float64)).astype(np.float32)
    n = 30000
    t, k, p = _params(n, temp=1.0, k=0, p=0.6)
    out = sample_rows(np.tile(row, (n, 1)), t, k, p, _grid(n))
    counts = np.bincount(out, minlength=4)
    assert counts[2] == counts[3] == 0
    assert abs(counts[0] / n - 2 / 3) < 0.002


def test_masked_entries_never_returned_even_with_large_k() -> None:
    rng = np.random.default_rng(5)
    n, v = 3000, 40
    logits = rng.standard_normal((n, v)).astype(np.float32)
    mask = rng.random((n, v)) < 0.9
    mask[np.arange(n), rng.integers(0, v, n)] = False  # at least one finite per row
    logits[mask] = NEG
    t = rng.choice([0.0, 0.7, 1.5], n).astype(np.float32)
    k = rng.choice([0, 1, 25, 50], n)
    p = rng.choice([0.3, 0.8, 1.0], n)
    u = rng.random(n)
    u[:10] = 0.0
    u[10:20] = np.nextafter(1.0, 0.0)
    out = sample_rows(logits.copy(), t, k, p, u)
    assert np.all(np.isfinite(logits[np.arange(n), out]))


def test_extreme_u_and_single_candidate() -> None:
    row = np.array([[NEG, 2.0, NEG, NEG]], np.float32)
    for uu in (0.0, 0.5, np.nextafter(1.0, 0.0)):
        for k in (0, 1, 3):
            t, kk, p = _params(1, temp=1.0, k=k, p=0.5)
            assert sample_rows(row.copy(), t, kk, p, np.array([uu]))[0] == 1


def test_all_masked_or_nan_raises() -> None:
    bad = np.array([[0.0, 1.0], [NEG, NEG], [np.nan, 1.0]], np.float32)
    for temp in (0.0, 1.0):
        t, k, p = _params(3, temp=temp, k=0)
        with pytest.raises(NonFiniteLogitsError) as err:
            sample_rows(bad.copy(), t, k, p, np.full(3, 0.5))
        assert err.value.rows == (1, 2)
    wide = np.zeros((3, 200), np.float32)  # the partition path (k < V)
    wide[2, 150] = np.nan
    wide[0, 7] = np.inf
    t, k, p = _params(3, temp=1.0, k=5, p=0.8)
    with pytest.raises(NonFiniteLogitsError) as err:
        sample_rows(wide, t, k, p, np.full(3, 0.5))
    assert err.value.rows == (0, 2)


def test_empirical_distribution_matches_softmax() -> None:
    rng = np.random.default_rng(11)
    v = 12
    row = (rng.standard_normal(v) * 1.5).astype(np.float32)
    n = 60000
    seeds = np.full(n, 7, np.uint64)
    u = counter_uniforms(seeds, np.arange(n, dtype=np.uint64), 1, AUDIO_STREAM)[:, 0]
    for temp, k, p in [(1.0, 0, 1.0), (1.7, 5, 1.0), (0.8, 8, 0.8)]:
        t, kk, pp = _params(n, temp=temp, k=k, p=p)
        out = sample_rows(np.tile(row, (n, 1)), t, kk, pp, u)
        # expected: official semantics computed directly
        x = row.astype(np.float64) / temp
        order = np.argsort(-x, kind="stable")
        keep = order[: (k or v)]
        prob = np.exp(x[keep] - x[keep].max())
        prob /= prob.sum()
        if p < 1:
            cum = np.cumsum(prob)
            drop = np.concatenate([[False], cum[:-1] > p])
            prob = np.where(drop, 0.0, prob)
            prob /= prob.sum()
        expected = np.zeros(v)
        expected[keep] = prob
        counts = np.bincount(out, minlength=v)
        assert np.all(counts[expected == 0] == 0)
        e = expected[expected > 0] * n
        chi2 = float(((counts[expected > 0] - e) ** 2 / e).sum())
        assert chi2 < 40, (temp, k, p, chi2)  # <= 11 dof; p-value ~1e-4 at ~37


# -- vectorised == reference ------------------------------------------------------------


@st.composite
def batches(draw: st.DrawFn) -> tuple[np.ndarray, ...]:
    n = draw(st.integers(1, 12))
    v = draw(st.integers(1, 40))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((n, v)) * draw(st.sampled_from([0.5, 2.0, 8.0]))).astype(
        np.float32
    )
    if draw(st.booleans()):  # ties
        logits = np.round(logits)
    masked = rng.random((n, v)) < draw(st.sampled_from([0.0, 0.5, 0.95]))
    masked[np.arange(n), rng.integers(0, v, n)] = False
    logits[masked] = NEG
    t = rng.choice([0.0, 0.3, 1.0, 1.7], n).astype(np.float32)
    k = rng.choice([0, 1, 2, 5, 25, 60], n)
    p = rng.choice([1e-3, 0.5, 0.8, 1.0], n)
    u = rng.random(n)
    pen = rng.choice([1.0, 1.0, 1.3, 0.7], n).astype(np.float32)
    seen = rng.random((n, v)) < 0.3
    return logits, t, k, p, u, pen, seen


@given(batches(), st.booleans())
@settings(max_examples=300, deadline=None)
def test_vectorised_equals_reference(b: tuple[np.ndarray, ...], with_penalty: bool) -> None:
    logits, t, k, p, u, pen, seen = b
    prev = [np.flatnonzero(s).tolist() for s in seen]
    if with_penalty:
        ref = sample_rows_plain(logits, t, k, p, u, prev_tokens=prev, penalty=pen)
        got = sample_rows(logits.copy(), t, k, p, u, seen=seen, penalty=pen)
    else:
        ref = sample_rows_plain(logits, t, k, p, u)
        got = sample_rows(logits.copy(), t, k, p, u)
    np.testing.assert_array_equal(got, ref)


@given(batches(), st.randoms(use_true_random=False), st.booleans())
@settings(max_examples=200, deadline=None)
def test_selected_rows_equal_reference(
    b: tuple[np.ndarray, ...], rnd: object, with_penalty: bool
) -> None:
    import random

    assert isinstance(rnd, random.Random)
    logits, t, k, p, u, pen, seen = b
    n = logits.shape[0]
    sel = np.array(rnd.sample(range(n), rnd.randint(1, n)), dtype=np.int64)  # any order
    prev = [np.flatnonzero(s).tolist() for s in seen]
    ref = sample_rows_plain(
        logits,
        t,
        k,
        p,
        u,
        prev_tokens=prev if with_penalty else None,
        penalty=pen if with_penalty else None,
    )
    work = logits.copy()
    got = sample_rows(
        work,
        t[sel],
        k[sel],
        p[sel],
        u[sel],
        rows=sel,
        seen=seen[sel] if with_penalty else None,
        penalty=pen[sel] if with_penalty else None,
        workspace=SamplerWorkspace(),
    )
    np.testing.assert_array_equal(got, ref[sel])
    others = np.setdiff1d(np.arange(n), sel)
    np.testing.assert_array_equal(work[others], logits[others])  # unselected rows untouched


def test_vectorised_equals_reference_audio_shape() -> None:
    rng = np.random.default_rng(2)
    n, v = 64, 1025
    logits = (rng.standard_normal((n, v)) * 3).astype(np.float32)
    logits[:, 1024] = NEG
    t, k, p = _params(n, temp=1.7, k=25, p=0.8)
    u = rng.random(n)
    ws = SamplerWorkspace()
    got = sample_rows(logits.copy(), t, k, p, u, workspace=ws)
    np.testing.assert_array_equal(got, sample_rows_plain(logits, t, k, p, u))
    # the workspace is reusable and results do not depend on it
    np.testing.assert_array_equal(sample_rows(logits.copy(), t, k, p, u, workspace=ws), got)


def test_row_result_independent_of_batch_composition() -> None:
    rng = np.random.default_rng(9)
    n, v = 20, 100
    logits = rng.standard_normal((n, v)).astype(np.float32)
    t = rng.choice([0.0, 1.0, 1.5], n).astype(np.float32)
    k = rng.choice([0, 3, 25], n)
    p = rng.choice([0.5, 1.0], n)
    u = rng.random(n)
    full = sample_rows(logits.copy(), t, k, p, u)
    perm = rng.permutation(n)[:7]
    part = sample_rows(logits[perm].copy(), t[perm], k[perm], p[perm], u[perm])
    np.testing.assert_array_equal(part, full[perm])


def test_large_batches_are_sampled_in_pieces_with_the_same_result(monkeypatch: pytest.MonkeyPatch) -> None:
    from streamtts.core import sampling

    monkeypatch.setattr(sampling, "CHUNK_ROWS", 3)  # 11 rows: pieces of 3, 3, 3, 2
    rng = np.random.default_rng(5)
    n, v = 11, 60
    logits = (rng.standard_normal((n, v)) * 2).astype(np.float32)
    logits[rng.random((n, v)) < 0.3] = NEG
    logits[:, 0] = 1.0  # every row keeps a finite candidate
    t = rng.choice([0.0, 1.0, 1.7], n).astype(np.float32)
    k = rng.choice([0, 5, 25], n)
    p = rng.choice([0.5, 0.8, 1.0], n)
    u = rng.random(n)
    pen = rng.choice([1.0, 1.3], n).astype(np.float32)
    seen = rng.random((n, v)) < 0.3
    prev = [np.flatnonzero(s).tolist() for s in seen]
    ref = sample_rows_plain(logits, t, k, p, u, prev_tokens=prev, penalty=pen)
    np.testing.assert_array_equal(sample_rows(logits.copy(), t, k, p, u, seen=seen, penalty=pen), ref)
    sel = np.array([10, 2, 7, 3, 0, 9, 5], dtype=np.int64)
    got = sample_rows(logits.copy(), t[sel], k[sel], p[sel], u[sel], rows=sel, seen=seen[sel], penalty=pen[sel])
    np.testing.assert_array_equal(got, ref[sel])
    # one temperature for all rows takes the scalar pass: same tokens
    t1 = np.full(n, 1.7, np.float32)
    np.testing.assert_array_equal(sample_rows(logits.copy(), t1, k, p, u), sample_rows_plain(logits, t1, k, p, u))
    bad = logits.copy()
    bad[[1, 8]] = np.nan  # in two different pieces: both named
    with pytest.raises(NonFiniteLogitsError) as err:
        sample_rows(bad, t1, k, p, u)
    assert err.value.rows == (1, 8)
