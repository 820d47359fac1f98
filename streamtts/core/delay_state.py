"""The MOSS-TTS-Delay generation state machine, vectorised over stream slots.

Contract section 4 describes one sequence's state and step. :class:`DelayStates`
keeps that state for every stream slot as flat arrays (struct of arrays) so
that one :meth:`DelayStates.step` call advances all running streams with a
few NumPy operations: no Python loop over codebooks, and a loop over slots
only for the rare rows that need the full text vocabulary (outside audio
mode, e.g. right after ``<|audio_end|>``).

In audio mode the text channel can only be the gen slot or the delay slot,
so the engine passes just those two text logits per stream (``text_pair_logits``);
sampling from the pair with the same temperature / top-k / top-p gives the
same distribution as the official full-vocabulary masked sampling (masked
tokens get probability 0 and sort after the two finite candidates), and with
the canonical candidate order even the same token for the same uniform.

:func:`official_step` is the plain single-sequence transcription of the
official step, kept next to the vectorised one so tests (and the engine's
conformance test) can check :meth:`DelayStates.step` row for row.

The repetition penalty follows the checkpoint's ``sample_token`` (every member's
``modeling_moss_tts.py``; its ``apply_repetition_penalty_delay_pattern`` gets 2-D logits
for both calls): codebook 0 is penalised by the codes its column holds over the whole
sequence, prompt included; codebooks 1..K-1 share one history, the codes of all their
columns. ``seen`` keeps those two histories per slot.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..config import SamplingParams
from ..errors import InputError, NonFiniteLogitsError
from .sampling import (
    AUDIO_STREAM,
    TEXT_STREAM,
    RowSampler,
    SamplerWorkspace,
    counter_uniforms,
    sample_rows,
    sample_rows_plain,
    seed_to_uint64,
)
from .tokens import TokenIds

NONE = -1
"""``delayed_length`` sentinel: no delay flush in progress."""


def _check_prompt(prompt: np.ndarray, ids: TokenIds) -> np.ndarray:
    p = np.asarray(prompt)
    k = ids.n_vq
    if p.ndim != 2 or p.shape[1] != 1 + k or p.shape[0] < 1:
        raise InputError(f"prompt must be a non-empty (S, {1 + k}) matrix, got shape {p.shape}")
    if not np.issubdtype(p.dtype, np.integer):
        raise InputError(f"prompt must be an integer matrix, got {p.dtype}")
    codes = p[:, 1:]
    if codes.size and (codes.min() < 0 or codes.max() >= ids.audio_rows):
        raise InputError(f"prompt audio codes must be in [0, {ids.audio_rows - 1}]")
    return p


def _initial_audio(text: np.ndarray, ids: TokenIds) -> tuple[int, bool]:
    """(audio_length, is_audio) from the prompt's text column (official init)."""
    last = int(text[-1])
    if last in (ids.audio_start, ids.gen_slot):
        starts = np.flatnonzero(text == ids.audio_start)
        if starts.size:
            return int(text.shape[0] - starts[-1]), True
    return 0, False


class DelayStates:
    """Delay state of up to ``capacity`` streams, one slot each.

    Public arrays (index by slot; read them, don't write them):
    ``audio_length``, ``delayed_length`` (:data:`NONE` when no flush runs),
    ``is_audio``, ``is_stopping`` (also true for slots never reset),
    ``audio_ended`` (the last step of this slot emitted ``<|audio_end|>``),
    ``time_step``; per-slot sampling parameters; ``seen`` (capacity, 2, A)
    bool, the repetition penalty's histories (prompt included): ``[:, 0]`` the codes of
    codebook 0's column, ``[:, 1]`` those of codebooks 1..K-1's columns together (the
    checkpoint's ``sample_token`` pools them).

    ``sampler``: :func:`~streamtts.core.sampling.sample_rows` (the default) or another
    implementation of it (``streamtts.kernels`` passes the compiled one); with
    ``strided_rows`` (a sampler that reads strided rows, see :class:`RowSampler`) it gets
    the audio logits as handed in, uncopied. This is the specification of the compiled step
    (``kernels/delay_step.py``), which the engine reaches through ``streamtts.kernels``.
    """

    def __init__(
        self, capacity: int, ids: TokenIds, sampler: RowSampler | None = None, *, strided_rows: bool = False
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.ids = ids
        self._sample: RowSampler = sampler if sampler is not None else sample_rows
        self._strided = strided_rows
        k = self.n_vq = ids.n_vq
        a = self.n_audio = ids.audio_rows
        self.audio_length = np.zeros(capacity, dtype=np.int64)
        self.delayed_length = np.full(capacity, NONE, dtype=np.int64)
        self.is_audio = np.zeros(capacity, dtype=bool)
        self.is_stopping = np.ones(capacity, dtype=bool)
        self.audio_ended = np.zeros(capacity, dtype=bool)
        self.time_step = np.zeros(capacity, dtype=np.int64)
        self.text_temperature = np.zeros(capacity, dtype=np.float32)
        self.text_top_k = np.zeros(capacity, dtype=np.int64)
        self.text_top_p = np.ones(capacity, dtype=np.float64)
        self.audio_temperature = np.zeros(capacity, dtype=np.float32)
        self.audio_top_k = np.zeros(capacity, dtype=np.int64)
        self.audio_top_p = np.ones(capacity, dtype=np.float64)
        self.audio_penalty = np.ones(capacity, dtype=np.float32)
        self.seed = np.zeros(capacity, dtype=np.uint64)
        self.seen = np.zeros((capacity, 2, a), dtype=bool)
        self._u_text = np.empty((capacity, 1), dtype=np.float64)
        self._u_audio = np.empty((capacity, k), dtype=np.float64)
        self._k = np.arange(k, dtype=np.int64)
        self._history = np.minimum(self._k, 1)  # codebook -> its row of seen
        self._workspace = SamplerWorkspace()
        # Pair columns in token-id order, so that ties break like the
        # full-vocabulary argmax (first id) and candidates order canonically.
        self._pair_swapped = ids.gen_slot > ids.delay_slot
        self._pair_ids = np.array(sorted((ids.gen_slot, ids.delay_slot)), dtype=np.int64)
        self._delay_col = int(np.flatnonzero(self._pair_ids == ids.delay_slot)[0])
        self._text_banned = np.array(
            [ids.pad, ids.gen_slot, ids.delay_slot, ids.audio_end], dtype=np.int64
        )

    # -- lifecycle --------------------------------------------------------------------

    def reset(self, slot: int, prompt: np.ndarray, sampling: SamplingParams, seed: int) -> None:
        """Start a stream in ``slot`` from its (S, 1 + K) prompt, as the official init.

        ``audio_length`` is the number of rows since the last ``<|audio_start|>``
        when the prompt ends with ``<|audio_start|>`` or the gen slot (then
        ``is_audio``); the prompt's audio columns seed the penalty history.
        """
        if not 0 <= slot < self.capacity:
            raise IndexError(f"slot {slot} out of range [0, {self.capacity})")
        p = _check_prompt(prompt, self.ids)  # ``sampling`` was checked once, at the front door
        al, isa = _initial_audio(p[:, 0], self.ids)
        self.audio_length[slot] = al
        self.is_audio[slot] = isa
        self.delayed_length[slot] = NONE
        self.is_stopping[slot] = False
        self.audio_ended[slot] = False
        self.time_step[slot] = 0
        self.text_temperature[slot] = sampling.text_temperature
        self.text_top_k[slot] = sampling.text_top_k
        self.text_top_p[slot] = sampling.text_top_p
        self.audio_temperature[slot] = sampling.audio_temperature
        self.audio_top_k[slot] = sampling.audio_top_k
        self.audio_top_p[slot] = sampling.audio_top_p
        self.audio_penalty[slot] = sampling.audio_repetition_penalty
        self.seed[slot] = seed_to_uint64(seed)
        seen = self.seen[slot]
        seen[...] = False
        seen[self._history[None, :], p[:, 1:]] = True

    # -- the step ---------------------------------------------------------------------

    def step(
        self,
        slots: np.ndarray,
        text_pair_logits: np.ndarray,
        audio_logits: np.ndarray,
        full_text_logits: Callable[[int], np.ndarray],
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        """Produce the next row ``[text, a_0 .. a_{K-1}]`` of each slot in ``slots``.

        ``slots`` (B,) distinct slot numbers. ``text_pair_logits`` (B, 2) float32:
        the logits of [gen slot, delay slot]. ``audio_logits`` (B, K, A) float32,
        modified in place (pad column; in steady state also temperature and penalty).
        ``full_text_logits(b)`` is called only for batch rows b whose text must
        be sampled outside audio mode; it returns that row's (V,) float32 text
        logits, which are modified in place. ``out`` (B, 1 + K) int64 receives
        the rows and is returned.

        If sampling raises (:class:`NonFiniteLogitsError`, naming slots), no
        state has been changed.
        """
        ids = self.ids
        k_n = self.n_vq
        s = np.asarray(slots, dtype=np.intp)
        b_n = s.shape[0]
        if s.ndim != 1:
            raise ValueError(f"slots must be 1-D, got shape {s.shape}")
        if text_pair_logits.shape != (b_n, 2):
            raise ValueError(f"text_pair_logits must be ({b_n}, 2), got {text_pair_logits.shape}")
        if audio_logits.shape != (b_n, k_n, self.n_audio) or audio_logits.dtype != np.float32:
            raise ValueError(
                f"audio_logits must be float32 ({b_n}, {k_n}, {self.n_audio}), "
                f"got {audio_logits.dtype} {audio_logits.shape}"
            )
        if out is None:
            out = np.empty((b_n, 1 + k_n), dtype=np.int64)
        elif out.shape != (b_n, 1 + k_n) or out.dtype != np.int64:
            raise ValueError(f"out must be int64 ({b_n}, {1 + k_n}), got {out.dtype} {out.shape}")
        if b_n == 0:
            return out
        if s.min() < 0 or s.max() >= self.capacity or np.unique(s).size != b_n:
            raise ValueError(
                f"slots must be distinct and in [0, {self.capacity}), got {s.tolist()}"
            )

        stop = self.is_stopping[s]
        active = ~stop
        al = self.audio_length[s]
        dl = self.delayed_length[s]
        ts = self.time_step[s]
        isa = self.is_audio[s]
        seeds = self.seed[s]
        counters = ts.astype(np.uint64)

        # ---- text -------------------------------------------------------------------
        forced_delay = active & (dl >= 0) & (dl < k_n)
        forced_end = active & (dl == k_n)
        free = active & ~forced_delay & ~forced_end
        text = out[:, 0]
        text[:] = ids.pad
        text[forced_delay] = ids.delay_slot
        text[forced_end] = ids.audio_end
        if free.any():
            u_text = counter_uniforms(seeds, counters, 1, TEXT_STREAM, out=self._u_text[:b_n])[:, 0]
            self._sample_text(s, free, isa, ts, text_pair_logits, full_text_logits, u_text, text)

        # ---- audio ------------------------------------------------------------------
        amask = (
            active[:, None] & (self._k[None, :] < al[:, None]) & (self._k[None, :] >= dl[:, None])
        )
        codes = out[:, 1:]
        codes[...] = ids.audio_pad_code
        n_s = int(np.count_nonzero(amask))
        if n_s:
            self._sample_audio(s, amask, n_s, seeds, counters, audio_logits, codes)

        # ---- updates (contract section 4 step 4) --------------------------------------
        is_start = text == ids.audio_start
        is_end = active & (text == ids.audio_end)
        grow = active & (is_start | (text == ids.gen_slot) | (text == ids.delay_slot))
        al = al + grow
        al[is_end] = 0
        dl = dl.copy()
        dl[active & (dl == NONE) & (text == ids.delay_slot)] = 0
        dl[active & (dl != NONE)] += 1
        dl[dl > k_n] = NONE
        self.audio_length[s] = al
        self.delayed_length[s] = dl
        self.is_audio[s] = (isa & ~forced_end) | (active & is_start)
        self.is_stopping[s] = stop | (active & (text == ids.im_end))
        self.audio_ended[s] = is_end
        self.time_step[s] = ts + active
        return out

    def _sample_text(
        self,
        s: np.ndarray,
        free: np.ndarray,
        isa: np.ndarray,
        ts: np.ndarray,
        pair_logits: np.ndarray,
        full_text_logits: Callable[[int], np.ndarray],
        u_text: np.ndarray,
        text: np.ndarray,
    ) -> None:
        ids = self.ids
        pair_rows = np.flatnonzero(free & isa)
        if pair_rows.size:
            lg = np.asarray(pair_logits, dtype=np.float32)[pair_rows]
            if self._pair_swapped:
                lg = np.ascontiguousarray(lg[:, ::-1])
            lg[ts[pair_rows] == 0, self._delay_col] = -np.inf
            ps = s[pair_rows]
            try:
                choice = self._sample(
                    lg,
                    self.text_temperature[ps],
                    self.text_top_k[ps],
                    self.text_top_p[ps],
                    u_text[pair_rows],
                )
            except NonFiniteLogitsError as exc:
                raise NonFiniteLogitsError(ps[list(exc.rows)], "text of slots") from exc
            text[pair_rows] = self._pair_ids[choice]
        for b in np.flatnonzero(free & ~isa):
            row = full_text_logits(int(b))
            if row.ndim != 1 or row.dtype != np.float32:
                raise ValueError(
                    f"full_text_logits must return 1-D float32, got {row.dtype} {row.shape}"
                )
            row[self._text_banned] = -np.inf
            if ts[b] <= self.n_vq:
                row[ids.im_end] = -np.inf
            sl = s[b : b + 1]
            try:
                tok = self._sample(
                    row[None, :],
                    self.text_temperature[sl],
                    self.text_top_k[sl],
                    self.text_top_p[sl],
                    u_text[b : b + 1],
                )
            except NonFiniteLogitsError as exc:
                raise NonFiniteLogitsError([int(sl[0])], "text of slots") from exc
            text[b] = tok[0]

    def _sample_audio(
        self,
        s: np.ndarray,
        amask: np.ndarray,
        n_s: int,
        seeds: np.ndarray,
        counters: np.ndarray,
        audio_logits: np.ndarray,
        codes: np.ndarray,
    ) -> None:
        b_n, k_n = amask.shape
        a_n = self.n_audio
        audio_logits[:, :, self.ids.audio_pad_code] = -np.inf
        u = counter_uniforms(seeds, counters, k_n, AUDIO_STREAM, out=self._u_audio[:b_n]).reshape(
            -1
        )
        temp = self.audio_temperature[s]
        top_k = self.audio_top_k[s]
        top_p = self.audio_top_p[s]
        pen = self.audio_penalty[s]
        use_pen = bool(np.any(pen != np.float32(1.0)))
        # Rows to sample: all B*K head rows in steady state (one (B*K, A) view, or one
        # copy when the rows are not evenly spaced: the fused heads' logits sit between text
        # columns); during a stream's first K - 1 steps and its delay flush only some,
        # gathered into one (rows, A) copy (no pass over the rows that are not sampled).
        # A strided sampler reads the rows where they are (no copy in either case).
        pick: np.ndarray | None = None
        if n_s == b_n * k_n:
            rb = np.repeat(np.arange(b_n), k_n)
            kk = np.tile(self._k, b_n)
            u_rows = u
            # a view when the rows are whole (B, K*A) rows; the fused heads' are not
            flat = audio_logits if self._strided else audio_logits.reshape(b_n * k_n, a_n)
        else:
            fi = np.flatnonzero(amask.reshape(-1))
            rb = fi // k_n
            kk = fi % k_n
            u_rows = u[fi]
            if self._strided:
                flat, pick = audio_logits, fi
            elif audio_logits.flags.c_contiguous:  # into a buffer kept for it (no allocation)
                flat = np.take(audio_logits.reshape(b_n * k_n, a_n), fi, axis=0, out=self._workspace.rows(fi.size, a_n), mode="clip")
            else:
                flat = audio_logits[rb, kk]
        hist = self._history[kk]
        seen_rows = self.seen[s[rb], hist] if use_pen else None
        try:
            sampled = self._sample(
                flat,
                temp[rb],
                top_k[rb],
                top_p[rb],
                u_rows,
                rows=pick,
                seen=seen_rows,
                penalty=pen[rb] if use_pen else None,
                workspace=self._workspace,
            )
        except NonFiniteLogitsError as exc:
            bad = np.unique(s[rb[list(exc.rows)]])
            raise NonFiniteLogitsError(bad, "audio of slots") from exc
        codes[amask] = sampled
        self.seen[s[rb], hist, sampled] = True


# -- the official step, transcribed (single sequence) ---------------------------------------------------


@dataclass
class OfficialState:
    """One sequence's state exactly as the contract/official code keeps it."""

    audio_length: int = 0
    delayed_length: int | None = None
    is_audio: bool = False
    is_stopping: bool = False
    time_step: int = 0
    text_history: list[int] = field(default_factory=list)
    audio_history: list[list[int]] = field(default_factory=list)


def official_init(prompt: np.ndarray, ids: TokenIds) -> OfficialState:
    """The official ``init_delay_state`` on a (S, 1 + K) prompt."""
    p = _check_prompt(prompt, ids)
    al, isa = _initial_audio(p[:, 0], ids)
    return OfficialState(
        audio_length=al,
        is_audio=isa,
        text_history=[int(t) for t in p[:, 0]],
        audio_history=[[int(c) for c in row] for row in p[:, 1:]],
    )


def official_step(
    state: OfficialState,
    text_logits: np.ndarray,
    audio_logits: np.ndarray,
    sampling: SamplingParams,
    seed: int,
    ids: TokenIds,
) -> np.ndarray:
    """One step of one sequence, transcribed from the contract / official step.

    ``text_logits`` (V,) full text vocabulary, ``audio_logits`` (K, A); neither
    is modified. Uses the same uniforms as :meth:`DelayStates.step`
    (``counter_uniforms(seed, time_step, ...)``) and :func:`sample_rows_plain`,
    with the checkpoint's histories for the repetition penalty (codebook 0's column; codebooks
    1..K-1's columns together). Slow; tests only.
    """
    k_n = ids.n_vq
    pad_code = ids.audio_pad_code
    if state.is_stopping:
        return np.array([ids.pad] + [pad_code] * k_n, dtype=np.int64)
    key = np.array([seed_to_uint64(seed)], dtype=np.uint64)
    ctr = np.array([state.time_step], dtype=np.uint64)

    dl = state.delayed_length
    if dl is not None and dl < k_n:
        next_text = ids.delay_slot
    elif dl is not None and dl == k_n:
        next_text = ids.audio_end
        state.is_audio = False
    else:
        scaled = np.array(text_logits, dtype=np.float32, copy=True)
        if not state.is_audio:
            for t in (ids.pad, ids.gen_slot, ids.delay_slot, ids.audio_end):
                scaled[t] = -np.inf
        else:
            allowed = np.zeros(scaled.shape[0], dtype=bool)
            allowed[[ids.gen_slot, ids.delay_slot]] = True
            scaled[~allowed] = -np.inf
        if state.time_step == 0:
            scaled[ids.delay_slot] = -np.inf
        if state.time_step <= k_n:
            scaled[ids.im_end] = -np.inf
        u = counter_uniforms(key, ctr, 1, TEXT_STREAM)[0]
        next_text = int(
            sample_rows_plain(
                scaled[None, :],
                np.array([sampling.text_temperature]),
                np.array([sampling.text_top_k]),
                np.array([sampling.text_top_p]),
                u,
            )[0]
        )
    if next_text == ids.audio_start:
        state.is_audio = True
    if next_text == ids.im_end:
        state.is_stopping = True

    next_audio = [pad_code] * k_n
    u_audio = counter_uniforms(key, ctr, k_n, AUDIO_STREAM)[0]
    for k in range(k_n):
        if k < state.audio_length and (dl is None or k >= dl):
            row = np.array(audio_logits[k], dtype=np.float32, copy=True)
            row[pad_code] = -np.inf
            history = [c for h in state.audio_history for c in (h[:1] if k == 0 else h[1:])]
            next_audio[k] = int(
                sample_rows_plain(
                    row[None, :],
                    np.array([sampling.audio_temperature]),
                    np.array([sampling.audio_top_k]),
                    np.array([sampling.audio_top_p]),
                    u_audio[k : k + 1],
                    prev_tokens=[history],
                    penalty=np.array([sampling.audio_repetition_penalty]),
                )[0]
            )

    if next_text in (ids.audio_start, ids.gen_slot, ids.delay_slot):
        state.audio_length += 1
    if next_text == ids.audio_end:
        state.audio_length = 0
    if state.delayed_length is None and next_text == ids.delay_slot:
        state.delayed_length = 0
    if state.delayed_length is not None:
        state.delayed_length += 1
        if state.delayed_length > k_n:
            state.delayed_length = None
    state.time_step += 1
    state.text_history.append(next_text)
    state.audio_history.append(next_audio)
    return np.array([next_text, *next_audio], dtype=np.int64)
