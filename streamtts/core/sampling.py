"""Vectorised sampling with a counter-based per-request RNG (contract section 6).

Why this shape:

- One call samples every head row of every stream in a step (up to 128 x 32
  rows of 1025 logits), with per-row temperature / top-k / top-p, so the cost
  is a handful of NumPy passes instead of thousands of small calls.
- Random numbers come from :func:`counter_uniforms`, a pure function of
  (request seed, step counter, column, stream). A request's tokens therefore
  depend only on its own seed, logits and state: not on which other requests
  share the batch, their order, or how many steps the engine ran before.
- The draw is an inverse-CDF lookup over the candidates in a *canonical*
  order (value descending, token id ascending on ties). The official
  pipeline draws over ``argpartition`` order, which is unspecified; the
  distribution is the same, and the canonical order makes the token for a
  given uniform well defined, so :func:`sample_rows` can be checked token for
  token against the simple :func:`sample_rows_plain`.

Semantics (the official llama.cpp pipeline's ``sample_token``): temperature
scaling first (0 = greedy: argmax, first index on ties, temperature and
filters ignored), then the repetition penalty on the scaled logits, then
top-k (0 = off), then top-p *within* the top-k values (softmax over them,
sorted descending; a token is dropped when the cumulative probability before
it already exceeds p, so the first is always kept; p >= 1 skips the filter),
then softmax and one draw. Masked tokens are -inf and are never returned.
The filter arithmetic is float64 on the float32 scaled logits (the official
code works in float32), so only ties within float rounding of the top-p
boundary can be decided differently.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from ..errors import NonFiniteLogitsError

TEXT_STREAM = 0
"""``counter_uniforms`` stream for the text channel."""
AUDIO_STREAM = 1
"""``counter_uniforms`` stream for the audio codebooks."""

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
_STREAM_SALT = 0x632BE59BD9B4E019
_INV_2_53 = 1.0 / float(1 << 53)


# -- counter-based RNG -----------------------------------------------------------------


def _mix_int(x: int) -> int:
    """splitmix64 finaliser on a Python int (used for per-stream constants)."""
    x &= _MASK64
    x ^= x >> 30
    x = (x * _MIX1) & _MASK64
    x ^= x >> 27
    x = (x * _MIX2) & _MASK64
    x ^= x >> 31
    return x


def stream_salt(stream: int) -> int:
    """The constant :func:`counter_uniforms` mixes into every key of ``stream``."""
    return _mix_int(stream * _GOLDEN + _STREAM_SALT)


def _mix_(z: np.ndarray) -> None:
    """splitmix64 finaliser, in place on a uint64 array (wrapping arithmetic)."""
    z ^= z >> np.uint64(30)
    z *= np.uint64(_MIX1)
    z ^= z >> np.uint64(27)
    z *= np.uint64(_MIX2)
    z ^= z >> np.uint64(31)


def seed_to_uint64(seed: int) -> np.uint64:
    """Map any Python int seed onto the RNG's 64-bit key space."""
    return np.uint64(seed & _MASK64)


def counter_uniforms(
    seed: np.ndarray,
    counter: np.ndarray,
    n: int,
    stream: int = 0,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Uniforms in [0, 1) keyed by (seed, counter, column, stream): (B, n) float64.

    Row b is a pure function of ``seed[b]``, ``counter[b]`` and ``stream``, so a
    request's randomness does not depend on the batch it runs in. Each value
    is a splitmix64 hash chain over the key; the top 53 bits become the
    float's mantissa (exactly representable, never 1.0).
    """
    s = np.asarray(seed)
    c = np.asarray(counter)
    if s.ndim != 1 or c.shape != s.shape:
        raise ValueError(f"seed and counter must be 1-D of equal length, got {s.shape}, {c.shape}")
    b = s.shape[0]
    if out is None:
        out = np.empty((b, n), dtype=np.float64)
    elif out.shape != (b, n) or out.dtype != np.float64:
        raise ValueError(f"out must be float64 of shape {(b, n)}, got {out.dtype} {out.shape}")
    salt = np.uint64(stream_salt(stream))
    h = s.astype(np.uint64) ^ salt
    _mix_(h)
    k = c.astype(np.uint64) + np.uint64(_GOLDEN)
    _mix_(k)
    h ^= k
    _mix_(h)
    cols = (np.arange(1, n + 1, dtype=np.uint64) * np.uint64(_GOLDEN))[None, :]
    z = h[:, None] + cols
    _mix_(z)
    z >>= np.uint64(11)
    np.multiply(z, _INV_2_53, out=out)
    return out


# -- repetition penalty ----------------------------------------------------------------


def apply_repetition_penalty(logits: np.ndarray, seen: np.ndarray, penalty: np.ndarray) -> None:
    """In place: where ``seen`` and the row's penalty != 1, divide positive logits
    by the penalty and multiply the others (the HF/official rule)."""
    pen = np.asarray(penalty, dtype=np.float32)
    on = pen != np.float32(1.0)
    if not on.any():
        return
    if logits.shape != seen.shape or pen.shape != (logits.shape[0],):
        raise ValueError(
            f"shape mismatch: logits {logits.shape}, seen {seen.shape}, penalty {pen.shape}"
        )
    hit = seen & on[:, None]
    pos = logits > 0
    col = pen[:, None]
    np.divide(logits, col, out=logits, where=hit & pos)
    np.multiply(logits, col, out=logits, where=hit & ~pos)


# -- vectorised sampler ----------------------------------------------------------------


class SamplerWorkspace:
    """Scratch buffers reused by :func:`sample_rows` across calls.

    The sampler needs an (N, V) float32 copy to partition and an (N, V) bool
    comparison mask; for 64 streams x 32 codebooks that is 8 MB + 2 MB per
    step. Reusing them keeps the step free of large allocations (and of the
    page faults a fresh multi-megabyte allocation costs). Buffers grow on
    demand and are never shrunk.
    """

    def __init__(self) -> None:
        self._f32 = np.empty(0, dtype=np.float32)
        self._rows = np.empty(0, dtype=np.float32)
        self._mask = np.empty(0, dtype=bool)

    def rows(self, n: int, v: int) -> np.ndarray:
        """An (n, v) float32 buffer for the caller's rows (never the one ``floats`` returns)."""
        if self._rows.size < n * v:
            self._rows = np.empty(n * v, dtype=np.float32)
        return self._rows[: n * v].reshape(n, v)

    def floats(self, n: int, v: int) -> np.ndarray:
        if self._f32.size < n * v:
            self._f32 = np.empty(n * v, dtype=np.float32)
        return self._f32[: n * v].reshape(n, v)

    def mask(self, n: int, v: int) -> np.ndarray:
        if self._mask.size < n * v:
            self._mask = np.empty(n * v, dtype=bool)
        return self._mask[: n * v].reshape(n, v)


RowSampler = Callable[..., npt.NDArray[np.int64]]
"""What :class:`~streamtts.core.delay_state.DelayStates` calls to sample: :func:`sample_rows`
(whose signature it has) or a faster implementation of the same specification (same tokens for the same
uniforms). One that reads strided rows (the compiled one; ``DelayStates(strided_rows=True)``)
also takes ``logits`` with more than two axes and any row strides (rows numbered over the
leading axes, last axis contiguous), so strided views reach it without a copy."""


CHUNK_ROWS = 1024
"""sample_rows works on at most this many rows at a time (4 MB of 1025-wide logits)."""


def _effective_k(top_k: np.ndarray, v: int) -> np.ndarray:
    k = np.asarray(top_k, dtype=np.int64)
    return np.where((k <= 0) | (k > v), v, k)


def sample_rows(
    logits: np.ndarray,
    temperature: np.ndarray,
    top_k: np.ndarray,
    top_p: np.ndarray,
    u: np.ndarray,
    *,
    rows: np.ndarray | None = None,
    seen: np.ndarray | None = None,
    penalty: np.ndarray | None = None,
    out: np.ndarray | None = None,
    workspace: SamplerWorkspace | None = None,
) -> np.ndarray:
    """Sample one token per row of ``logits`` (N, V) float32: (M,) int64.

    ``rows`` (M,) selects distinct rows to sample (default: all N, M = N);
    the per-row arguments then have length M and follow ``rows``: the
    ``temperature`` (0 = greedy), ``top_k`` (0 = off), ``top_p`` and uniform
    ``u`` in [0, 1). ``seen`` (M, V) bool with ``penalty`` (M,) apply the
    repetition penalty after the temperature, as the official pipeline does.
    ``logits`` is modified in place (temperature, penalty); rows not selected
    keep their values.

    Cost: one in-place scaling pass, one copy of the sampled rows (into the
    workspace) that is partitioned for the top-k values, one comparison pass
    to find the chosen value's token id; indices are never materialised for
    the whole vocabulary. Pass a :class:`SamplerWorkspace` to reuse the scratch
    buffers between calls.
    """
    if logits.ndim != 2 or logits.dtype != np.float32:
        raise TypeError(f"logits must be 2-D float32, got {logits.dtype} {logits.shape}")
    n_all, v = logits.shape
    sel = np.arange(n_all) if rows is None else np.asarray(rows, dtype=np.intp)
    n = sel.shape[0]
    if out is None:
        out = np.empty(n, dtype=np.int64)
    if n == 0:
        return out
    if n > CHUNK_ROWS:
        # Rows are independent: in pieces whose scratch fits a core's cache, the passes
        # below (scale, copy, partition, compare) run from cache instead of memory.
        failed: list[int] = []
        for a in range(0, n, CHUNK_ROWS):
            b = min(a + CHUNK_ROWS, n)
            piece_logits = logits[a:b] if rows is None else logits
            try:
                sample_rows(
                    piece_logits, np.asarray(temperature)[a:b], np.asarray(top_k)[a:b],
                    np.asarray(top_p)[a:b], np.asarray(u)[a:b], rows=None if rows is None else sel[a:b],
                    seen=None if seen is None else seen[a:b],
                    penalty=None if penalty is None else np.asarray(penalty)[a:b],
                    out=out[a:b], workspace=workspace,
                )  # fmt: skip
            except NonFiniteLogitsError as exc:  # every bad row is named, as in one piece
                failed += [a + r for r in exc.rows]
        if failed:
            raise NonFiniteLogitsError(failed)
        return out
    if v == 0:
        raise ValueError("logits have no columns")
    every_row = n == n_all and (rows is None or bool(np.all(sel == np.arange(n_all))))
    temp = np.asarray(temperature, dtype=np.float32)
    greedy = ~(temp > 0)
    scale = np.where(greedy, np.float32(1.0), temp)
    if np.any(scale != np.float32(1.0)):
        if every_row and bool(np.all(scale == scale[0])):
            logits /= scale[0]  # one temperature for all (the usual case): a faster pass
        elif every_row:
            logits /= scale[:, None]
        else:  # only the selected rows (a pass over all of them would cost the most)
            sub = logits[sel]
            sub /= scale[:, None]
            logits[sel] = sub
    if penalty is not None:
        if seen is None:
            raise ValueError("penalty needs seen")
        if every_row:
            apply_repetition_penalty(logits, seen, penalty)
        elif np.any(np.asarray(penalty) != 1.0):
            sub = logits[sel]
            apply_repetition_penalty(sub, seen, penalty)
            logits[sel] = sub

    n_greedy = int(np.count_nonzero(greedy))
    bad_greedy: np.ndarray | None = None  # named with the sampled rows' bad ones: every bad row
    if n_greedy:
        gi = np.flatnonzero(greedy)
        if every_row and n_greedy == n:
            best = logits.argmax(axis=1)
        else:
            best = logits[sel[gi]].argmax(axis=1)
        best_val = logits[sel[gi], best]
        bad = ~(best_val > -np.inf)  # NaN (argmax returns the first NaN) or all masked
        if bad.any():
            bad_greedy = gi[bad]
        out[gi] = best
        if n_greedy == n:
            if bad_greedy is not None:
                raise NonFiniteLogitsError(bad_greedy)
            return out

    si = np.flatnonzero(~greedy)  # positions in the selection
    src = sel[si]  # logits rows
    m_rows = si.size
    all_sampled = m_rows == n_all and every_row
    ks = _effective_k(np.asarray(top_k)[si], v)
    kmax = int(ks.max())

    # Top-kmax values of each sampled row, descending. The sampled rows are
    # copied once (into the workspace) and partitioned there in place.
    ws = workspace if workspace is not None else SamplerWorkspace()
    work = ws.floats(m_rows, v)
    if all_sampled:
        np.copyto(work, logits)
    else:
        np.take(logits, src, axis=0, out=work, mode="clip")  # valid rows; "clip" skips a buffered copy
    if kmax < v:
        work.partition(v - kmax, axis=1)
        top = np.sort(work[:, v - kmax :], axis=1)[:, ::-1]
    else:
        work.sort(axis=1)
        top = work[:, ::-1]

    topd = top.astype(np.float64)
    topd[np.arange(kmax)[None, :] >= ks[:, None]] = -np.inf
    mx = topd[:, 0].copy()
    bad = ~np.isfinite(mx)
    if bad.any() or bad_greedy is not None:
        raise NonFiniteLogitsError(np.union1d(si[bad], bad_greedy if bad_greedy is not None else si[:0]))
    np.subtract(topd, mx[:, None], out=topd)
    w = np.exp(topd, out=topd)
    c = np.cumsum(w, axis=1)
    n_pos = np.count_nonzero(w > 0, axis=1)

    p = np.asarray(top_p, dtype=np.float64)[si]
    nucleus = p < 1.0
    if nucleus.any() and kmax > 1:
        cum_before = c[:, :-1] / c[:, -1:]
        n_keep = 1 + np.count_nonzero(cum_before <= p[:, None], axis=1)
        n_pos = np.where(nucleus, np.minimum(n_pos, n_keep), n_pos)

    r = np.arange(m_rows)
    last = n_pos - 1
    x = np.asarray(u, dtype=np.float64)[si] * c[r, last]
    j = np.minimum(np.count_nonzero(c <= x[:, None], axis=1), last)
    val = top[r, j]
    # Rank of the chosen candidate among equal values: ties are ordered by id.
    tie = j - np.argmax(top == val[:, None], axis=1)

    # The chosen value's token id: one comparison pass over the (scaled) rows.
    # When most rows are sampled, compare in place over all rows (the others
    # compare against NaN, which matches nothing); else over a small gather.
    if 2 * m_rows >= n_all:
        target = val if all_sampled else np.full(n_all, np.nan, dtype=np.float32)
        if not all_sampled:
            target[src] = val
        eq = ws.mask(n_all, v)
        np.equal(logits, target[:, None], out=eq)
        ids = eq.argmax(axis=1)
        if not all_sampled:
            ids = ids[src]
    else:
        ids = (logits[src] == val[:, None]).argmax(axis=1)
    for q in np.flatnonzero(tie):
        ids[q] = np.flatnonzero(logits[src[q]] == val[q])[tie[q]]
    out[si] = ids
    return out


# -- the plain sampler, row by row (tests / conformance) ------------------------------------------


def sample_rows_plain(
    logits: np.ndarray,
    temperature: np.ndarray,
    top_k: np.ndarray,
    top_p: np.ndarray,
    u: np.ndarray,
    *,
    prev_tokens: Sequence[Sequence[int]] | None = None,
    penalty: np.ndarray | None = None,
) -> np.ndarray:
    """Row-by-row, deliberately plain version of :func:`sample_rows`.

    Follows the official order of operations literally on one row at a time
    (full sort of the vocabulary, explicit keep list for top-p) with the same
    canonical candidate order and inverse-CDF draw, so for the same ``u`` it
    must return the same tokens. ``prev_tokens[r]`` is row r's history for the
    repetition penalty. Does not modify ``logits``. Slow; for tests only.
    """
    n, v = logits.shape
    out = np.empty(n, dtype=np.int64)
    for r in range(n):
        x = np.array(logits[r], dtype=np.float32, copy=True)
        t = float(temperature[r])
        greedy = not (t > 0)
        x = x / np.float32(1.0 if greedy else t)
        if penalty is not None and prev_tokens is not None:
            pen = np.float32(penalty[r])
            if pen != np.float32(1.0):
                for tok in sorted({int(a) for a in prev_tokens[r]}):
                    if 0 <= tok < v:
                        x[tok] = x[tok] / pen if x[tok] > 0 else x[tok] * pen
        if greedy:
            best = 0
            for i in range(1, v):
                if x[i] > x[best]:
                    best = i
            if not x[best] > -np.inf:
                raise NonFiniteLogitsError([r])
            out[r] = best
            continue
        order = sorted(range(v), key=lambda i: (-float(x[i]), i))
        kk = int(top_k[r])
        k = v if kk <= 0 or kk > v else kk
        cand = order[:k]
        vals = np.array([float(x[i]) for i in cand], dtype=np.float64)
        if not np.isfinite(vals[0]):
            raise NonFiniteLogitsError([r])
        w = np.exp(vals - vals[0])
        if float(top_p[r]) < 1.0:
            cum = np.cumsum(w)
            probs_cum = cum / cum[-1]
            keep = [True] + [bool(probs_cum[q - 1] <= float(top_p[r])) for q in range(1, k)]
            w = np.where(keep, w, 0.0)
        cum = np.cumsum(w)
        positive = [q for q in range(k) if w[q] > 0]
        last = positive[-1]
        target = float(u[r]) * cum[last]
        chosen = last
        for q in positive:
            if cum[q] > target:
                chosen = q
                break
        out[r] = cand[chosen]
    return out
