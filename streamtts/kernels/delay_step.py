"""The compiled ``DelayStates.step`` (``native/delay.c``): a whole step in one call.

:class:`~streamtts.core.delay_state.DelayStates` stays the specification; this is its twin for
the steps that need no full text row (every stream in audio mode, flushing its delay, or
stopped), which is nearly every step. It reads and writes the states' own arrays (bound
once), draws the same counter uniforms and samples with ``native/sampler.c``'s row
sampler, so a stream's rows and state come out as the Python step's
(``tests/kernels/test_delay_step.py``). :class:`~streamtts.kernels.sampler.NativeSampler` hands it
to ``DelayStates``, so ``sampler: native`` (the default) uses it and ``sampler: numpy``
does not.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

import numpy as np

from ..core.sampling import AUDIO_STREAM, TEXT_STREAM, stream_salt
from ..errors import NonFiniteLogitsError
from ..model._llama import SttDelayStates, load_bridge
from ..model._llama import ptr as _ptr

if TYPE_CHECKING:
    from ..core.delay_state import DelayStates

_DONE, _NEEDS_TEXT, _BAD_SLOTS, _BAD_TEXT, _BAD_AUDIO = 0, 1, 2, 3, 4


class CompiledDelayStep:
    """Bound to one :class:`DelayStates`' arrays; ``__call__`` is its step's fast path."""

    def __init__(self, states: DelayStates) -> None:
        ids = states.ids
        self._states = states  # owns the arrays the struct points into
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
        for name, (a, dtype) in arrays.items():
            if a.dtype != dtype or not a.flags.c_contiguous:  # a change in DelayStates
                raise TypeError(f"DelayStates.{name} must be contiguous {np.dtype(dtype)}, got {a.dtype}")
        self._mark = np.zeros(states.capacity, dtype=np.uint8)
        self._bad = np.zeros(states.capacity, dtype=np.uint8)
        self._scratch = np.zeros(16 * states.n_audio, dtype=np.uint8)  # rows with top-k > 256 or off
        self._struct = SttDelayStates(
            capacity=states.capacity,
            n_vq=ids.n_vq,
            n_audio=states.n_audio,
            pair_swapped=int(ids.gen_slot > ids.delay_slot),
            pad=ids.pad,
            gen_slot=ids.gen_slot,
            delay_slot=ids.delay_slot,
            audio_start=ids.audio_start,
            audio_end=ids.audio_end,
            im_end=ids.im_end,
            audio_pad_code=ids.audio_pad_code,
            text_salt=stream_salt(TEXT_STREAM),
            audio_salt=stream_salt(AUDIO_STREAM),
            mark=_ptr(self._mark),
            **{name: _ptr(a) for name, (a, _) in arrays.items()},
        )
        self._ref = ctypes.byref(self._struct)
        self._fn = load_bridge().stt_delay_step

    def __call__(self, slots: np.ndarray, pair: np.ndarray, audio: np.ndarray, out: np.ndarray) -> bool:
        """Step ``slots`` (shapes already checked by the caller); False when this step needs
        the Python one (a stream outside audio mode, or logits in a layout it does not read),
        with nothing changed."""
        if not _readable(pair, audio, out):
            return False
        s = np.ascontiguousarray(slots, dtype=np.int64)
        n = s.shape[0]
        rc = self._fn(
            self._ref, _ptr(s), n, _ptr(pair), pair.strides[0] // 4, _ptr(audio),
            audio.strides[0] // 4, audio.strides[1] // 4, _ptr(out), _ptr(self._scratch), _ptr(self._bad),
        )  # fmt: skip
        return self.result(rc, s)

    def bind_buffers(self, slots: np.ndarray, pair: np.ndarray, audio: np.ndarray, out: np.ndarray) -> BoundDelayStep | None:
        """This step on buffers fixed for good (see ``DelayStates.bound_step``); None when
        their layout is not one it reads."""
        k, a = self._states.n_vq, self._states.n_audio
        r = slots.shape[0] if slots.ndim == 1 else -1
        if (
            slots.dtype != np.int64
            or not slots.flags.c_contiguous
            or pair.shape != (r, 2)
            or audio.shape != (r, k, a)
            or out.shape != (r, 1 + k)
            or out.dtype != np.int64
        ):
            return None
        return BoundDelayStep(self, slots, pair, audio, out) if _readable(pair, audio, out) else None

    def result(self, rc: int, s: np.ndarray) -> bool:
        """The step's return code for slots ``s``: True (taken), False (the Python step's),
        or the error it stands for."""
        if rc == _DONE:
            return True
        if rc == _NEEDS_TEXT:
            return False
        if rc == _BAD_SLOTS:
            raise ValueError(f"slots must be distinct and in [0, {self._states.capacity}), got {s.tolist()}")
        bad = np.flatnonzero(self._bad[: s.shape[0]])
        if rc == _BAD_TEXT:
            raise NonFiniteLogitsError(s[bad], "text of slots")
        if rc == _BAD_AUDIO:
            raise NonFiniteLogitsError(np.unique(s[bad]), "audio of slots")
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


class BoundDelayStep:
    """:class:`CompiledDelayStep` on the engine's buffers, addresses and strides worked out
    once: a step is one call. Why: after a decode every Python and NumPy call runs on cold
    caches, and the checks and address lookups of a general call cost about 0.1 ms a step
    there (measured in the engine)."""

    def __init__(self, step: CompiledDelayStep, slots: np.ndarray, pair: np.ndarray, audio: np.ndarray, out: np.ndarray) -> None:
        self._step = step
        self._keep = (slots, pair, audio, out)  # the buffers the addresses point into
        self._slots = slots
        self._rows = slots.shape[0]
        self._fn = step._fn
        self._ref = step._ref
        self._head = _ptr(slots)
        self._tail = (
            _ptr(pair), pair.strides[0] // 4, _ptr(audio), audio.strides[0] // 4, audio.strides[1] // 4,
            _ptr(out), _ptr(step._scratch), _ptr(step._bad),
        )  # fmt: skip

    def __call__(self, n: int) -> bool:
        """Step the first ``n`` slots of the slot buffer (distinct) on the first ``n`` rows."""
        if n > self._rows:
            raise ValueError(f"{n} streams do not fit the {self._rows} rows bound")
        rc = self._fn(self._ref, self._head, n, *self._tail)
        return rc == _DONE or self._step.result(rc, self._slots[:n])
