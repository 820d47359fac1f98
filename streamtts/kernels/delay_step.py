"""The compiled ``DelayStates.step`` (``native/delay.c``) on buffers bound once: a step is one call.

:class:`~streamtts.core.delay_state.DelayStates` stays the specification; this is its twin for
the steps that need no full text row (every stream in audio mode, flushing its delay, or
stopped), which is nearly every step. It reads and writes the states' own arrays, draws the
same counter uniforms and samples with ``native/sampler.c``'s row sampler, so a stream's
rows and state come out as the spec's (``tests/kernels/test_conformance.py``). A step with a
stream outside audio mode changes nothing in C and goes to the spec entry it was given, once.
Why bound: after a decode every Python and NumPy call runs on cold caches, and the checks and
address lookups of a general call cost about 0.1 ms a step there (measured in the engine).
"""

from __future__ import annotations

import ctypes

import numpy as np

from ..core.sampling import AUDIO_STREAM, TEXT_STREAM, stream_salt
from ..errors import NativeLibraryError, NonFiniteLogitsError
from ..model._llama import SttDelayStates, ptr
from .entries import Unreadable, check_range
from .spec import SpecDelayStep
from .tick_pool import TickPool

_DONE, _NEEDS_TEXT, _BAD_SLOTS, _BAD_TEXT, _BAD_AUDIO = 0, 1, 2, 3, 4


def _check_seen_rows(lib: ctypes.CDLL, rows: int) -> None:
    """The bridge indexes ``seen`` as the states hold it (rows per slot), or it is refused."""
    fn = getattr(lib, "stt_delay_seen_rows", None)
    if fn is not None:
        fn.restype = ctypes.c_int32
        fn.argtypes = []
    got = int(fn()) if fn is not None else None
    if got != rows:
        raise NativeLibraryError(
            f"the llama.cpp bridge keeps {got or 'one per codebook'} penalty histories per stream, "
            f"streamtts {rows}: it was built from older sources; rebuild it with native/build.sh"
        )


class DelayStepTwin:
    """``native/delay.c``'s step of one :class:`DelayStates` on the caller's buffers: a step
    of the slots in ``slots[lo:hi]`` reads rows ``[lo, hi)`` of ``pair`` (R, 2) and ``audio``
    (R, K, A) float32 and writes rows ``[lo, hi)`` of ``out`` (R, 1 + K) int64. With a
    ``pool``, the engine's call (``lo`` = 0) is cut into chunks run on the pool's threads."""

    compiled = True

    def __init__(self, lib: ctypes.CDLL, spec: SpecDelayStep, pool: TickPool | None = None) -> None:
        states, slots, pair, audio, out = spec.states, spec.slots, spec.pair, spec.audio, spec.out
        k, a = states.n_vq, states.n_audio
        r = slots.shape[0] if slots.ndim == 1 else -1
        if slots.dtype != np.int64 or not slots.flags.c_contiguous:
            raise Unreadable(f"slots must be a contiguous 1-D int64 array, got {slots.dtype} {slots.shape}")
        if pair.shape != (r, 2) or audio.shape != (r, k, a) or out.shape != (r, 1 + k) or out.dtype != np.int64:
            raise Unreadable(f"buffers of {r} rows must be pair ({r}, 2), audio ({r}, {k}, {a}), out int64 ({r}, {1 + k})")
        if not _readable(pair, audio, out):
            raise Unreadable("logits must be float32 with whole-element strides and rows out contiguous")
        _check_seen_rows(lib, states.seen.shape[1])
        arrays = {
            "audio_length": (states.audio_length, np.int64),
            "delayed_length": (states.delayed_length, np.int64),
            "time_step": (states.time_step, np.int64),
            "is_audio": (states.is_audio, np.bool_),
            "is_stopping": (states.is_stopping, np.bool_),
            "audio_ended": (states.audio_ended, np.bool_),
            "seed": (states.seed, np.uint64),
            "text_temperature": (states.text_temperature, np.float32),
            "text_top_k": (states.text_top_k, np.int64),
            "text_top_p": (states.text_top_p, np.float64),
            "audio_temperature": (states.audio_temperature, np.float32),
            "audio_top_k": (states.audio_top_k, np.int64),
            "audio_top_p": (states.audio_top_p, np.float64),
            "audio_penalty": (states.audio_penalty, np.float32),
            "seen": (states.seen, np.bool_),
        }
        for name, (arr, dtype) in arrays.items():
            if arr.dtype != dtype or not arr.flags.c_contiguous:  # a change in DelayStates
                raise TypeError(f"DelayStates.{name} must be contiguous {np.dtype(dtype)}, got {arr.dtype}")
        ids = states.ids
        self._capacity = states.capacity
        self._mark = np.zeros(states.capacity, dtype=np.uint8)
        self._bad = np.zeros(r, dtype=np.uint8)
        # room for one sorted row per bound row (rows with top-k > 256 or off): a call on a
        # range of rows uses its first row's, so calls on disjoint ranges share nothing
        self._scratch_row = 16 * a
        self._scratch = np.zeros(max(r, 1) * self._scratch_row, dtype=np.uint8)
        self._struct = SttDelayStates(
            capacity=states.capacity, n_vq=k, n_audio=a, pair_swapped=int(ids.gen_slot > ids.delay_slot),
            pad=ids.pad, gen_slot=ids.gen_slot, delay_slot=ids.delay_slot, audio_start=ids.audio_start,
            audio_end=ids.audio_end, im_end=ids.im_end, audio_pad_code=ids.audio_pad_code,
            text_salt=stream_salt(TEXT_STREAM), audio_salt=stream_salt(AUDIO_STREAM), mark=ptr(self._mark),
            **{name: ptr(arr) for name, (arr, _) in arrays.items()},
        )  # fmt: skip
        self._keep = (states, slots, pair, audio, out)  # what the addresses point into
        self._ref = ctypes.byref(self._struct)
        self._fn = lib.stt_delay_step
        self._pooled = lib.stt_pool_delay_step
        self._pool = pool
        self._codes = TickPool.chunk_codes(r)
        self._codes_p = ptr(self._codes)
        self.spec = spec
        """The spec entry on the same buffers (the steps C hands back)."""
        self._slots = slots
        self._rows = r
        # each buffer's address and the bytes from one row to the next
        bufs = (slots, pair, audio, out, self._scratch, self._bad)
        self._at0 = self._bound_at = tuple(int(ptr(x) or 0) for x in bufs)
        self._row_bytes = tuple(x.strides[0] for x in bufs[:4]) + (self._scratch_row, 1)
        self._strides = (pair.strides[0] // 4, audio.strides[0] // 4, audio.strides[1] // 4)
        self.handed_back = 0
        """Steps that went to the spec (a stream outside audio mode)."""
        # rows lent by the backbone (read_logits_at): the pair and audio logits of one row lie
        # in one block of row_bytes, at these offsets, as in the bound rows
        self._row = pair.strides[0]
        self._audio_off = self._bound_at[2] - self._bound_at[1]
        self.reads_lent = bool(
            r > 0 and audio.strides[0] == self._row and audio.strides[1] == 4 * a
            and 2 * 4 <= self._audio_off and self._audio_off + 4 * k * a <= self._row
        )  # fmt: skip
        self._lent = 0
        self._lent_pairs: dict[int, np.ndarray] = {}

    def __call__(self, lo: int, hi: int) -> None:
        pool = self._pool
        if pool is not None and not lo and hi <= self._rows:
            chunk = pool.chunk_rows(hi)
            if chunk:
                self._run_pooled(pool, hi, chunk)
                return
        if not self.try_compiled(lo, hi):
            self._hand_back(lo, hi)

    def read_logits_at(self, address: int) -> None:
        """The next steps read their pair and audio logits from the rows at ``address``, laid
        out as the bound rows (a backbone's output rows, lent: not copied); 0: from the bound
        buffers again. The caller keeps those rows alive and unchanged while it steps."""
        if address and not self.reads_lent:
            raise ValueError("the bound pair and audio logits are not one block of rows: lent rows cannot be read")
        self._lent = address
        s, _, _, o, sc, bd = self._bound_at
        self._at0 = (s, address, address + self._audio_off, o, sc, bd) if address else self._bound_at

    def pair_logits(self, rows: int) -> np.ndarray:
        if not self._lent:
            return self.spec.pair[:rows]
        view = self._lent_pairs.get(self._lent)
        if view is None:  # kept for the last two addresses: a backbone lends the same rows each tick
            floats = ((self._rows - 1) * self._row + 8) // 4
            flat = np.ctypeslib.as_array((ctypes.c_float * floats).from_address(self._lent))
            view = np.lib.stride_tricks.as_strided(flat, (self._rows, 2), (self._row, 4))
            if len(self._lent_pairs) >= 2:
                self._lent_pairs.pop(next(iter(self._lent_pairs)))
            self._lent_pairs[self._lent] = view
        return view[:rows]

    def audio_logits(self, rows: int) -> np.ndarray:
        if not self._lent or not rows:
            return self.spec.audio[:rows]
        k, a = self.spec.audio.shape[1:]  # lent rows: as pair_logits, at the audio's offset
        floats = ((rows - 1) * self._row + 4 * k * a) // 4
        flat = np.ctypeslib.as_array((ctypes.c_float * floats).from_address(self._lent + self._audio_off))
        return np.lib.stride_tricks.as_strided(flat, (rows, k, a), (self._row, 4 * a, 4))

    def _hand_back(self, lo: int, hi: int) -> None:
        """Rows ``[lo, hi)`` to the spec, which reads the bound buffers: lent rows copied there first."""
        if self._lent:
            at, n = lo * self._row, (hi - lo) * self._row
            ctypes.memmove(self._bound_at[1] + at, self._lent + at, n)
        self.spec(lo, hi)

    def try_compiled(self, lo: int, hi: int) -> bool:
        """The step of rows ``[lo, hi)`` in C; False when a stream there is outside audio mode
        (nothing changed: the caller runs :attr:`spec` on the range). Calls on disjoint ranges
        may run at once (each row has its own scratch; the GIL is released)."""
        if not 0 <= lo <= hi <= self._rows:
            check_range(lo, hi, self._rows)
        s, p, au, o, sc, bd = self._at0  # the engine's call (lo = 0): the addresses as bound
        if lo:
            s_b, p_b, au_b, o_b, sc_b, bd_b = self._row_bytes
            s, p, au, o, sc, bd = s + lo * s_b, p + lo * p_b, au + lo * au_b, o + lo * o_b, sc + lo * sc_b, bd + lo * bd_b
        ps, ab, ak = self._strides
        done = self._outcome(self._fn(self._ref, s, hi - lo, p, ps, au, ab, ak, o, sc, bd), lo, hi)
        self.handed_back += not done  # a plain int: a lost count between threads is harmless
        return done

    def _run_pooled(self, pool: TickPool, b: int, chunk: int) -> None:
        """Rows ``[0, b)`` in chunks of ``chunk`` rows on the pool's threads; a chunk with a
        stream outside audio mode then goes to the spec (after every error is raised)."""
        s, p, au, o, sc, bd = self._at0
        ps, ab, ak = self._strides
        pool.parallel_runs += 1
        failed = self._pooled(pool.handle, chunk, self._codes_p, self._ref, s, b, p, ps, au, ab, ak, o, sc, self._scratch_row, bd)
        if not failed:
            return
        if failed < 0:
            raise RuntimeError(f"stt_pool_delay_step returned {failed}")  # cannot happen: chunk >= 1, scratch given
        cuts = [(lo, min(b, lo + chunk)) for lo in range(0, b, chunk)]
        codes = self._codes[: len(cuts)].tolist()
        handed = [(lo, hi) for (lo, hi), rc in zip(cuts, codes, strict=True) if not self._outcome(rc, lo, hi)]
        self.handed_back += bool(handed)  # a step, however many of its chunks
        for lo, hi in handed:
            self._hand_back(lo, hi)

    def _outcome(self, rc: int, lo: int, hi: int) -> bool:
        """True for a step done; False for one handed back (nothing changed); raises for a bad one."""
        if rc == _DONE:
            return True
        if rc == _NEEDS_TEXT:
            return False
        slots = self._slots[lo:hi]
        if rc == _BAD_SLOTS:
            raise ValueError(f"slots must be distinct and in [0, {self._capacity}), got {slots.tolist()}")
        bad = np.flatnonzero(self._bad[lo:hi])
        if rc == _BAD_TEXT:
            raise NonFiniteLogitsError(slots[bad], "text of slots")
        if rc == _BAD_AUDIO:
            raise NonFiniteLogitsError(np.unique(slots[bad]), "audio of slots")
        raise RuntimeError(f"stt_delay_step returned {rc}")  # cannot happen: scratch is always given


def _readable(pair: np.ndarray, audio: np.ndarray, out: np.ndarray) -> bool:
    """Logits in float32 with whole-element strides and contiguous rows out: what the C step reads."""
    return not (
        pair.dtype != np.float32
        or audio.dtype != np.float32
        or pair.strides[-1] != 4
        or audio.strides[-1] != 4
        or pair.strides[0] % 4
        or audio.strides[0] % 4
        or audio.strides[1] % 4
        or not out.flags.c_contiguous
    )
