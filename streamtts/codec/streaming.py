"""Exact streaming codec decoding: ONNX Runtime on ``decoder_streaming.onnx`` with per-slot state.

A *slot* holds one stream's decoder state: per stage, a ring of the last ``context`` keys
and values of every layer, and the number of frames decoded so far. ``decode(slots,
codes)`` decodes the next frames of several streams in one call and returns exactly
those frames' samples; the result equals decoding each stream's whole code sequence
offline (the official semantics), up to float32 rounding, for any chunking. Unlike
windowed decoding, no frame is decoded twice and nothing is lost beyond a window.

State layout (allocated once, ``n_slots`` streams): per stage s a float32 array
``(n_slots, layers, 2, heads, capacity, head_dim)`` (``[:, :, 0]`` keys after RoPE, with
each head's dimensions de-interleaved; ``[:, :, 1]`` values), capacity = the stage's
attention context in tokens; the key of position q lives at entry ``q % capacity``. The
whole table is an input of every call (ONNX Runtime reads NumPy inputs in place); the
graph gathers the rows of the ``slots`` it decodes and returns only the new keys and
values, which :meth:`StreamingDecoder.decode` writes into the rings with one NumPy
scatter per stage.

Threads: as :mod:`streamtts.codec.onnx`, no spinning; ``threads`` intra-op threads.
Not thread-safe: one decode thread owns a decoder.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CodecError, ConfigError, ModelFileError
from .onnx import _import_ort, check_codes
from .stamp import (
    BUILDER_VERSION,
    KEY_BUILDER,
    KEY_KIND,
    KEY_LAYOUT,
    KEY_STAMP,
    KEY_WEIGHTS,
    weights_stamp,
)

__all__ = ["StageState", "StreamingDecoder"]

log = logging.getLogger(__name__)

_EXPECTED = (
    "a streaming codec decoder built by `streamtts codec build` "
    f"(builder version {BUILDER_VERSION}: inputs codes, positions, slots, state_*)"
)


def _rebuild_hint(weights: str | None) -> str:
    return f"rebuild it: streamtts codec build --weights {weights or 'WEIGHTS_DIR'}"


@dataclass(frozen=True)
class StageState:
    """The ring of one transformer stage (one slot's share: ``shape``)."""

    layers: int
    heads: int
    head_dim: int
    capacity: int
    context: int
    tokens_per_frame: int

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        return (self.layers, 2, self.heads, self.capacity, self.head_dim)

    @property
    def nbytes(self) -> int:
        return 4 * int(np.prod(self.shape))


class StreamingDecoder:
    """Stateful codec decoder over ``n_slots`` stream slots.

    ``weights`` (the checkpoint folder the model was built from) is optional; when given,
    a model built from other weights is refused with a message saying how to rebuild.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        n_slots: int = 8,
        weights: str | Path | None = None,
        threads: int = 0,
        check_recorded_weights: bool = False,
    ) -> None:
        if not str(path):
            raise ConfigError("no streaming decoder path: build one with `streamtts codec build`")
        if not isinstance(n_slots, int) or n_slots < 1:
            raise ConfigError(f"n_slots must be a positive integer, got {n_slots!r}")
        self.path = Path(path)
        if not self.path.is_file():
            problem = "file not found" if not self.path.exists() else "not a file"
            raise ModelFileError(self.path, _EXPECTED, f"{problem}; {_rebuild_hint(None)}")
        ort = _import_ort()
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        opts.inter_op_num_threads = 1
        if threads > 0:
            opts.intra_op_num_threads = threads
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            self._sess = ort.InferenceSession(
                str(self.path), sess_options=opts, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:
            raise ModelFileError(
                self.path, _EXPECTED, f"ONNX Runtime cannot load it: {exc}"
            ) from exc
        meta = dict(self._sess.get_modelmeta().custom_metadata_map)
        recorded = meta.get(KEY_WEIGHTS, "")
        if weights is None and check_recorded_weights and recorded and Path(recorded).is_dir():
            weights = recorded  # the checkpoint it was built from is still here: is it the same?
        self.weights_dir = str(weights) if weights is not None else recorded
        self.stages, self.frame_samples, self.sampling_rate = self._check_meta(meta, weights)
        self._check_ports()
        self.stamp = meta[KEY_STAMP]
        self.n_slots = n_slots
        self.max_batch = n_slots
        self.state_bytes_per_slot = sum(s.nbytes for s in self.stages)
        # allocated once; release() zeroes a slot: empty entries are masked, but they still
        # enter the products with weight 0, where a non-finite leftover would poison them
        self._state = [np.zeros((n_slots, *s.shape), dtype=np.float32) for s in self.stages]
        self._pos = np.zeros(n_slots, dtype=np.int64)
        self._active = np.zeros(n_slots, dtype=bool)
        self._dirty = np.zeros(n_slots, dtype=bool)  # rings hold a finished stream's keys
        self._in_names = [p.name for p in self._sess.get_inputs()]
        self.busy_s = 0.0
        log.info(
            "streaming codec decoder %s: %d slots x %.1f MB state (%s)",
            self.path.name,
            n_slots,
            self.state_bytes_per_slot / 1e6,
            ", ".join(f"ctx {s.context}" for s in self.stages),
        )

    # -- loading checks --------------------------------------------------------------------
    def _check_meta(
        self, meta: dict[str, str], weights: str | Path | None
    ) -> tuple[list[StageState], int, int]:
        w = str(weights) if weights is not None else None
        kind = meta.get(KEY_KIND)
        if kind is None:
            raise ModelFileError(
                self.path,
                _EXPECTED,
                "it has no streamtts build metadata (is it the official decoder.onnx?)",
            )
        if kind != "streaming":
            raise ModelFileError(
                self.path, _EXPECTED, f"it is the {kind} graph, not the streaming one"
            )
        built = meta.get(KEY_BUILDER, "?")
        if built != str(BUILDER_VERSION):
            raise ModelFileError(
                self.path,
                _EXPECTED,
                f"it was built by builder version {built}; this streamtts reads version "
                f"{BUILDER_VERSION}: {_rebuild_hint(w)}",
            )
        if weights is not None:
            now = weights_stamp(weights)
            if meta.get(KEY_STAMP) != now:
                raise ModelFileError(
                    self.path,
                    f"a streaming decoder built from the weights in {weights}",
                    f"it is stale: built from other weights (stamp {meta.get(KEY_STAMP, '?')[:12]}, "
                    f"the weights now {now[:12]}): {_rebuild_hint(w)}",
                )
        try:
            layout = json.loads(meta[KEY_LAYOUT])
            stages = [
                StageState(
                    layers=int(s["layers"]),
                    heads=int(s["heads"]),
                    head_dim=int(s["head_dim"]),
                    capacity=int(s["capacity"]),
                    context=int(s["context"]),
                    tokens_per_frame=int(s["tokens_per_frame"]),
                )  # fmt: skip
                for s in layout["stages"]
            ]
            frame_samples = int(layout["frame_samples"])
            sampling_rate = int(layout["sampling_rate"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelFileError(
                self.path, _EXPECTED, f"its layout metadata is unreadable: {exc}"
            ) from exc
        return stages, frame_samples, sampling_rate

    def _check_ports(self) -> None:
        ins = {p.name: p for p in self._sess.get_inputs()}
        want = ["codes", "positions", "slots"] + [f"state_{i}" for i in range(len(self.stages))]
        if sorted(ins) != sorted(want):
            raise ModelFileError(
                self.path, _EXPECTED, f"its inputs are {sorted(ins)}, expected {want}"
            )
        for i, st in enumerate(self.stages):
            dims = list(ins[f"state_{i}"].shape)[1:]
            if dims != list(st.shape):
                raise ModelFileError(
                    self.path,
                    _EXPECTED,
                    f"input state_{i} has shape {dims}, its metadata says {list(st.shape)}",
                )
        outs = [p.name for p in self._sess.get_outputs()]
        if outs != ["audio"] + [f"kv_{i}" for i in range(len(self.stages))]:
            raise ModelFileError(self.path, _EXPECTED, f"its outputs are {outs}")

    # -- slots -----------------------------------------------------------------------------
    def _slot(self, slot: int) -> int:
        if (
            isinstance(slot, bool)
            or not isinstance(slot, (int, np.integer))
            or not 0 <= slot < self.n_slots
        ):
            raise CodecError(f"slot {slot!r} is not one of 0..{self.n_slots - 1}")
        return int(slot)

    def acquire(self) -> int:
        """A free slot, reset for a new stream."""
        free = np.flatnonzero(~self._active)
        if free.size == 0:
            raise CodecError(f"all {self.n_slots} codec stream slots are in use")
        slot = int(free[0])
        self.reset(slot)
        return slot

    def reset(self, slot: int) -> None:
        """Start a new stream in ``slot`` (position 0, empty rings)."""
        s = self._slot(slot)
        if self._dirty[s]:
            self._zero(s)
        self._pos[s] = 0
        self._active[s] = True
        self._dirty[s] = True

    def release(self, slot: int) -> None:
        """The stream in ``slot`` is over; the slot can be acquired again.

        The rings are zeroed here (a published-size slot is 170 MB), so the next stream's
        first decode, which its time to first audio waits for, does not pay for it."""
        s = self._slot(slot)
        self._active[s] = False
        self._pos[s] = 0
        if self._dirty[s]:
            self._zero(s)

    def _zero(self, s: int) -> None:
        for state in self._state:
            state[s] = 0.0
        self._dirty[s] = False

    def position(self, slot: int) -> int:
        """Frames decoded so far by the stream in ``slot``."""
        return int(self._pos[self._slot(slot)])

    @property
    def active_slots(self) -> list[int]:
        return [int(i) for i in np.flatnonzero(self._active)]

    # -- decoding --------------------------------------------------------------------------
    def decode(
        self,
        slots: Sequence[int] | np.ndarray,
        codes: np.ndarray,
        lengths: Sequence[int] | np.ndarray | None = None,
    ) -> np.ndarray:
        """Decode the next frames of the streams in ``slots``.

        ``codes`` (B, T, 32) integers in [0, 1024): row b continues the stream of
        ``slots[b]``. ``lengths`` (B,), each 0..T, lets rows carry fewer frames (the rest of
        the row is padding and is ignored); default T for every row. Returns (B, T*1920)
        float32: row b's first ``lengths[b]*1920`` samples are its new audio, the rest zeros.
        """
        codes = check_codes(codes)
        b, t, _ = codes.shape
        slot_arr = self._check_slots(slots, b)
        lens = self._check_lengths(lengths, b, t)
        fs = self.frame_samples
        if b == 0 or t == 0:
            return np.zeros((b, t * fs), dtype=np.float32)
        pos = self._pos[slot_arr]
        feeds: dict[str, Any] = {
            "codes": np.ascontiguousarray(codes.transpose(2, 0, 1)),  # (32, B, T)
            "positions": pos,
            "slots": slot_arr,
        }
        for i, state in enumerate(self._state):
            feeds[f"state_{i}"] = state
        try:
            outs = self._sess.run(None, feeds)
        except Exception as exc:
            raise CodecError(f"streaming codec decoder failed on {b} x {t} frames: {exc}") from exc
        audio: np.ndarray = outs[0]
        for stage, state, kv in zip(self.stages, self._state, outs[1:], strict=True):
            self._write_ring(stage, state, kv, slot_arr, pos, lens)
        self._pos[slot_arr] += lens
        short = lens < t
        if short.any():  # padding frames of shorter rows: not audio
            keep = np.arange(t * fs)[None, :] < (lens * fs)[:, None]
            audio = np.where(keep, audio, np.float32(0.0))
        return audio

    def _check_slots(self, slots: Sequence[int] | np.ndarray, b: int) -> np.ndarray:
        arr = np.asarray(slots)
        if arr.ndim != 1 or arr.shape[0] != b or (b and not np.issubdtype(arr.dtype, np.integer)):
            raise CodecError(f"slots must be {b} integers (one per row of codes), got {slots!r}")
        arr = arr.astype(np.int64)
        if b == 0:
            return arr
        if arr.min() < 0 or arr.max() >= self.n_slots:
            raise CodecError(f"slots {arr.tolist()} are not all in 0..{self.n_slots - 1}")
        if np.unique(arr).size != b:
            raise CodecError(f"slots {arr.tolist()} repeat a slot: one row per stream per call")
        idle = arr[~self._active[arr]]
        if idle.size:
            raise CodecError(
                f"slot {int(idle[0])} has no stream: call acquire() or reset({int(idle[0])}) first"
            )
        return arr

    @staticmethod
    def _check_lengths(lengths: Sequence[int] | np.ndarray | None, b: int, t: int) -> np.ndarray:
        if lengths is None:
            return np.full(b, t, dtype=np.int64)
        arr = np.asarray(lengths)
        if arr.shape != (b,) or (b and not np.issubdtype(arr.dtype, np.integer)):
            raise CodecError(
                f"lengths must be {b} integers (one per row of codes), got {lengths!r}"
            )
        arr = arr.astype(np.int64)
        if b and (arr.min() < 0 or arr.max() > t):
            raise CodecError(f"lengths {arr.tolist()} are not all in 0..{t} (frames per row)")
        return arr

    @staticmethod
    def _write_ring(
        stage: StageState,
        state: np.ndarray,
        kv: np.ndarray,
        slots: np.ndarray,
        pos: np.ndarray,
        lens: np.ndarray,
    ) -> None:
        """Store the chunk's new keys/values (B, L, 2, H, n, hd) at entry position % cap.

        Only each row's real tokens, and of those only the last ``capacity`` (earlier ones
        would be overwritten in the same ring entries anyway).
        """
        k, cap = stage.tokens_per_frame, stage.capacity
        n = kv.shape[4]
        valid = lens * k
        tok = np.arange(n)
        keep = (tok[None, :] < valid[:, None]) & (tok[None, :] >= valid[:, None] - cap)
        rows, toks = np.nonzero(keep)
        entry = (pos[rows] * k + toks) % cap
        state[slots[rows], :, :, :, entry, :] = kv[rows, :, :, :, toks, :]
