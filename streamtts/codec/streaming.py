"""Exact streaming codec decoding: ONNX Runtime on ``decoder_streaming.onnx`` with per-slot state.

A *slot* holds one stream's decoder state: per stage, a ring of the last ``context`` keys
and values of every layer, and the number of frames decoded so far. ``decode(slots,
codes)`` decodes the next frames of several streams in one call and returns exactly
those frames' samples; the result equals decoding each stream's whole code sequence
offline (the official semantics), up to float32 rounding, for any chunking. Unlike
windowed decoding, no frame is decoded twice and nothing is lost beyond a window.

State layout (allocated once, ``n_slots`` streams): per stage s a float32 table
``(n_slots, layers, 2, heads, capacity, head_dim)`` (``[:, :, 0]`` keys after RoPE, with
each head's dimensions de-interleaved; ``[:, :, 1]`` values), capacity = the stage's
attention context in tokens; the key of position q lives at entry ``q % capacity``.

The tables live where the graph runs (``device``): host memory on the CPU, device memory
on CUDA. Each call binds a table both as the input ``state_s`` and as the output
``state_out_s`` (ONNX Runtime I/O binding); the graph gathers the rows of the ``slots`` it
decodes and writes the new keys and values into them with ScatterND, in place. Nothing
but the codes (in) and the samples (out) crosses between host and device, and the CPU
runs this very code path with ``device="cpu"``.

A released slot is zeroed on the CPU (cheap insurance: empty entries enter the products
with weight 0, so a non-finite leftover would poison them). On CUDA the table is zeroed
once at load and a released slot keeps its finite keys, masked with weight exactly 0:
every value the graph writes is a key or value it computed from codes.

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
    f"(builder version {BUILDER_VERSION}: inputs codes, positions, slots, lengths, state_*)"
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
        device: str = "cpu",
        device_id: int = 0,
    ) -> None:
        if device not in ("cpu", "cuda"):
            raise ConfigError(f"device must be cpu or cuda, got {device!r}")
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
        providers: list[Any] = ["CPUExecutionProvider"]
        if device == "cuda":
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise CodecError(
                    "the streaming codec on the GPU needs ONNX Runtime's CUDA provider: "
                    "pip install onnxruntime-gpu (matching your CUDA), or run it on the CPU"
                )
            providers = [("CUDAExecutionProvider", {"device_id": device_id}), *providers]
        try:
            self._sess = ort.InferenceSession(
                str(self.path), sess_options=opts, providers=providers
            )
        except Exception as exc:
            raise ModelFileError(
                self.path, _EXPECTED, f"ONNX Runtime cannot load it: {exc}"
            ) from exc
        self.device, self.device_id = device, device_id
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
        # the most frames one call may write: no ring entry twice (longer calls are split)
        self.max_chunk = min(s.capacity // s.tokens_per_frame for s in self.stages)
        # allocated once, zeroed (np.zeros maps zero pages: a device table costs no host RAM)
        self._host: list[np.ndarray] = []  # the CPU tables (views of the bound buffers)
        self._tables: list[Any] = []  # the OrtValues bound as state_s and state_out_s
        for st in self.stages:
            zeros = np.zeros((n_slots, *st.shape), dtype=np.float32)
            if device == "cpu":
                self._host.append(zeros)  # OrtValue wraps it: the same memory
            self._tables.append(ort.OrtValue.ortvalue_from_numpy(zeros, device, device_id))
            del zeros
        self._pos = np.zeros(n_slots, dtype=np.int64)
        self._active = np.zeros(n_slots, dtype=bool)
        self._dirty = np.zeros(n_slots, dtype=bool)  # rings hold a finished stream's keys
        self._io = self._sess.io_binding()
        for i, table in enumerate(self._tables):  # bindings persist between calls
            self._io.bind_ortvalue_input(f"state_{i}", table)
            self._io.bind_ortvalue_output(f"state_out_{i}", table)
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
        n = len(self.stages)
        want = ["codes", "positions", "slots", "lengths"] + [f"state_{i}" for i in range(n)]
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
        if outs != ["audio"] + [f"state_out_{i}" for i in range(n)]:
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
        for table in self._host:  # on the device: see the module docstring
            table[s] = 0.0
        self._dirty[s] = False

    def ring(self, stage: int, slot: int) -> np.ndarray:
        """A copy of one slot's ring table of ``stage`` (host or device), for inspection."""
        table = self._host[stage] if self._host else self._tables[stage].numpy()
        return np.array(table[self._slot(slot)])

    def position(self, slot: int) -> int:
        """Frames decoded so far by the stream in ``slot``."""
        return int(self._pos[self._slot(slot)])

    @property
    def active_slots(self) -> list[int]:
        return [int(i) for i in np.flatnonzero(self._active)]

    def self_check(self, frames: int = 6, tolerance: float = 1e-2) -> float:
        """Decode ``frames`` pseudo-random frames in one call and again in chunks of 1, 2, 3
        (in a free slot, released after); they must agree. This checks what the tests can
        only check on the CPU: that this device and runtime update the state in place and
        only after the stage read it. Returns the largest difference relative to the
        signal's RMS; raises :class:`CodecError` above ``tolerance`` (loose: GPUs may round
        matrix products differently for different shapes)."""
        codes = np.random.default_rng(0).integers(0, 1024, size=(1, frames, 32), dtype=np.int64)
        slot = self.acquire()
        try:
            whole = self.decode([slot], codes)[0]
            self.reset(slot)
            parts, t, n = [], 0, 1
            while t < frames:
                parts.append(self.decode([slot], codes[:, t : t + n])[0])
                t, n = t + n, n + 1
            chunked = np.concatenate(parts)
        finally:
            self.release(slot)
        rms = float(np.sqrt(np.mean(whole.astype(np.float64) ** 2))) or 1.0
        err = float(np.abs(whole - chunked).max()) / rms
        if not err <= tolerance:  # NaN fails too
            raise CodecError(
                f"streaming codec self-check failed on {self.device}: chunked decoding differs "
                f"from one call by {err:.3g} x RMS (> {tolerance:g}); this runtime does not "
                "update the state in place as the graph needs"
            )
        log.info(
            "streaming codec self-check on %s: chunked = whole within %.2g x RMS", self.device, err
        )
        return err

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
        m = self.max_chunk
        parts = []
        for start in range(0, t, m):  # a ring entry is written at most once per call
            n = min(m, t - start)
            part_lens = np.clip(lens - start, 0, n)
            parts.append(self._decode_part(slot_arr, codes[:, start : start + n], part_lens))
        audio = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
        short = lens < t
        if short.any():  # padding frames of shorter rows: not audio
            keep = np.arange(t * fs)[None, :] < (lens * fs)[:, None]
            audio = np.where(keep, audio, np.float32(0.0))
        return audio

    def _decode_part(self, slots: np.ndarray, codes: np.ndarray, lens: np.ndarray) -> np.ndarray:
        """One graph call (T <= max_chunk); the rings are updated in place."""
        b, t, _ = codes.shape
        io = self._io
        # bound by address: the arrays must outlive the run (hence the names)
        x = np.ascontiguousarray(codes.transpose(2, 0, 1))  # (32, B, T)
        pos = self._pos[slots]
        io.bind_cpu_input("codes", x)
        io.bind_cpu_input("positions", pos)
        io.bind_cpu_input("slots", slots)
        io.bind_cpu_input("lengths", lens)
        audio = np.empty((b, t * self.frame_samples), dtype=np.float32)
        io.bind_output("audio", "cpu", 0, np.float32, audio.shape, audio.ctypes.data)
        try:
            self._sess.run_with_iobinding(io)
        except Exception as exc:
            raise CodecError(f"streaming codec decoder failed on {b} x {t} frames: {exc}") from exc
        self._pos[slots] += lens
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
